"""`gpulens sim apply-plan --history`: a history rewritten into the fleet running a report's plan.

`gpulens sim apply-plan SCENARIO` rewrites a scenario; a history imported from a trace has no
scenario behind it, so this rewrites the history itself: the same jobs, step by step, as the
exporter would have published them had they run where the report's plan (`plan.json`, `jobs.json`)
places them. Used to check that a fleet already in its proposed state gets no further change.

A usage history (`kind: usage`):
- each job the plan places on a GPU whose jobs, mode, slices or MPS settings change is moved there:
  its `gpu_job_info` and `gpu_job_memory_used_bytes` under the planned GPU's uuid, node and index,
  the `sharing` label the exporter derives per step (`mig`; `mps`; `time_slicing` while more than
  one job runs on a plain GPU, else `exclusive`), `gpu_instance` on a MIG slice;
- a job moved to another GPU model does the same work there, the same SM cycles: its SM activity
  and its duty cycle (the same kernels take longer on a slower GPU) are rescaled by the compute of
  where it ran over the compute of where it goes, SMs x max SM clock (`sim/applyplan.py`,
  `_compute`; an A100 job on an L4 reads 108 x 1410 / (58 x 2040) = 1.29 x its share), capped at
  1; a job whose model (either one) the catalog does not know keeps its figures, and is listed in
  `meta.json` (`applied_plan.not_rescaled`);
- the device families of every such GPU are recomputed from the jobs now on it, as the simulator's
  engine sums them (sim/engine.py, `_Acc.finish`): SM activity adds up and is capped at 1; NVML
  utilization (a duty cycle) adds up on a time-sliced GPU and is the chance that any client runs
  under MPS (clients run concurrently). An MPS client's kernels are at most its thread cap wide:
  its busy time stretches to activity / cap and its SM activity is at most busy x cap
  (sim/patterns.py, `_capped`); a history with no SM activity (a duty-cycle trace) is sized on the
  duty cycle, so the cap limits that. Per job, its share of the device figure and the
  unattributed remainder as the exporter publishes them (docs/attribution.md, "Usage values"),
  MPS clients with caps weighed by time x cap where the figure is SM activity. A MIG slice gets
  its `gpu_mig_instance_info` and the job's activity on the slice's scale (capped at 1);
- on a node the report's device-plugin files relabel (`nodesharing.py`), MPS as the plugin runs
  it: every client capped at the control daemon's 100 / replicas of the threads and its pinned
  memory limit, the GPU's total (`gpu_memory_total_bytes`, else the catalog's) / replicas in whole
  MiB, not the plan's percentage and limit, or, where the selected config time-slices the node,
  its GPUs time-sliced (elsewhere, on Slurm or a bare MPS node, the plan's settings hold);
- a freed GPU keeps its `gpu_info` (and other identity rows) only; a reclaimed job stops;
- jobs on GPUs the plan leaves as they are, and their GPUs, are copied unchanged.

No job's demand changes by the move except as the physical GPU forces it: a sum over 1 is capped
(and every job's share scaled down with it), a value over an MPS cap, a pinned memory limit or a
slice is clipped, a share rescaled to another model over 1 is held to 1. The steps where that
happened are counted in `meta.json` (`applied_plan.capped_steps`).

A requests history (`kind: requests`, the v2023 trace: requests only, no usage) has no GPUs to
move jobs between: its proposed state is the requests packed as planned. Each pod the plan packs
onto a shared GPU gets that GPU's name as `uuid` and `sharing="mps"` on its request samples, which
`analyzer/requests.py` reads as where the pod runs now.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import LABELS, History, HistoryWriter, read_history
from gpulens.analyzer.pluginsharing import PluginSharing
from gpulens.catalog import CatalogError, GpuModel, MigProfile, model_for_nvml_name
from gpulens.sim.defaults import default_gpu_instance_id
from gpulens.sim.nodesharing import NodeSharingError, SelectedConfig, read_node_sharing
from gpulens.sim.reportplan import ApplyPlanError, load_report_json, report_field
from gpulens.sim.scenario import PINNED_MEM_LIMIT, THREAD_PERCENTAGE


class Mode(StrEnum):
    """How the plan runs a GPU."""

    WHOLE = "whole"  # exclusive, or time-sliced when several jobs run at once
    MPS = "mps"
    MIG = "mig"


_MODES = {
    "exclusive": Mode.WHOLE,
    "time-slicing": Mode.WHOLE,
    "downsize-model": Mode.WHOLE,
    "mps": Mode.MPS,
    "mig": Mode.MIG,
}
# identity rows a GPU keeps whatever runs on it (a freed GPU keeps only these)
_IDENTITY_FAMILIES = frozenset({"gpu_info", "gpu_memory_total_bytes", "gpu_topology_info"})
_JOB_LABELS = ("job_source", "job_user", "job_name", "job_namespace", "job_pod", "job_container")
_TIME_SLICING, _EXCLUSIVE = "time_slicing", "exclusive"


@dataclass(frozen=True)
class Target:
    """Where the plan runs one job: a GPU, its mode, and its slice or MPS settings."""

    uuid: str
    node: str
    mode: Mode
    mig_profile: str = ""
    mig_start: int = 0
    sm_cap: float | None = None  # MPS thread percentage / 100
    memory_limit: float | None = None  # MPS pinned device memory limit, bytes


@dataclass(frozen=True)
class HistoryPlan:
    """What a report's plan does to a usage history."""

    targets: Mapping[str, Target]  # job id -> where it runs, for every job on a rebuilt GPU
    rebuilt: frozenset[str]  # GPUs whose jobs or mode change: recomputed from their jobs
    freed: frozenset[str]  # GPUs the plan empties
    reclaimed: frozenset[str]  # jobs that stop


