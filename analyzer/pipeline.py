"""Source -> profiles -> recommendations -> plan -> configuration: the whole analysis in one call.

The CLI subcommands and the report all run this, so they agree on every number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpulens.analyzer import frames, hysteresis, serving, timesplit
from gpulens.analyzer import requests as request_trace
from gpulens.analyzer.archetypes import Archetypes, cluster
from gpulens.analyzer.changes import annotate, ranked_actions
from gpulens.analyzer.emit import Emitted, FleetContext, context_from_fleet, context_from_rows, emit
from gpulens.analyzer.history import History
from gpulens.analyzer.plan import Plan
from gpulens.analyzer.planasrun import SIZED_COLUMN, plan_as_run
from gpulens.analyzer.profile import FleetGpu, fleet_catalog_models
from gpulens.analyzer.recommend import recommend
from gpulens.analyzer.sources import files
from gpulens.analyzer.thresholds import Thresholds
from gpulens.analyzer.topology import Topology
from gpulens.analyzer.workload import WORKLOAD_COLUMNS, workload_of
from gpulens.catalog import GpuModel

# the JSON `jobs` fields every consumer may rely on (docs/analyzer.md)
JOB_FIELDS = (
    "job_id",
    "gpu_model",
    "gpus",
    "duration_s",
    "samples",
    "sm_active_p95",
    "memory_peak_bytes",
    "recommendation",
    "mig_profile",
    "mps_active_thread_percentage",
    "mps_pinned_memory_limit_bytes",
    "reason",
    "confidence",
)


# the job columns emit's context reads (`emit.context_from_rows`, `hosts.inventory_from_rows`)
EMIT_COLUMNS = (
    "job_id",
    "uuids",
    "instance",
    "gpu_model",
    "job_source",
    "start",
    "end",
    "sharing",
    "mig_profile_now",
    "job_namespace",
    "job_pod",
)

# what a job's workload (analyzer/workload.py) is read from

INTEGER_FIELDS = (
    "gpus",
    "samples",
    "mps_active_thread_percentage",
    "mps_pinned_memory_limit_bytes",
    SIZED_COLUMN,
)


@dataclass
class Analysis:
    """Everything one run produced."""

    kind: str  # usage | requests
    source: str
    recs: pd.DataFrame  # profiles + recommendation columns
    plan: Plan
    archetypes: Archetypes | None = None
    emitted: Emitted | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def job_records(self) -> list[dict[str, Any]]:
        """JSON-safe rows (NaN -> None), required fields first."""
        frame = self.recs
        if self.archetypes is not None and len(self.archetypes.labels):
            frame = frame.assign(archetype=frame["job_id"].map(self.archetypes.labels))
        columns = [c for c in JOB_FIELDS if c in frame] + [c for c in frame if c not in JOB_FIELDS]
        # column by column, then one dict per row: a float column becomes JSON values in numpy
        # (10,000 jobs x 80 columns: 1.2 s of per-value jsonable -> 0.2 s)
        values = [_json_column(frame[c], c in INTEGER_FIELDS) for c in columns]
        return [dict(zip(columns, row, strict=True)) for row in zip(*values, strict=True)]

    def headline(self) -> dict[str, float]:
        r = self.recs
        if self.kind == "requests":
            return {
                "jobs": len(r),
                "gpus_requested": float(r["requested_gpus"].sum()),
                "gpus_before": self.plan.gpus_before,
                "gpus_after": self.plan.gpus_after,
                "gpus_freed": self.plan.gpus_freed,
            }
        allocated = float(r["gpu_hours_allocated"].sum())
        used = float(r["gpu_hours_used"].fillna(0).sum())
        return {
            "jobs": len(r),
            "gpu_hours_allocated": round(allocated, 2),
            "gpu_hours_used": round(used, 2),
            "gpu_hours_idle": round(max(0.0, allocated - used), 2),
            "gpus_before": self.plan.gpus_before,
            "gpus_after": self.plan.gpus_after,
            "gpus_freed": self.plan.gpus_freed,
            "utilization_before": self.plan.utilization_before,
            "utilization_after": self.plan.utilization_after,
        }

    def top_actions(self, n: int = 5) -> list[dict[str, Any]]:
        """The ranked action list (`changes.ranked_actions`): GPU-hours recovered, largest first."""
        if self.kind == "requests" or "action" not in self.recs:
            return []
        return ranked_actions(self.recs, n)


def _json_column(column: pd.Series, integer: bool) -> list[Any]:
    """A column's values as `jsonable` makes them (an integer field's floats as ints)."""
    if column.dtype == np.float64:
        array = column.to_numpy()
        out: list[Any] = array.tolist()
        for n in np.flatnonzero(~np.isfinite(array)).tolist():
            out[n] = None
    elif column.dtype in (np.int64, np.bool_):
        out = column.to_numpy().tolist()
    elif isinstance(column.dtype, pd.StringDtype) or column.dtype == np.dtype(object):
        # listed in C (iterating Arrow text is slow); a str, the most values, is kept without a call
        out = [v if type(v) in UNCHANGED else jsonable(v) for v in column.tolist()]
    else:
        out = [v if type(v) in UNCHANGED else jsonable(v) for v in column]
    if integer:
        out = [int(v) if isinstance(v, float) else v for v in out]
    return out


# the exact types `jsonable` returns as they are (subclasses such as numpy's float64 are not):
# most values of an object column, tested before the general conversion (10,000 jobs: ~600,000
# calls of it)
UNCHANGED = frozenset({str, int, bool, type(None)})


def jsonable(value: Any) -> Any:
    """NaN/inf -> None, numpy scalars -> Python."""
    if type(value) in UNCHANGED:
        return value
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):  # a job's `numbers`: mostly finite floats, kept without a call
        return {
            k: v if type(v) in UNCHANGED or (type(v) is float and math.isfinite(v)) else jsonable(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def analyze_profiles(
    profiles: pd.DataFrame,
    th: Thresholds,
    source: str,
    meta: dict[str, Any] | None = None,
    with_archetypes: bool = True,
    gpus: list[dict[str, Any]] | None = None,
    fleet: list[FleetGpu] | None = None,
    topology: Topology | None = None,
    serving_table: serving.Table | None = None,
    told: Sequence[hysteresis.Told] = (),
    served: frozenset[str] = frozenset(),
    whole: timesplit.WholeFigures | None = None,
) -> Analysis:
    """Recommendations, plan, configuration and archetypes for a profile table.

    `fleet`: the inventory (`gpu_info` over the window) the plan counts and places jobs on;
    without it, the GPUs the jobs used. `gpus`: the same as `gpu_info` rows (with the GPU index)
    for emit. `topology`: the GPU topology (`gpu_topology_info`); without it, no topology
    finding and no topology preference in the plan. `serving_table`: inference servers' own
    metrics per pod (`serving.py`), joined to the jobs by namespace and pod. `told`: what last
    week's report gave each MPS client (`--previous`): settings within the dead band are kept
    (`hysteresis.py`; the thread cap measured, the profile's `mps_thread_cap_now_pct`, before the
    one told) before the plan packs. `served`: job ids and workloads last week's report found
    serving (`recommend.servers_of`): on a GPU they share, still servers (`recommend.py`, rule 2).
    `whole`: last week's jobs measured whole (`timesplit.whole_of`): a job time-sliced now is
    sized from no less (`timesplit.py`).
    """
    models = None if fleet is None else fleet_catalog_models(fleet)
    profiles = serving.join(profiles, serving_table)
    if served:
        rows = frames.records(profiles[[c for c in WORKLOAD_COLUMNS if c in profiles]])
        profiles = profiles.assign(
            served_last_week=[str(r["job_id"]) in served or workload_of(r) in served for r in rows]
        )
    profiles = timesplit.apply(profiles, whole)
    recs = timesplit.explain(hysteresis.apply(recommend(profiles, th, models), told, th))
    context = _emit_context(recs, gpus, fleet)
    # the plan as the tools will run it (planasrun.py), before anything shows or writes it
    run = plan_as_run(recs, th, context, fleet, topology)
    plan = run.plan
    recs = annotate(recs, plan, th, topology)
    recs["workload"] = [
        workload_of(r) for r in frames.records(recs[[c for c in WORKLOAD_COLUMNS if c in recs]])
    ]
    return Analysis(
        kind="usage",
        source=source,
        recs=recs,
        plan=plan,
        archetypes=cluster(profiles, th) if with_archetypes else None,
        emitted=emit(plan, context, run.adjustments),
        meta=meta or {},
    )


def _emit_context(
    recs: pd.DataFrame, gpus: list[dict[str, Any]] | None, fleet: list[FleetGpu] | None
) -> FleetContext:
    """The inventory emit places the plan on: `gpu_info` rows when given, else the fleet's GPUs."""
    rows = frames.records(recs[[c for c in EMIT_COLUMNS if c in recs]])
    if gpus is None and fleet:
        return context_from_fleet(fleet, rows)
    return context_from_rows(rows, gpus or [])


