"""A time-sliced job's demand is never read below what it measured whole (issue 30 item 4).

NVML gives no per-process SM figure: on a time-sliced GPU the exporter splits the GPU's SM
activity among its processes by each one's kernel time (docs/attribution.md). That split is right
for the GPU's total but not between its jobs: a job of wide kernels (many SMs while it runs) and
one of narrow kernels, each busy half the time, get about the same share. So a wide-kernel job
measured whole at 18.8 % reads 11.5 % time-sliced beside a narrow one (6 % whole, 13.7 % split),
is re-sized small enough for the device plugin's MPS cap, and the plan moves it because it moved.

So, as for an MPS client whose cap clips its bursts (`hysteresis.CENSORED`), demand read from a
split is not trusted below demand measured whole: a job that runs time-sliced now and ran whole on
the same GPU model when last week's report measured it (its `jobs.json` row) has its SM activity
scaled up, before it is sized, so that its figure at last week's sizing percentile is at least
what it was whole. Its series scale with it (what the packer sums). The whole figure travels in
this week's `jobs.json` (`WHOLE`, `WHOLE_PERCENTILE`) for as long as the job stays time-sliced, so
a fleet that runs its plan keeps the demand it was planned with; run whole again, it is measured
afresh. A split that reads above the whole figure (the narrow-kernel job) stands: it errs on the
safe side, and a job may have grown.

Without a whole figure, a time-split share is no measure of what the job needs alone: a job that
ran time-sliced beside others all window (`SPLIT`) keeps time-slicing. The plan offers it no MPS
cap or MIG slice sized from its share (`modes.modes_of`; its recommendation says so,
`recommend._split_share`): a
wide-kernel renderer that needs 30 % read 22 % beside a narrow job, and the 27 % cap sized from
that bound in week 2. Run whole (or alone) for a week, it is measured and may be sized.

Only time-slicing: an MPS client's share is split the same way but also clipped by its cap, which
the hysteresis rules handle (`hysteresis.py`). Matched by job id, else by workload (after a
rollout or a resubmission), each last-week row once; only between the same GPU model and signal
(SM activity whole against its split, NVML utilization against its split).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpulens.analyzer import demand, frames
from gpulens.analyzer.hosts import model_key, uuids_of
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.workload import WORKLOAD_COLUMNS, workload_of

# the whole figure a time-sliced job's demand is held to (share of the GPU) and the percentile it
# is at: columns of the profile (and of `jobs.json`) only where some job has one
WHOLE = "sm_demand_whole"
WHOLE_PERCENTILE = "sm_demand_whole_percentile"
SCALE = "sm_demand_whole_scale"  # the factor its split activity was scaled by (> 1), else absent
# True where a job's demand is only a time-split share: time-sliced with no whole figure, beside
# jobs that ran on its GPU at the same time (alone, its share is the GPU's figure)
SPLIT = "sm_demand_split"
# the profile's activity columns a scale applies to (the signal's figures, not accounting ones)
ACTIVITY = ("sm_active_mean", "sm_active_p50", "sm_active_p95", "sm_active_p99", "sm_active_max")
PERCENTILES = ("p50", "p95", "p99", "max")
# a split signal -> the signal the same job reads whole (`signals.ACTIVITY`)
WHOLE_SIGNAL = {
    "sm_active_share": "sm_active",
    "sm_active_equal_split": "sm_active",
    "utilization_share": "utilization",
    "utilization_equal_split": "utilization",
}
WHOLE_ROW_COLUMNS = ("job_id", "sharing", "gpu_model", "gpus", "activity_signal", "sizing_percentile")


@dataclass(frozen=True)
class Whole:
    """One job's demand as last week's report measured it on a whole GPU (or carried it)."""

    job_id: str
    workload: str
    model: str  # gpu_model
    signal: str  # activity_signal whole: "sm_active" or "utilization"
    percentile: str  # "p50", "p95", "p99" or "max": the one it was sized at
    demand: float  # its activity at that percentile, share of the GPU (0, 1]


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _text(value: object) -> str:
    return "" if value is None or value is pd.NA else str(value)


@dataclass(frozen=True)
class WholeFigures:
    """What last week's report measured whole, and every job id it reported: a job reported last
    week is matched by its id only (a renamed one, after a rollout or a resubmission, by its
    workload), so it never takes a figure another job of its workload measured."""

    figures: tuple[Whole, ...] = ()
    reported: frozenset[str] = frozenset()


def whole_of(jobs: Iterable[Mapping[str, Any]]) -> WholeFigures:
    """Last week's jobs measured whole: one-GPU rows that ran exclusive, by their activity at
    their sizing percentile; and time-sliced rows that carried a whole figure (`WHOLE`). A row
    without the figures, or with one out of (0, 1], gives no figure."""
    out = []
    reported = set()
    for job in jobs:
        if not isinstance(job, Mapping):
            continue
        reported.add(_text(job.get("job_id")))
        if _number(job.get("gpus")) != 1:
            continue
        sharing, signal = _text(job.get("sharing")), _text(job.get("activity_signal"))
        if sharing == Kind.EXCLUSIVE and signal in WHOLE_SIGNAL.values():
            percentile = _text(job.get("sizing_percentile")) or "p95"
            found = _number(job.get(f"sm_active_{percentile}"))
        elif sharing == Kind.TIME_SLICING and signal in WHOLE_SIGNAL:
            percentile = _text(job.get(WHOLE_PERCENTILE))
            found = _number(job.get(WHOLE))
            signal = WHOLE_SIGNAL[signal]
        else:
            continue
        if percentile not in PERCENTILES or found is None or not 0 < found <= 1:
            continue
        workload = _text(job.get("workload")) or workload_of(job)
        out.append(
            Whole(_text(job.get("job_id")), workload, _text(job.get("gpu_model")), signal, percentile, found)
        )
    return WholeFigures(tuple(out), frozenset(reported - {""}))


def _matches(rows: Sequence[Mapping[str, Any]], whole: WholeFigures) -> dict[int, Whole]:
    """Row position -> last week's whole figure of the same job id, else, for a job last week's
    report did not have, of a job of its workload (each once): rows that run time-sliced on one
    GPU now, of the same model and signal."""
    by_id = {w.job_id: w for w in whole.figures}
    by_workload: dict[str, list[Whole]] = {}
    for w in whole.figures:
        by_workload.setdefault(w.workload, []).append(w)
    taken = {str(r["job_id"]) for r in rows if str(r["job_id"]) in by_id}
    out: dict[int, Whole] = {}
    for k, row in enumerate(rows):
        if _text(row.get("sharing")) != Kind.TIME_SLICING or _number(row.get("gpus")) != 1:
            continue
        found = by_id.get(str(row["job_id"]))
        if found is None and str(row["job_id"]) not in whole.reported:
            free = [w for w in by_workload.get(workload_of(row), []) if w.job_id not in taken]
            found = free[0] if free else None
            if found is not None:
                taken.add(found.job_id)
        signal = WHOLE_SIGNAL.get(_text(row.get("activity_signal")))
        same_model = found is not None and model_key(found.model) == model_key(_text(row.get("gpu_model")))
        if found is not None and same_model and found.signal == signal:
            out[k] = found
    return out


def apply(profiles: pd.DataFrame, whole: WholeFigures | None) -> pd.DataFrame:
    """Profiles with each time-sliced job's activity (and series) scaled up to what it measured
    whole (module docstring), its whole figure carried in `WHOLE` / `WHOLE_PERCENTILE` and the
    factor in `SCALE`; the jobs left with only a time-split share marked `SPLIT`."""
    return mark_split(_held(profiles, whole or WholeFigures()))


def _held(profiles: pd.DataFrame, whole: WholeFigures) -> pd.DataFrame:
    if not whole.figures or profiles.empty:
        return profiles
    columns = [c for c in dict.fromkeys((*WHOLE_ROW_COLUMNS, *WORKLOAD_COLUMNS)) if c in profiles]
    columns += [c for c in ACTIVITY if c in profiles]
    rows = frames.records(profiles[columns])
    found = _matches(rows, whole)
    if not found:
        return profiles
    out = profiles.copy()
    carried: dict[str, dict[Any, object]] = {WHOLE: {}, WHOLE_PERCENTILE: {}, SCALE: {}}
    scales: dict[str, float] = {}
    for k, w in found.items():
        label, row = out.index[k], rows[k]
        carried[WHOLE][label], carried[WHOLE_PERCENTILE][label] = w.demand, w.percentile
        split = _number(row.get(f"sm_active_{w.percentile}"))
        if split is None or split <= 0 or split >= w.demand:
            continue  # read at or above it whole: the split stands
        scale = w.demand / split
        carried[SCALE][label] = scale
        scales[str(row["job_id"])] = scale
        for column in ACTIVITY:
            if (value := _number(row.get(column))) is not None:
                out.at[label, column] = min(1.0, value * scale)
    for column, values in carried.items():  # columns only where some job has one
        if values:
            out[column] = pd.Series(values, dtype=object if column == WHOLE_PERCENTILE else float)
    series = demand.of(profiles)
    if series is not None and scales:
        sm = {job: s.scaled(scales[job]) if job in scales else s for job, s in series.sm.items()}
        demand.attach(out, demand.Demand(series.bin_s, sm, series.dram, series.busy))
    return out


def mark_split(profiles: pd.DataFrame) -> pd.DataFrame:
    """`SPLIT` (a column of booleans, only where some job has it) on each time-sliced job with no
    whole figure whose lifetime overlapped another job's on one of its GPUs."""
    need = ["sharing", "activity_signal", "uuids", "start", "end"]
    if profiles.empty or any(c not in profiles for c in need):
        return profiles
    rows = frames.records(profiles[[*need, *([WHOLE] if WHOLE in profiles else [])]])
    spans: dict[str, list[tuple[float, float, int]]] = {}
    for k, row in enumerate(rows):
        start, end = _number(row["start"]), _number(row["end"])
        if start is None or end is None:
            continue
        for uuid in uuids_of(_text(row["uuids"])):
            spans.setdefault(uuid, []).append((start, end, k))
    shared: set[int] = set()
    for jobs in spans.values():  # sorted by start: a job overlaps an earlier one whose end is later
        jobs.sort()  # than its start, or the next one when that starts before its end
        latest = -math.inf
        for n, (start, end, k) in enumerate(jobs):
            if latest > start or (n + 1 < len(jobs) and jobs[n + 1][0] < end):
                shared.add(k)
            latest = max(latest, end)
    split = [
        k in shared
        and _text(row["sharing"]) == Kind.TIME_SLICING
        and _text(row["activity_signal"]) in WHOLE_SIGNAL
        and _number(row.get(WHOLE)) is None
        for k, row in enumerate(rows)
    ]
    if not any(split):
        return profiles
    return profiles.assign(**{SPLIT: split})