@dataclass
class Counts:
    """What the rewrite did, for meta.json and the command's summary line."""

    moved_jobs: int = 0
    rebuilt_gpus: int = 0
    freed_gpus: int = 0
    reclaimed_jobs: int = 0
    # steps where a sum over 1, a cap, a pinned limit, a slice or a rescale to a model limited a job
    capped_steps: int = 0
    # jobs moved to another model whose activity kept its old scale: a model the catalog lacks
    not_rescaled: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# reading the report


def _number(where: str, value: Any, low: float, high: float, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
        raise ApplyPlanError(f"{where}: expected {what}, found {value!r}")
    return float(value)


def read_usage_plan(
    report: Path, now: Mapping[str, frozenset[str]], totals: Mapping[str, int] | None = None
) -> HistoryPlan:
    """The plan of `report` for a usage history whose GPUs hold the jobs `now` (uuid -> jobs).

    A GPU in the layout is rebuilt unless it holds exactly the jobs it holds now and jobs.json
    changes none of them (mode, slice, MPS settings); the jobs a rebuilt GPU holds all move there.
    `totals` (uuid -> device memory, bytes) sizes a device-plugin MPS daemon's pinned limit; a GPU
    not in it keeps the plan's limit (nothing better is known).
    """
    plan_path, jobs_path = report / "plan.json", report / "jobs.json"
    plan, jobs_doc = load_report_json(plan_path), load_report_json(jobs_path)
    layout = report_field(str(plan_path), plan, "layout", list, "a list of GPUs")
    freed_list = report_field(str(plan_path), plan, "freed", list, "a list of freed GPUs")
    rows = report_field(str(jobs_path), jobs_doc, "jobs", list, "a list of jobs")
    actions: dict[str, str] = {}
    for i, row in enumerate(rows):
        job = report_field(f"{jobs_path}: jobs[{i}]", row, "job_id", str, "a job id")
        actions[job] = str(row.get("action") or "")
    targets: dict[str, Target] = {}
    rebuilt: set[str] = set()
    plugin: dict[str, SelectedConfig | None] = {}
    for i, entry in enumerate(layout):
        where = f"{plan_path}: layout[{i}]"
        sharing = report_field(where, entry, "sharing", str, "a sharing mode")
        if sharing == "unchanged":
            continue
        if sharing not in _MODES:
            raise ApplyPlanError(
                f"{where}.sharing: expected one of unchanged, {', '.join(_MODES)}, found {sharing!r}"
            )
        uuid = report_field(where, entry, "uuid", str, "a GPU uuid of the history")
        if uuid not in now:
            raise ApplyPlanError(f"{where}.uuid: expected a GPU of the history, found {uuid!r}")
        node = report_field(where, entry, "node", str, "a node name")
        jobs = report_field(where, entry, "jobs", list, "a list of job ids")
        if not all(isinstance(j, str) for j in jobs):
            raise ApplyPlanError(f"{where}.jobs: expected job ids, found {jobs!r}")
        if frozenset(jobs) == now[uuid] and all(actions.get(j) != "change" for j in jobs):
            continue  # what it runs now: copied as it is
        if uuid in rebuilt:
            raise ApplyPlanError(f"{where}.uuid: expected each GPU once in the layout, found {uuid} again")
        rebuilt.add(uuid)
        mode = _MODES[sharing]
        slices: dict[str, tuple[str, int]] = {}
        for k, s in enumerate(entry.get("mig_layout") or [] if mode is Mode.MIG else []):
            w = f"{where}.mig_layout[{k}]"
            slices[report_field(w, s, "job_id", str, "a job id")] = (
                report_field(w, s, "profile", str, "a MIG profile"),
                report_field(w, s, "start", int, "a start slice"),
            )
        caps: dict[str, tuple[float | None, float | None]] = {}
        for k, client in enumerate(entry.get("mps_clients") or [] if mode is Mode.MPS else []):
            w = f"{where}.mps_clients[{k}]"
            job = report_field(w, client, "job_id", str, "a job id")
            pct = _number(f"{w}.{THREAD_PERCENTAGE}", client.get(THREAD_PERCENTAGE), 0, 100, "a percentage")
            limit = _number(f"{w}.{PINNED_MEM_LIMIT}", client.get(PINNED_MEM_LIMIT), 0, math.inf, "bytes")
            caps[job] = (None if pct is None else pct / 100, limit)
        if node not in plugin:
            try:
                plugin[node] = read_node_sharing(report / "config", node)
            except NodeSharingError as e:
                raise ApplyPlanError(str(e)) from None
        selected = plugin[node]
        if selected is not None and mode is Mode.MPS:
            # a device-plugin node (nodesharing.py): its config time-slices it, or its MPS daemon
            # gives every client 100 / replicas of the threads and total / replicas of the memory
            # (whole MiB), not the plan's percentage and limit; a client cannot raise either
            if selected.sharing is PluginSharing.MPS:
                share = selected.thread_percentage / 100
                total = (totals or {}).get(uuid)
                pinned = None if total is None else float(selected.pinned_limit(total))
                caps = {
                    job: (share, caps.get(job, (None, None))[1] if pinned is None else pinned) for job in jobs
                }
            else:
                mode, caps = Mode.WHOLE, {}
        for job in jobs:
            if job in targets:
                raise ApplyPlanError(f"{where}.jobs: expected each job on one GPU, found {job!r} again")
            if mode is Mode.MIG and job not in slices:
                raise ApplyPlanError(f"{where}.mig_layout: expected a slice for job {job!r}, found none")
            profile, start = slices.get(job, ("", 0))
            cap, limit = caps.get(job, (None, None))
            targets[job] = Target(uuid, node, mode, profile, start, cap, limit)
    freed: set[str] = set()
    for i, entry in enumerate(freed_list):
        uuid = report_field(f"{plan_path}: freed[{i}]", entry, "uuid", str, "a GPU uuid")
        if uuid in rebuilt:
            raise ApplyPlanError(f"{plan_path}: freed[{i}].uuid: expected a GPU the layout does not use")
        freed.add(uuid)
    reclaimed = frozenset(j for j, a in actions.items() if a == "reclaim" and j not in targets)
    return HistoryPlan(targets, frozenset(rebuilt), frozenset(freed), reclaimed)


# ---------------------------------------------------------------------------------------------
# one job's demand, on the whole GPU's scale


@dataclass(frozen=True)
class JobSteps:
    """A job's per-step demand as it ran (NaN where its GPU did not publish the figure)."""

    identity: dict[str, str]  # the identity labels of its gpu_job_info
    uuid: str  # the GPU it ran on
    times: np.ndarray
    duty: np.ndarray  # NVML utilization: fraction of time a kernel ran
    sm: np.ndarray  # SM activity
    memory: np.ndarray


def _series(fams: Mapping[str, pd.DataFrame], family: str, keys: dict[str, str]) -> pd.Series:
    """timestamp -> value of one family's rows matching `keys` (the last value of a step)."""
    frame = fams.get(family)
    if frame is None or frame.empty:
        return pd.Series(dtype=float)
    mask = np.ones(len(frame), dtype=bool)
    for label, value in keys.items():
        mask &= (frame[label] == value).to_numpy()
    rows = frame[mask]
    return rows.groupby("timestamp")["value"].last()


def _job_steps(
    fams: Mapping[str, pd.DataFrame], info: pd.DataFrame, job: str, models: Mapping[str, GpuModel]
) -> JobSteps:
    """What `job` asked of the GPU at each of its steps, from where it ran (whole, slice, shared)."""
    rows = info[info["job_id"] == job]
    if rows["uuid"].nunique() != 1:
        raise ApplyPlanError(
            f"job {job!r}: expected a job on one GPU to move, found it on {rows['uuid'].nunique()} GPUs"
        )
    first = rows.iloc[0]
    uuid, gi, sharing = str(first["uuid"]), str(first["gpu_instance"]), str(first["sharing"])
    times = np.sort(rows["timestamp"].unique())
    index = pd.Index(times)
    memory = _series(fams, "gpu_job_memory_used_bytes", {"job_id": job, "uuid": uuid})
    if gi:  # a MIG slice: its activity on the slice's scale, times the slice's part of the SMs
        model = models.get(uuid)
        profile = _profile_of(fams, uuid, gi, model)
        fraction = profile.sm_count / model.sm_count if model is not None and profile is not None else 1.0
        sm = _series(fams, "gpu_mig_sm_active_ratio", {"uuid": uuid, "gpu_instance": gi}) * fraction
        duty = pd.Series(dtype=float)
    elif sharing in ("mps", "time_slicing", "time-slicing"):
        sm, duty = _shared_steps(fams, job, uuid)
    else:
        sm = _series(fams, "gpu_sm_active_ratio", {"uuid": uuid})
        duty = _series(fams, "gpu_utilization_ratio", {"uuid": uuid})
    identity = {label: str(first[label]) for label in _JOB_LABELS}
    return JobSteps(
        identity,
        uuid,
        times.astype(float),
        duty.reindex(index).to_numpy(dtype=float),
        sm.reindex(index).to_numpy(dtype=float),
        memory.reindex(index).to_numpy(dtype=float),
    )


def _shared_steps(fams: Mapping[str, pd.DataFrame], job: str, uuid: str) -> tuple[pd.Series, pd.Series]:
    """A shared job's share of its GPU's figure plus its part of the remainder (as the analyzer
    reads it), as SM activity where the GPU publishes it that step, else as its duty cycle."""
    share = _series(fams, "gpu_job_sm_utilization_ratio", {"job_id": job, "uuid": uuid})
    frame = fams.get("gpu_job_sm_utilization_ratio")
    total = (
        frame[frame["uuid"] == uuid].groupby("timestamp")["value"].sum()
        if frame is not None
        else pd.Series(dtype=float)
    )
    rest = _series(fams, "gpu_job_sm_unattributed_ratio", {"uuid": uuid}).reindex(share.index).fillna(0.0)
    total = total.reindex(share.index)
    value = (share * (total + rest) / total).where(total > 0, 0.0)
    profiled = _series(fams, "gpu_sm_active_ratio", {"uuid": uuid}).reindex(share.index).notna()
    return value.where(profiled), value.where(~profiled)


def _profile_of(
    fams: Mapping[str, pd.DataFrame], uuid: str, gi: str, model: GpuModel | None
) -> MigProfile | None:
    frame = fams.get("gpu_mig_instance_info")
    if model is None or frame is None:
        return None
    names = frame[(frame["uuid"] == uuid) & (frame["gpu_instance"] == gi)]["mig_profile"]
    try:
        return model.mig_profile(str(names.iloc[-1])) if len(names) else None
    except CatalogError:
        return None


def _compute(model: GpuModel) -> float:
    """What a whole GPU of `model` does per second: SMs x max SM clock (`sim/applyplan.py`,
    `_compute`). A job's figures here are on the whole GPU's scale; a slice's part of it is its
    share of the SMs, which `_job_steps` and `_rebuild_mig` apply on each side."""
    return float(model.sm_count * model.max_sm_clock_mhz)


def _rescaled(steps: JobSteps, ratio: float, counts: Counts) -> JobSteps:
    """`steps` on a GPU doing 1 / `ratio` of the compute where it ran: the same SM cycles are
    `ratio` x its share of the SMs, and the same kernels run `ratio` x as long (its duty cycle);
    each held to 1, and the steps where that cut it counted."""
    sm, duty = steps.sm * ratio, steps.duty * ratio
    counts.capped_steps += int(np.sum((sm > 1) | (duty > 1)))  # NaN (not published) compares False
    return dataclasses.replace(steps, sm=np.minimum(sm, 1.0), duty=np.minimum(duty, 1.0))


def _on_new_models(
    moved: dict[str, JobSteps],
    targets: Mapping[str, Target],
    names: Mapping[str, str],
    models: Mapping[str, GpuModel],
    counts: Counts,
) -> None:
    """Put each job of `moved` that changes GPU model on its new model's scale (module docstring);
    `names`: uuid -> the model name its `gpu_info` gives. A job on the same model is left as it is
    (the ratio is 1) whether the catalog knows the model or not."""
    for job, steps in moved.items():
        there, name = targets[job].uuid, names.get(steps.uuid, "")
        if there == steps.uuid or (name and name == names.get(there)):
            continue
        was, now = models.get(steps.uuid), models.get(there)
        if was is None or now is None:
            counts.not_rescaled.append(job)
            continue
        if was != now:
            moved[job] = _rescaled(steps, _compute(was) / _compute(now), counts)


def _memory_totals(
    fams: Mapping[str, pd.DataFrame], uuids: list[str], models: Mapping[str, GpuModel]
) -> dict[str, int]:
    """uuid -> device memory as NVML gives it (the last `gpu_memory_total_bytes`), else the
    catalog's figure for its model; a GPU with neither is left out."""
    out = {u: models[u].memory_bytes for u in uuids if u in models}
    frame = fams.get("gpu_memory_total_bytes")
    if frame is not None and not frame.empty:
        last = frame.sort_values("timestamp", kind="stable").drop_duplicates("uuid", keep="last")
        out.update({str(u): int(v) for u, v in zip(last["uuid"], last["value"], strict=True) if v > 0})
    return out


# ---------------------------------------------------------------------------------------------
# one rebuilt GPU


def _rows(times: np.ndarray, values: np.ndarray, metric: str, labels: Mapping[str, str]) -> pd.DataFrame:
    keep = ~np.isnan(values)
    frame = pd.DataFrame({"timestamp": times[keep], "metric": metric, "value": values[keep]})
    for label, value in labels.items():
        frame[label] = value
    return frame


def _rebuild_gpu(
    uuid: str,
    gpu_labels: Mapping[str, str],
    jobs: Mapping[str, JobSteps],
    targets: Mapping[str, Target],
    model: GpuModel | None,
    published: frozenset[str],
    counts: Counts,
) -> list[pd.DataFrame]:
    """The families of one GPU running `jobs` as `targets` places them, at the union of their steps."""
    names = sorted(jobs)
    times = np.unique(np.concatenate([jobs[j].times for j in names]))
    shape = (len(times), len(names))
    duty, sm, memory = (np.full(shape, np.nan) for _ in range(3))
    for k, job in enumerate(names):
        at = np.searchsorted(times, jobs[job].times)
        duty[at, k], sm[at, k], memory[at, k] = jobs[job].duty, jobs[job].sm, jobs[job].memory
    present = np.zeros(shape, dtype=bool)
    for k, job in enumerate(names):
        present[np.searchsorted(times, jobs[job].times), k] = True
    mode = targets[names[0]].mode
    node = targets[names[0]].node
    gpu = {**gpu_labels, "uuid": uuid, "instance": node}
    out: list[pd.DataFrame] = []
    if mode is Mode.MIG:
        identities = {job: jobs[job].identity for job in names}
        steps = (times, present, duty, sm, memory)
        return _rebuild_mig(gpu, names, identities, steps, targets, model, published, counts)
    has_sm = ~np.isnan(sm)
    if mode is Mode.MPS:
        for k, job in enumerate(names):
            cap, limit = targets[job].sm_cap, targets[job].memory_limit
            if cap is not None:
                # a process's busy time where the history has none: a kernel at full width
                busy_k = np.where(np.isnan(duty[:, k]), sm[:, k], duty[:, k])
                over = np.where(has_sm[:, k], sm[:, k] > cap * busy_k, duty[:, k] > cap)
                # steps whose demand the cap cut (not only slowed down)
                limited = np.where(has_sm[:, k], sm[:, k] > cap, duty[:, k] > cap)
                counts.capped_steps += int(limited.sum())
                # kernels at most `cap` wide: the same work runs longer, and delivers at most
                # busy x cap (sim/patterns.py `_capped`)
                stretched = np.minimum(1.0, sm[:, k] / cap)
                duty[:, k] = np.where(over & has_sm[:, k], stretched, duty[:, k])
                duty[:, k] = np.where(over & ~has_sm[:, k], cap, duty[:, k])
                sm[:, k] = np.where(over & has_sm[:, k], stretched * cap, sm[:, k])
            if limit is not None:
                counts.capped_steps += int(np.nansum(memory[:, k] > limit))
                memory[:, k] = np.minimum(memory[:, k], limit)
    any_sm = has_sm.any(axis=1)
    sm_total = np.where(any_sm, np.nansum(sm, axis=1), np.nan)
    w = np.where(np.isnan(duty), np.where(has_sm, sm, 0.0), duty)  # a process's own busy time
    # MPS clients run concurrently (busy while any of them is); time-sliced contexts one at a time
    busy = 1.0 - np.prod(1.0 - np.clip(w, 0, 1), axis=1) if mode is Mode.MPS else np.sum(w, axis=1)
    counts.capped_steps += int(((busy > 1) | (np.nan_to_num(sm_total) > 1)).sum())
    sm_total = np.minimum(sm_total, 1.0)
    util = np.minimum(1.0, np.fmax(busy, np.nan_to_num(sm_total)))
    figure = np.where(any_sm, sm_total, util)  # the figure the exporter's shares divide
    weight, scale = w, np.maximum(w.sum(axis=1), util)
    caps = [targets[job].sm_cap for job in names] if mode is Mode.MPS else []
    if any(c is not None for c in caps):
        # where the figure is SM activity the exporter weighs MPS clients with known caps by
        # time x cap (exporter/attribution/shares.py); on utilization, by time
        capacity = w * np.array([1.0 if c is None else c for c in caps])[None, :]
        weight = np.where(any_sm[:, None], capacity, w)
        scale = np.where(any_sm, np.maximum(capacity.sum(axis=1), figure), scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_weight = figure / np.where(scale > 0, scale, 1.0)
        shares = np.where(present, per_weight[:, None] * weight, np.nan)
    rest = np.maximum(0.0, figure - np.nansum(shares, axis=1))
    running = present.sum(axis=1)
    for k, job in enumerate(names):
        at = present[:, k]
        if mode is Mode.MPS:
            sharing = np.full(len(times), "mps", dtype=object)
        else:
            sharing = np.where(running > 1, _TIME_SLICING, _EXCLUSIVE).astype(object)
        labels = {**gpu, "job_id": job, **jobs[job].identity}
        info = _rows(times[at], np.ones(int(at.sum())), "gpu_job_info", labels)
        info["sharing"] = sharing[at]
        out.append(info)
        out.append(_rows(times[at], memory[at, k], "gpu_job_memory_used_bytes", {**gpu, "job_id": job}))
        out.append(_rows(times[at], shares[at, k], "gpu_job_sm_utilization_ratio", {**gpu, "job_id": job}))
    out.append(_rows(times, rest, "gpu_job_sm_unattributed_ratio", gpu))
    if "gpu_utilization_ratio" in published:
        out.append(_rows(times, util, "gpu_utilization_ratio", gpu))
    if "gpu_sm_active_ratio" in published:
        out.append(_rows(times, sm_total, "gpu_sm_active_ratio", gpu))
    if "gpu_memory_used_bytes" in published:
        out.append(_rows(times, np.nansum(memory, axis=1), "gpu_memory_used_bytes", gpu))
    return out


def _rebuild_mig(
    gpu: Mapping[str, str],
    names: list[str],
    identities: Mapping[str, Mapping[str, str]],
    steps: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    targets: Mapping[str, Target],
    model: GpuModel | None,
    published: frozenset[str],
    counts: Counts,
) -> list[pd.DataFrame]:
    """A re-sliced GPU: one instance per job, its activity on the slice's scale (capped at 1)."""
    if model is None:
        raise ApplyPlanError(f"GPU {gpu['uuid']}: expected a model the catalog knows, to slice it")
    times, present, duty, sm, memory = steps
    out: list[pd.DataFrame] = []
    device_sm = np.zeros(len(times))
    any_sm = np.zeros(len(times), dtype=bool)
    for k, job in enumerate(names):
        target = targets[job]
        try:
            profile = model.mig_profile(target.mig_profile)
        except CatalogError as e:
            raise ApplyPlanError(f"plan.json: job {job!r}: {e}") from None
        gi = str(default_gpu_instance_id(model, profile, target.mig_start))
        fraction = profile.sm_count / model.sm_count
        demand = np.where(np.isnan(sm[:, k]), duty[:, k], sm[:, k]) / fraction
        counts.capped_steps += int(np.nansum(demand > 1) + np.nansum(memory[:, k] > profile.memory_bytes))
        activity = np.minimum(demand, 1.0)
        used = np.minimum(memory[:, k], profile.memory_bytes)
        at = present[:, k]
        slot = {**gpu, "gpu_instance": gi}
        labels = {**slot, "job_id": job, **identities[job]}
        out.append(_rows(times[at], np.ones(int(at.sum())), "gpu_job_info", {**labels, "sharing": "mig"}))
        out.append(_rows(times[at], used[at], "gpu_job_memory_used_bytes", {**slot, "job_id": job}))
        out.append(_rows(times[at], activity[at], "gpu_job_sm_utilization_ratio", {**slot, "job_id": job}))
        info = {**slot, "mig_profile": profile.name}
        out.append(_rows(times, np.ones(len(times)), "gpu_mig_instance_info", info))
        out.append(_rows(times, np.nan_to_num(used), "gpu_mig_memory_used_bytes", slot))
        out.append(
            _rows(times, np.full(len(times), float(profile.memory_bytes)), "gpu_mig_memory_total_bytes", slot)
        )
        has_sm = ~np.isnan(sm[:, k])
        if has_sm.any():
            out.append(_rows(times, np.where(at, activity, 0.0), "gpu_mig_sm_active_ratio", slot))
        device_sm += np.nan_to_num(np.where(at, activity, 0.0)) * fraction
        any_sm |= has_sm
    if "gpu_sm_active_ratio" in published and any_sm.any():
        out.append(_rows(times, np.minimum(device_sm, 1.0), "gpu_sm_active_ratio", gpu))
    if "gpu_memory_used_bytes" in published:
        out.append(_rows(times, np.nansum(memory, axis=1), "gpu_memory_used_bytes", gpu))
    return out


# ---------------------------------------------------------------------------------------------
# the whole history


def _plain(samples: pd.DataFrame) -> pd.DataFrame:
    """The long table with plain string labels (categoricals cannot take new values)."""
    out = samples.copy()
    for label in LABELS:
        out[label] = out[label].astype(str) if label in out else ""
    out["metric"] = out["metric"].astype(str)
    return out


def _models(gpu_info: pd.DataFrame) -> dict[str, GpuModel]:
    out: dict[str, GpuModel] = {}
    for uuid, name in gpu_info.drop_duplicates("uuid", keep="last")[["uuid", "model"]].itertuples(
        index=False
    ):
        model = model_for_nvml_name(str(name))
        if model is not None:
            out[str(uuid)] = model
    return out


def _apply_usage(history: History, report: Path, counts: Counts) -> pd.DataFrame:
    samples = _plain(history.samples)
    fams = {str(name): frame for name, frame in samples.groupby("metric", sort=False)}
    info = fams.get("gpu_job_info", samples.iloc[0:0])
    gpu_info = fams.get("gpu_info", samples.iloc[0:0]).sort_values("timestamp", kind="stable")
    now: dict[str, frozenset[str]] = {str(u): frozenset() for u in gpu_info["uuid"].unique()}
    now.update({str(u): frozenset(g["job_id"]) for u, g in info.groupby("uuid")})
    models = _models(gpu_info)
    plan = read_usage_plan(report, now, _memory_totals(fams, sorted(now), models))
    known = set(info["job_id"])
    for job in plan.targets:
        if job not in known:
            raise ApplyPlanError(
                f"{report / 'plan.json'}: job {job!r}: expected a job of the history, found none"
            )
    leaving = set(plan.targets) | set(plan.reclaimed)
    sources = {str(u) for u in info.loc[info["job_id"].isin(leaving), "uuid"]}
    affected = set(plan.rebuilt) | set(plan.freed) | sources
    for uuid in sorted(affected - set(plan.rebuilt)):
        stay = sorted(now.get(uuid, frozenset()) - leaving)
        if stay:
            raise ApplyPlanError(
                f"{report / 'plan.json'}: GPU {uuid}: expected the plan to place job {stay[0]!r} "
                "as its GPU changes or is freed, found it in no layout entry"
            )
    moved = {job: _job_steps(fams, info, job, models) for job in sorted(plan.targets)}
    last_info = gpu_info.drop_duplicates("uuid", keep="last").set_index("uuid")
    names = {str(u): str(m) for u, m in last_info["model"].items()}
    _on_new_models(moved, plan.targets, names, models, counts)
    counts.moved_jobs = len(plan.targets)  # every job on a rebuilt GPU restarts under its new config
    counts.rebuilt_gpus, counts.reclaimed_jobs = len(plan.rebuilt), len(plan.reclaimed)
    counts.freed_gpus = len(affected - set(plan.rebuilt))
    published = frozenset(fams)
    keep = ~(
        samples["job_id"].isin(leaving).to_numpy()
        | (samples["uuid"].isin(affected) & ~samples["metric"].isin(_IDENTITY_FAMILIES)).to_numpy()
    )
    parts = [samples[keep]]
    for uuid in sorted(plan.rebuilt):
        jobs = {job: moved[job] for job, t in plan.targets.items() if t.uuid == uuid}
        row = last_info.loc[uuid]
        gpu_labels = {"gpu": str(row["gpu"]), "instance": str(row["instance"])}
        rebuilt = _rebuild_gpu(uuid, gpu_labels, jobs, plan.targets, models.get(uuid), published, counts)
        parts.extend(rebuilt)
        stamps = np.unique(np.concatenate([j.times for j in jobs.values()]))
        have = gpu_info.loc[gpu_info["uuid"] == uuid, "timestamp"].to_numpy()
        missing = np.setdiff1d(stamps, have)
        if len(missing):
            labels = {label: str(row[label]) for label in LABELS if label != "uuid" and label in row}
            parts.append(_rows(missing, np.ones(len(missing)), "gpu_info", {**labels, "uuid": uuid}))
    frame = pd.concat(parts, ignore_index=True)
    for label in LABELS:
        frame[label] = frame[label].fillna("")
    return frame.sort_values(["timestamp", "metric"], kind="stable").reset_index(drop=True)


_REQUEST_FAMILIES = ("gpulens_trace_job_requested_gpus", "gpulens_trace_job_lifetime_seconds")


def _apply_requests(history: History, report: Path, counts: Counts) -> pd.DataFrame:
    """The requests with each pod the plan packs on a shared GPU running there (module docstring)."""
    plan_path = report / "plan.json"
    layout = report_field(str(plan_path), load_report_json(plan_path), "layout", list, "a list of GPUs")
    placed: dict[str, tuple[str, str]] = {}
    for i, entry in enumerate(layout):
        where = f"{plan_path}: layout[{i}]"
        name = report_field(where, entry, "gpu", str, "a GPU name")
        sharing = report_field(where, entry, "sharing", str, "a sharing mode")
        for job in report_field(where, entry, "jobs", list, "a list of job ids"):
            if not isinstance(job, str) or job in placed:
                raise ApplyPlanError(f"{where}.jobs: expected job ids, each once, found {job!r}")
            placed[job] = (name, sharing)
    samples = _plain(history.samples)
    rows = samples["metric"].isin(_REQUEST_FAMILIES).to_numpy()
    known = set(samples.loc[rows, "job_id"])
    for job in placed:
        if job not in known:
            raise ApplyPlanError(f"{plan_path}: job {job!r}: expected a pod of the history, found none")
    jobs = samples["job_id"].to_numpy()
    hits = rows & samples["job_id"].isin(placed).to_numpy()
    samples.loc[hits, "uuid"] = [placed[j][0] for j in jobs[hits]]
    samples.loc[hits, "sharing"] = [placed[j][1] for j in jobs[hits]]
    counts.moved_jobs = len(placed)
    counts.rebuilt_gpus = len({gpu for gpu, _ in placed.values()})
    return samples


def apply_plan_history(history_dir: str | Path, report: str | Path, out: str | Path) -> Counts:
    """Rewrite the history in `history_dir` into the fleet running the plan of `report`, at `out`."""
    try:
        history = read_history(history_dir)
    except AnalyzerError as e:
        raise ApplyPlanError(str(e)) from None
    counts = Counts()
    if history.kind == "requests":
        frame = _apply_requests(history, Path(report), counts)
    else:
        frame = _apply_usage(history, Path(report), counts)
    derived = ("format", "version", "samples", "families", "start", "end")
    meta = {k: v for k, v in history.meta.items() if k not in derived}
    meta["applied_plan"] = {"history": str(history_dir), "report": str(report), **vars(counts)}
    try:
        with HistoryWriter(out, meta) as writer:
            writer.add_frame(frame)
    except AnalyzerError as e:
        raise ApplyPlanError(str(e)) from None
    return counts
