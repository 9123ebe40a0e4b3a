"""Consolidation plan: pack recommended jobs onto as few of the fleet's GPUs as the rules allow.

`build_plan` runs four named steps:

1. **hold**: a GPU hosting a job we cannot size (`insufficient-data`) whose lifetime is unknown
   stays as it is, with every job on it (moving its neighbours would not free it). One whose
   lifetime is known is packed as a whole GPU over that lifetime only (`planinput._unsized`).
2. **pack**: first-fit decreasing per GPU model and sharing mode, time-aware (a job fits a GPU
   when, over its lifetime, the jobs already there leave room; a lifetime runs from the first
   sample to `plan.lifetime_margin_s` after the last step, so jobs that do not overlap use a GPU
   in turn in every mode but MIG), then lone sharers: a GPU shared by
   one job saves nothing, so that job joins a GPU of another mode (a free MIG slice, the other
   sharing mode), takes a partner from a fuller GPU of its mode (never one already running that
   way there) or stays on a whole GPU. The packing is done twice, from scratch and in place (jobs
   that already share a GPU stay together on it, the others join; GPUs that empty into others go);
   per GPU model the fewest GPUs win, then the fewest jobs moved, so a plan never moves a job
   for nothing. Where a cheap lower bound says another choice of the jobs' modes (`modes`: MIG
   slice, MPS cap, time-slicing, each sized by recommend.py's rules) could need fewer GPUs, the
   packer also chooses the modes (`packing._joint_packings`: all-MPS, all-MIG, and a first fit over every
   mode of each job) and those packings compete too; the fit tests judge every placement.
3. **account**: GPUs before = every GPU of the inventory (`gpu_info` over the window, idle GPUs
   included); the plan never uses more GPUs of a model than the fleet has: jobs moved to a model
   without room go back to their own, and a model whose packing would need more GPUs than it has
   keeps its jobs where they are, and so does a model whose packing needs as many GPUs as its jobs
   use now (moving them would free nothing). Freed per model is therefore never negative.
4. **layout**: each packed GPU is put on a real GPU of the inventory (the one its largest job runs
   on when it can), with its node, jobs, MIG placements, MPS client settings and the interference
   risk of jobs that share it. A job shares a GPU only with jobs of its own orchestrator
   (`job_source`: Kubernetes or Slurm, the fit tests' first check) and lands only on a node of it.

The steps' parts: the records and fit tests (`bins.py`), the items from the recommendation table
(`planinput.py`), packing (`packing.py`) and the layout (`planlayout.py`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import pandas as pd

from gpulens.analyzer import fragmentation, frames, serving
from gpulens.analyzer.bins import UNCHANGED, GpuBin, Item
from gpulens.analyzer.hosts import uuids_of
from gpulens.analyzer.hysteresis import KEPT_LIMIT, KEPT_THREADS, MEASURED
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.packing import fewest_moves
from gpulens.analyzer.planinput import (
    fleet_from_recs,
    items_of,
    known_lifetime,
    node_orchestrators,
    num,
    time_sliced_fraction,
)
from gpulens.analyzer.planlayout import assign_gpus, gpu_entry, mig_layouts, node_groups_of
from gpulens.analyzer.profile import FleetGpu
from gpulens.analyzer.thresholds import Thresholds
from gpulens.analyzer.topology import Topology


@dataclass
class Plan:
    """GPUs before/after per model, the layout and projected utilisation."""

    gpus_before: int
    gpus_after: int
    gpus_freed: int
    by_model: dict[str, dict[str, float]]
    utilization_before: float
    utilization_after: float
    window_hours: float
    layout: list[dict[str, Any]]
    node_groups: dict[str, dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    moved: dict[str, dict[str, Any]] = field(
        default_factory=dict
    )  # jobs the plan changed: their new settings
    freed: list[dict[str, Any]] = field(
        default_factory=list
    )  # GPUs the plan gives back: node, uuid, model, why
    # per request size (1, 2, 4, 8 GPUs of one node): how many the free GPUs hold now and after
    room: list[dict[str, Any]] = field(default_factory=list)
    # FGD: free GPUs the fleet's task mix cannot use (too few on their node), now and after
    fragmented_gpus: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """`dataclasses.asdict(self)`: the same copy, walked without its generic recursion (its
        deepcopy of every leaf cost ~0.35 s for a 10,000-job plan)."""
        return {f.name: _copied(getattr(self, f.name)) for f in fields(self)}


def _copied(value: object) -> object:
    """What `dataclasses.asdict` makes of a field's value: plain dicts, lists and tuples walked,
    immutable scalars as they are, anything else as asdict copies it."""
    kind = type(value)
    if kind is dict:
        return {_copied(k): _copied(v) for k, v in value.items()}  # type: ignore[attr-defined]
    if kind is list:
        return [_copied(v) for v in value]  # type: ignore[attr-defined]
    if kind in (str, int, float, bool) or value is None:
        return value
    return asdict(_Wrapped(value))["value"]


@dataclass
class _Wrapped:
    """One value, for `asdict`'s own treatment of what `_copied` does not walk itself."""

    value: object