def split_only(row: Mapping[str, Any]) -> bool:
    """Whether a job's demand is only a time-split share (`SPLIT`)."""
    value = row.get(SPLIT)
    return isinstance(value, bool | np.bool_) and bool(value)


def note(row: Mapping[str, Any]) -> str:
    """The sentence a scaled job's reason carries, else ""."""
    scale = _number(row.get(SCALE))
    level, percentile = _number(row.get(WHOLE)), _text(row.get(WHOLE_PERCENTILE))
    if scale is None or scale <= 1 or level is None:
        return ""
    return (
        f"time-sliced, its share of the GPU's SM activity (split by kernel time) read "
        f"{100 * level / scale:.1f} % at {percentile}: held to the {100 * level:.1f} % it measured "
        "whole, since a split cannot tell wide kernels from narrow ones"
    )


def explain(recs: pd.DataFrame) -> pd.DataFrame:
    """Recommendations whose reason says where a job's demand was held to its whole figure."""
    if SCALE not in recs:
        return recs
    recs = recs.copy()
    for label, row in zip(
        recs.index, frames.records(recs[["reason", SCALE, WHOLE, WHOLE_PERCENTILE]]), strict=True
    ):
        if text := note(row):
            recs.at[label, "reason"] = f"{row['reason']}; {text}" if row["reason"] else text
    return recs