def analyze_history(
    history: History,
    th: Thresholds,
    gpu_model: GpuModel | None = None,
    with_archetypes: bool = True,
    told: Sequence[hysteresis.Told] = (),
    served: frozenset[str] = frozenset(),
    whole: timesplit.WholeFigures | None = None,
) -> Analysis:
    """A history directory, usage or requests (`told`, `served`, `whole`: see `analyze_profiles`)."""
    if history.kind == "requests":
        table = request_trace.request_table(history)
        recs = request_trace.recommend_requests(table)
        plan = request_trace.plan_requests(recs, cluster=request_trace.cluster_gpus(history))
        return Analysis("requests", str(history.path), recs, plan, meta=history.meta)
    profiles = files.profiles(history, th, gpu_model)
    return analyze_profiles(
        profiles,
        th,
        str(history.path),
        history.meta,
        with_archetypes,
        gpus=gpu_info_rows(history),
        fleet=files.fleet(history, gpu_model) or None,
        topology=files.topology(history),
        serving_table=serving.from_families(history.families or {}),
        told=told,
        served=served,
        whole=whole,
    )


def gpu_info_rows(history: History) -> list[dict[str, Any]]:
    """One row per GPU of the history's `gpu_info` (uuid, model, instance, gpu index): the
    inventory emit places the plan on, idle GPUs included."""
    if history.families is not None:
        frame = history.families.get("gpu_info")
    else:
        frame = history.samples[history.samples["metric"] == "gpu_info"]
    if frame is None or frame.empty:
        return []
    columns = [c for c in ("uuid", "model", "instance", "gpu") if c in frame]
    # one row per GPU first, then strings: converting every step's row (2.5 M at 10,000 jobs) cost
    # ~2 s and set the file path's peak memory; str() is one-to-one on the uuids, so the kept rows
    # are the same
    last = frame[columns].drop_duplicates("uuid", keep="last")
    rows: list[dict[str, Any]] = last.astype(str).to_dict("records")
    return rows