def hold(recs: pd.DataFrame) -> tuple[pd.DataFrame, list[GpuBin]]:
    """Step 1: GPUs with a job we cannot size and whose lifetime is unknown stay as they are;
    returns the movable rows and them. A job we cannot size but know the lifetime of is packed
    as a whole GPU over that lifetime (`_unsized`)."""
    insufficient = recs[recs["recommendation"] == Kind.INSUFFICIENT_DATA]
    timeless = [not known_lifetime(row) for row in frames.rows(insufficient)]
    unknown = insufficient[pd.Series(timeless, index=insufficient.index, dtype=bool)]
    held = {u for uuids in unknown["uuids"] for u in uuids_of(uuids)}
    held |= {u for row in frames.records(_pooled(recs)) for u in uuids_of(row["uuids"])}
    on_held = recs["uuids"].map(lambda v: bool(held & set(uuids_of(v))))
    pinned = recs[on_held & (recs["recommendation"] != Kind.RECLAIM)]
    return recs[~on_held], _kept_as_they_are(pinned)


def _pooled(recs: pd.DataFrame) -> pd.DataFrame:
    """Servers recommended a MIG slice or an MPS limit their pool, allocated in bytes as
    configured, does not fit until its flag is lowered (`serving.pool_above_need`): their GPUs stay
    as they are this week."""
    if "serving_floor_bytes" not in recs or recs.empty:
        return recs.iloc[0:0]
    shrunk = recs["recommendation"].isin([Kind.MIG, Kind.MPS])
    rows = recs[shrunk]
    pooled = [bool(serving.pool_above_need(row)) for row in frames.records(rows)]
    return rows[pd.Series(pooled, index=rows.index, dtype=bool)]


def held_changes(recs: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Jobs on held GPUs that could have been sized: they stay as they run now."""
    movable, _ = hold(recs)
    stay = recs[~recs["job_id"].isin(movable["job_id"])]
    stay = stay[~stay["recommendation"].isin([Kind.RECLAIM, Kind.INSUFFICIENT_DATA])]
    servers = frames.records(_pooled(recs))
    pooled = {str(row["job_id"]): serving.pool_above_need(row) for row in servers}
    by_gpu = {u: str(row["job_id"]) for row in servers for u in uuids_of(row["uuids"])}
    out = {}
    for row in frames.rows(stay):
        job = str(row.job_id)
        server = next((by_gpu[u] for u in uuids_of(row.uuids) if u in by_gpu), None)
        if job in pooled:
            note = f"stays as it runs: {pooled[job]}"
        elif server is not None:
            note = f"shares a GPU with {server}, whose KV pool must be lowered before it moves"
        else:
            note = "shares a GPU with a job that has too little data"
        out[job] = {**_as_now(row), "note": note}
    return out


def _kept_as_they_are(recs: pd.DataFrame) -> list[GpuBin]:
    """One unchanged GPU per uuid the jobs use now, with those jobs."""
    bins: dict[str, GpuBin] = {}
    for row in frames.rows(recs):
        for uuid in uuids_of(row.uuids):
            gpu = bins.setdefault(
                uuid,
                GpuBin(
                    name=f"{row.gpu_model}@{uuid}",
                    model=str(row.gpu_model),
                    mode=UNCHANGED,
                    original_uuid=uuid,
                ),
            )
            gpu.items.append(
                Item(
                    row.job_id,
                    UNCHANGED,
                    str(row.gpu_model),
                    float(row.start),
                    float(row.end),
                    1,
                    0.0,
                    0.0,
                    0.0,
                    num(row.gpu_hours_used) / max(1, len(uuids_of(row.uuids))),
                    origin_model=str(row.gpu_model),
                    origin_uuids=tuple(uuids_of(row.uuids)),
                )
            )
    return list(bins.values())


def _capacity(fleet: Iterable[FleetGpu]) -> dict[str, int]:
    out: dict[str, int] = {}
    for gpu in fleet:
        out[gpu.model] = out.get(gpu.model, 0) + 1
    return out


def _as_now(row: object) -> dict[str, Any]:
    """The settings of a job that stays exactly as it runs now."""
    sharing = str(getattr(row, "sharing", "") or Kind.EXCLUSIVE.value)
    change: dict[str, Any] = {"recommendation": sharing, "target_gpu_model": None, "kept": True}
    if getattr(row, "recommendation", None) == Kind.INSUFFICIENT_DATA:
        change["recommendation"] = Kind.INSUFFICIENT_DATA.value  # stays: too little data to size
    change["mig_profile"] = (getattr(row, "mig_profile_now", "") or None) if sharing == Kind.MIG else None
    if sharing != Kind.MPS:
        change.update(mps_active_thread_percentage=None, mps_pinned_memory_limit_bytes=None)
    else:
        change.update(_mps_now(row))
    fraction = time_sliced_fraction(row) if sharing == Kind.TIME_SLICING else None
    if fraction is not None:  # what it takes time-sliced, not what a recommended MPS cap would
        change["gpu_fraction"] = fraction
    return change


def _mps_now(row: object) -> dict[str, Any]:
    """An MPS client's settings as it runs now: the thread cap measured (`hysteresis.MEASURED`),
    else the one kept for it (`hysteresis.KEPT_*`, a client recommended another mode) or the
    recommended one; the pinned limit is not measured: the kept or recommended one."""
    out: dict[str, Any] = {}
    recommended = getattr(row, "recommendation", None) == Kind.MPS
    kept = finite_number(getattr(row, KEPT_THREADS, None))
    measured = finite_number(getattr(row, MEASURED, None))
    if measured is not None and 0 < measured <= 100:
        out["mps_active_thread_percentage"] = round(measured)
    elif kept is not None:
        out["mps_active_thread_percentage"] = int(kept)
    if not recommended:
        limit = finite_number(getattr(row, KEPT_LIMIT, None))
        out["mps_pinned_memory_limit_bytes"] = int(limit) if limit is not None else None
        out.setdefault("mps_active_thread_percentage", None)
    return out


def finite_number(value: object) -> float | None:
    """A finite number, or None (a column's None, NaN, or anything else)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's scalars are Real
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def account(
    movable: pd.DataFrame,
    held: list[GpuBin],
    fleet: list[FleetGpu],
    th: Thresholds,
    time_sliced: frozenset[str] = frozenset(),
) -> tuple[list[GpuBin], dict[str, dict[str, Any]], list[str]]:
    """Steps 2-3: pack, settle lone sharers and keep every model within the fleet's count (the
    jobs in `time_sliced` packed time-sliced instead of MPS: `items_of`)."""
    capacity = _capacity(fleet)
    for gpu in held:
        capacity[gpu.model] = capacity.get(gpu.model, 0) - 1
    items = items_of(movable, th, time_sliced)
    notes: list[str] = []
    kept_models: set[str] = set()
    why: dict[str, str] = {}  # kept model -> why its jobs stay, when packing it gains nothing
    reverted: dict[str, dict[str, Any]] = {}
    while True:
        packed = [i for i in items if i.model not in kept_models]
        bins, moved = fewest_moves(packed, th, _ceiling(packed, capacity))
        used = _capacity(FleetGpu("", b.model, "") for b in bins)
        over = sorted(m for m, n in used.items() if n > capacity.get(m, 0))
        if not over:
            gainless = _gainless(items, used, kept_models)
            if not gainless:
                break
            # a packing that frees none of the GPUs a model's jobs use now would move jobs (and
            # change how GPUs share) for nothing: that model's jobs stay as they are
            kept_models.update(gainless)
            for model, now in gainless.items():
                why[model] = (
                    f"packing its {model} GPUs saves nothing (it needs {used[model]}, they use {now})"
                )
                notes.append(
                    f"{model}: the packing needs {used[model]} GPUs, its jobs use {now} now: "
                    "they stay as they are"
                )
            continue
        model = over[0]
        incoming = [i for i in items if i.model == model and i.origin_model != model]
        if incoming:  # downsized onto a model without room: the excess goes back to its own model
            incoming.sort(key=lambda i: (i.start, i.job_id))
            incoming = incoming[-max(1, used[model] - capacity.get(model, 0)) :]
            for i in incoming:
                reverted[i.job_id] = {
                    "recommendation": Kind.EXCLUSIVE.value,
                    "target_gpu_model": None,
                    "note": f"the fleet has no {model} left for it: it keeps its {i.origin_model}",
                }
                i.model, i.kind = i.origin_model, Kind.EXCLUSIVE.value
            notes.append(
                f"{len(incoming)} job(s) stay on their model: the fleet has {capacity.get(model, 0)} {model}"
            )
            continue
        kept_models.add(model)
        notes.append(
            f"{model}: the packing would need {used[model]} GPUs, the fleet has {capacity.get(model, 0)}; "
            "its jobs stay as they are"
        )
    moved.update(reverted)
    for item in items:  # a job too short to size keeps its verdict; the plan only places it
        if item.unsized and item.job_id in moved:
            moved[item.job_id]["recommendation"] = Kind.INSUFFICIENT_DATA.value
    kept = movable[movable["gpu_model"].isin(kept_models) & (movable["recommendation"] != Kind.RECLAIM)]
    for row in frames.rows(kept):
        moved[str(row.job_id)] = _as_now(row)
        if str(row.gpu_model) in why:
            moved[str(row.job_id)]["note"] = f"{why[str(row.gpu_model)]}: it stays as it runs now"
    return bins + _kept_as_they_are(kept) + held, moved, notes


def _ceiling(items: list[Item], capacity: dict[str, int]) -> dict[str, int]:
    """Per model, the GPUs a packing must need fewer of to be used at all: at most the fleet's
    count, and fewer than its jobs use now when none moves to or from another model (else
    `_gainless` keeps them as they are)."""
    out = {model: n + 1 for model, n in capacity.items()}
    uses: dict[str, set[str]] = {}
    crossing: set[str] = set()
    for item in items:
        if item.model != item.origin_model:
            crossing.update((item.model, item.origin_model))
        uses.setdefault(item.origin_model, set()).update(item.origin_uuids)
    for model, uuids in uses.items():
        if model not in crossing and uuids:
            out[model] = min(out.get(model, len(uuids)), len(uuids))
    return out


def _gainless(items: list[Item], used: dict[str, int], kept: set[str]) -> dict[str, int]:
    """Models whose packing needs at least as many GPUs as their jobs use now (-> that number), with
    no job moving to or from another model: packing them gains nothing (a downsize is judged with
    the model it leaves)."""
    out = {}
    for model, n in sorted(used.items()):
        mine = [i for i in items if i.model == model or i.origin_model == model]
        if model in kept or any(i.model != i.origin_model for i in mine):
            continue
        now = len({u for i in mine for u in i.origin_uuids})
        if now and n >= now:
            out[model] = now
    return out


def _freed(fleet: list[FleetGpu], bins: list[GpuBin], recs: pd.DataFrame) -> list[dict[str, Any]]:
    """Inventory GPUs no packed GPU uses, and why they are free."""
    used = {b.original_uuid for b in bins}
    had_jobs = {u for v in recs["uuids"] for u in uuids_of(v)}
    idle_only = {u for v in recs.loc[recs["recommendation"] == Kind.RECLAIM, "uuids"] for u in uuids_of(v)}
    busy = {u for v in recs.loc[recs["recommendation"] != Kind.RECLAIM, "uuids"] for u in uuids_of(v)}
    out = []
    for gpu in sorted(fleet, key=lambda g: (g.node, g.model, g.uuid)):
        if gpu.uuid in used:
            continue
        if gpu.uuid not in had_jobs:
            why = "no job in the window"
        elif gpu.uuid in idle_only and gpu.uuid not in busy:
            why = "its jobs allocated it and did nothing"
        else:
            why = "freed by consolidation"
        out.append({"node": gpu.node, "uuid": gpu.uuid, "model": gpu.model, "why": why})
    return out


def build_plan(
    recs: pd.DataFrame,
    th: Thresholds,
    fleet: list[FleetGpu] | None = None,
    topology: Topology | None = None,
    time_sliced: Mapping[str, str] | None = None,
) -> Plan:
    """Hold, pack and account, then lay the result out on the fleet's GPUs (module docstring);
    `topology` keeps the multi-GPU jobs it moves topology-local (`_keep_local`). `time_sliced`:
    job -> why MPS cannot run for it (its node's device plugin, `planasrun.plan_as_run`): packed
    time-sliced instead, and a job recommended MPS that stays time-sliced says why."""
    fleet = fleet_from_recs(recs) if fleet is None else _with_job_gpus(fleet, recs)
    if recs.empty and not fleet:
        return Plan(0, 0, 0, {}, 0.0, 0.0, 0.0, [], {})
    window_hours = _window_hours(recs)
    movable, held = hold(recs) if len(recs) else (recs, [])
    refused = dict(time_sliced or {})
    bins, moved, notes = account(movable, held, fleet, th, frozenset(refused)) if len(recs) else ([], {}, [])
    if len(recs):
        moved.update(held_changes(recs))
        _say_time_sliced(movable, moved, refused)
    mix = fragmentation.task_mix(int(num(g)) for g in recs["gpus"]) if len(recs) else {1: 1.0}
    assign_gpus(bins, fleet, topology, mix, node_orchestrators(recs, fleet) if len(recs) else {})
    mig_layouts(bins)
    groups = node_groups_of([b for b in bins if b.mode != UNCHANGED], th)
    before = _capacity(fleet)
    after = _capacity(FleetGpu("", b.model, "") for b in bins)
    by_model: dict[str, dict[str, float]] = {
        model: {
            "gpus_before": before.get(model, 0),
            "gpus_after": after.get(model, 0),
            "gpus_freed": before.get(model, 0) - after.get(model, 0),
        }
        for model in sorted(set(before) | set(after))
    }
    used = float(recs["gpu_hours_used"].fillna(0.0).sum()) if len(recs) else 0.0
    gpus_before, gpus_after = sum(before.values()), len(bins)
    idle = (
        sum(1 for g in _freed(fleet, bins, recs) if g["why"] == "no job in the window")
        if len(recs)
        else len(fleet)
    )
    if idle:
        notes.append(f"{idle} GPU(s) ran no job in the window: reclaimable as they are")
    room, fragmented = _room(fleet, bins, recs, mix, topology)
    downsized = int((recs["recommendation"] == Kind.DOWNSIZE).sum()) if len(recs) else 0
    if downsized:
        notes.append(f"{downsized} job(s) move to a smaller GPU model; per-model counts show where GPUs go")
    return Plan(
        gpus_before=gpus_before,
        gpus_after=gpus_after,
        gpus_freed=gpus_before - gpus_after,
        by_model=by_model,
        utilization_before=round(used / (gpus_before * window_hours), 4) if gpus_before else 0.0,
        utilization_after=round(used / (gpus_after * window_hours), 4) if gpus_after else 0.0,
        window_hours=round(window_hours, 3),
        layout=[gpu_entry(b, window_hours, th) for b in bins],
        node_groups=groups,
        notes=notes,
        moved=moved,
        freed=_freed(fleet, bins, recs)
        if len(recs)
        else [
            {"node": g.node, "uuid": g.uuid, "model": g.model, "why": "no job in the window"} for g in fleet
        ],
        room=room,
        fragmented_gpus=fragmented,
    )


def _say_time_sliced(
    movable: pd.DataFrame, moved: dict[str, dict[str, Any]], refused: Mapping[str, str]
) -> None:
    """A job recommended MPS, packed time-sliced because MPS cannot run for it (`refused`), gets
    that as its plan entry, unless the plan already gave it another mode."""
    if not refused or movable.empty:
        return
    mps = movable[(movable["recommendation"] == Kind.MPS) & movable["job_id"].isin(list(refused))]
    for row in frames.rows(mps):
        job = str(row.job_id)
        if "recommendation" not in moved.get(job, {}):
            moved[job] = time_sliced_change(moved.get(job), refused[job], time_sliced_fraction(row))


def time_sliced_change(before: Mapping[str, Any] | None, why: str, fraction: float | None) -> dict[str, Any]:
    """A job's plan entry (`moved`) once MPS cannot run for it and it is time-sliced: `why` ends
    its note, and its GPU fraction is its memory need (what recommend gives a time-sliced job)."""
    change = {k: v for k, v in (before or {}).items() if k != "kept"}
    earlier = str(change.get("note") or "")
    note = f"time-sliced, not MPS: {why}"
    change.update(
        recommendation=Kind.TIME_SLICING.value,
        mps_active_thread_percentage=None,
        mps_pinned_memory_limit_bytes=None,
        note=f"{earlier}; {note}" if earlier else note,
    )
    if fraction is not None:
        change["gpu_fraction"] = fraction
    return change


def _room(
    fleet: list[FleetGpu],
    bins: list[GpuBin],
    recs: pd.DataFrame,
    mix: dict[int, float],
    topology: Topology | None,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Requests of each size the free GPUs hold (`fragmentation.placeable`) and FGD's fragmented
    GPUs: now (GPUs no job used in the window) and after the plan (every GPU it leaves free)."""
    used = {b.original_uuid for b in bins}
    ran = {u for v in recs["uuids"] for u in uuids_of(v)} if len(recs) else set()
    now = fragmentation.free_per_node((g.node, g.uuid) for g in fleet if g.uuid not in ran)
    after = fragmentation.free_per_node((g.node, g.uuid) for g in fleet if g.uuid not in used)
    before, later = fragmentation.placeable(now, topology), fragmentation.placeable(after, topology)
    rows = [{"gpus": k, "now": before[k], "after": later[k]} for k in fragmentation.REQUEST_SIZES]

    def fragmented(free: dict[str, list[str]]) -> float:
        return round(sum(fragmentation.fragmentation(len(u), mix) for u in free.values()), 3)

    return rows, {"now": fragmented(now), "after": fragmented(after)}


def _with_job_gpus(fleet: list[FleetGpu], recs: pd.DataFrame) -> list[FleetGpu]:
    """The inventory plus any GPU a job used that `gpu_info` did not list (never fewer GPUs)."""
    known = {g.uuid for g in fleet}
    return list(fleet) + [g for g in fleet_from_recs(recs) if g.uuid not in known]


def _window_hours(recs: pd.DataFrame) -> float:
    if recs.empty:
        return 1e-9
    start, end = float(recs["start"].min()), float(recs["end"].max())
    hours = max((end - start) / 3600.0, 1e-9)
    if "duration_s" in recs:
        hours = max(hours, float(recs["duration_s"].max()) / 3600.0)
    return hours
