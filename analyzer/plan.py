"""Consolidation plan: pack recommended jobs onto as few GPUs as the rules allow.

First-fit decreasing per GPU model, time-aware: a job fits a GPU when, over the job's lifetime,
the jobs already placed there leave enough memory, SM demand and client slots. GPUs are typed by
how they are shared, because the NVIDIA device plugin applies MPS and time-slicing per node and
MPS is not supported on MIG GPUs:

- `exclusive` / `downsize-model`: one job per GPU at a time (sequential jobs may reuse it);
- `mig`: a static geometry; a new slice fits only when `catalog.place_mig_layout` places the whole
  set (slices are not reused over time: reconfiguring needs an idle GPU);
- `mps`: pinned memory limits sum to at most the GPU memory, SM demand to `mps.max_load`,
  clients to the model's MPS client limit;
- `time-slicing`: memory need sums to the GPU memory (no isolation), at most
  `time_slicing.max_replicas` jobs, mean activity to `plan.max_gpu_load`.

`reclaim` jobs free their GPUs; a GPU hosting an `insufficient-data` job stays as it is, with
every job on it (moving its neighbours would not free it). GPUs are grouped into node groups of
`plan.gpus_per_node` per model and sharing type, which is what `emit` turns into configuration.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd

from gpulens.analyzer.thresholds import Thresholds
from gpulens.catalog import MIB, CatalogError, GpuModel, model_for_nvml_name, place_mig_layout

SHARED_KINDS = ("mps", "time-slicing")


@dataclass
class Item:
    """One job as the packer sees it."""

    job_id: str
    kind: str
    model: str
    start: float
    end: float
    gpus: int
    memory: float  # bytes needed per GPU
    sm: float  # SM demand as a fraction of the GPU
    load: float  # mean activity as a fraction of the GPU (for projected utilisation)
    used_hours: float
    mig_profile: str | None = None
    mig_alternative: str | None = None
    thread_pct: int | None = None
    memory_limit: int | None = None

    def overlaps(self, other: Item) -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass
class GpuBin:
    """One GPU after consolidation."""

    name: str
    model: str
    mode: str  # exclusive | mig | mps | time-slicing | unchanged
    items: list[Item] = field(default_factory=list)
    node_group: str = ""
    mig_layout: list[dict] = field(default_factory=list)
    original_uuid: str = ""

    def _overlapping(self, item: Item) -> list[Item]:
        """Placed items overlapping `item` (inlined `Item.overlaps`: the packer's innermost loop)."""
        start, end = item.start, item.end
        return [o for o in self.items if o.start <= end and start <= o.end]

    def peak(self, item: Item, attr: str) -> float:
        """Largest sum of `attr` over time among placed items overlapping `item`, plus the item."""
        others = self._overlapping(item)
        points = [item.start] + [o.start for o in others if o.start > item.start]
        best = 0.0
        for t in points:
            best = max(best, sum(getattr(o, attr) for o in others if o.start <= t <= o.end))
        return best + (getattr(item, attr) if attr != "count" else 1)

    def peaks(self, item: Item, attrs: tuple[str, ...]) -> dict[str, float]:
        """`peak` of several attributes (and "count", as `concurrent`) in one pass over the items."""
        others = self._overlapping(item)
        points = [item.start] + [o.start for o in others if o.start > item.start]
        best = dict.fromkeys(attrs, 0.0)
        for t in points:
            active = [o for o in others if o.start <= t <= o.end]
            for attr in attrs:
                value = len(active) if attr == "count" else sum(getattr(o, attr) for o in active)
                best[attr] = max(best[attr], value)
        return {a: best[a] + (1 if a == "count" else getattr(item, a)) for a in attrs}

    def max_sum(self, attr: str) -> float:
        """Largest sum of `attr` over time among the placed items (committed memory, load)."""
        return max(
            (sum(getattr(o, attr) for o in self.items if o.start <= i.start <= o.end) for i in self.items),
            default=0.0,
        )

    def concurrent(self, item: Item) -> int:
        others = self._overlapping(item)
        points = [item.start] + [o.start for o in others if o.start > item.start]
        return max((sum(1 for o in others if o.start <= t <= o.end) for t in points), default=0) + 1


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
    layout: list[dict]
    node_groups: dict[str, dict]
    notes: list[str] = field(default_factory=list)
    moved: dict[str, dict] = field(default_factory=dict)  # lone sharers placed elsewhere: new settings

    def as_dict(self) -> dict:
        return asdict(self)


def _first_fit(profiles: Iterable[str | None]) -> list[tuple[str, int | None]]:
    """MIG placement requests, each at its first free start; a missing profile ("") cannot be placed."""
    return [(profile or "", None) for profile in profiles]


def _int_or_none(value: object) -> int | None:
    """Integer settings from a DataFrame column that may hold NaN/None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)  # type: ignore[call-overload]


def _items(recs: pd.DataFrame) -> list[Item]:
    items = []
    for row in recs.itertuples(index=False):
        kind = row.recommendation
        if kind in ("reclaim", "insufficient-data"):
            continue
        model = row.target_gpu_model if kind == "downsize-model" else row.gpu_model
        gpus = int(row.gpus) if kind in ("exclusive", "downsize-model") else 1
        sm = float(row.sm_fraction) if row.sm_fraction == row.sm_fraction and row.sm_fraction else 0.0
        load = row.gpu_hours_used / (row.duration_s / 3600.0) / max(gpus, 1) if row.duration_s else 0.0
        items.append(
            Item(
                job_id=row.job_id,
                kind="exclusive" if kind == "downsize-model" else kind,
                model=str(model),
                start=float(row.start),
                end=float(row.end),
                gpus=gpus,
                memory=float(row.memory_need_bytes or 0.0),
                sm=float(min(sm, 1.0)),
                load=0.0 if math.isnan(load) else float(load),
                used_hours=0.0 if math.isnan(row.gpu_hours_used) else float(row.gpu_hours_used),
                mig_profile=row.mig_profile if kind == "mig" else None,
                mig_alternative=row.mig_alternative if isinstance(row.mig_alternative, str) else None,
                thread_pct=_int_or_none(row.mps_active_thread_percentage),
                memory_limit=_int_or_none(row.mps_pinned_memory_limit_bytes),
            )
        )
    return items


def _fits(gpu: GpuBin, item: Item, model: GpuModel | None, th: Thresholds) -> bool:
    if gpu.mode != item.kind or gpu.model != item.model:
        return False
    memory_total = model.memory_bytes if model else math.inf
    if item.kind == "exclusive":
        return not gpu._overlapping(item)
    if item.kind == "mig":
        if model is None:
            return False
        try:
            place_mig_layout(model, _first_fit([*(o.mig_profile for o in gpu.items), item.mig_profile]))
        except CatalogError:
            return False
        return True
    # one pass over the GPU's items for all three limits (the packer's hottest call)
    peak = gpu.peaks(item, ("memory", "sm" if item.kind == "mps" else "load", "count"))
    if peak["memory"] > memory_total:
        return False
    if item.kind == "mps":
        clients = th.get("mps", "max_clients") or (model.mps_max_clients if model else 48)
        return peak["sm"] <= th.get("mps", "max_load") + 1e-9 and peak["count"] <= clients
    # time-slicing
    return (
        peak["count"] <= th.get("time_slicing", "max_replicas")
        and peak["load"] <= th.get("plan", "max_gpu_load") + 1e-9
    )


def _pack(items: list[Item], th: Thresholds) -> list[GpuBin]:
    bins: list[GpuBin] = []
    counters: dict[str, int] = {}

    def size(i: Item) -> float:
        model = model_for_nvml_name(i.model)
        return max(i.memory / model.memory_bytes if model else 0.0, i.sm, i.load)

    order = sorted(items, key=lambda i: (i.model, i.kind, -size(i), i.start, i.job_id))
    # first fit among the bins an item can join at all (same mode and model), in creation order:
    # the same choice as scanning every bin, without touching thousands that cannot match
    compatible: dict[tuple[str, str], list[GpuBin]] = {}
    for item in order:
        model = model_for_nvml_name(item.model)
        needed = item.gpus
        chosen: list[GpuBin] = []
        candidates = compatible.setdefault((item.kind, item.model), [])
        for gpu in candidates:
            if len(chosen) == needed:
                break
            if _fits(gpu, item, model, th):
                chosen.append(gpu)
        while len(chosen) < needed:
            counters[item.model] = counters.get(item.model, 0) + 1
            gpu = GpuBin(name=f"{item.model}#{counters[item.model]}", model=item.model, mode=item.kind)
            bins.append(gpu)
            candidates.append(gpu)
            chosen.append(gpu)
        for gpu in chosen:
            gpu.items.append(item)
    return bins


def _absorb_lone_sharers(bins: list[GpuBin], th: Thresholds) -> tuple[list[GpuBin], dict[str, dict]]:
    """A job alone on a shared GPU joins another GPU where it fits, changing how it shares.

    A GPU shared by nobody saves nothing. An MPS job takes a free slice of a MIG GPU of the same
    model (the slice its recommendation sized); an MPS or time-sliced job joins a GPU of the other
    sharing mode when the rules of that mode admit it. Returns the remaining bins and, per moved
    job, its new sharing mode and settings.
    """
    moved: dict[str, dict] = {}
    removed: set[int] = set()
    for gpu in bins:
        if gpu.mode not in SHARED_KINDS or len(gpu.items) != 1:
            continue
        item = gpu.items[0]
        model = model_for_nvml_name(gpu.model)
        if model is None:
            continue
        for other in bins:
            if other is gpu or id(other) in removed or other.model != gpu.model:
                continue
            if other.mode == "mig" and item.kind == "mps" and item.mig_alternative:
                wanted = _first_fit([*(o.mig_profile for o in other.items), item.mig_alternative])
                try:
                    place_mig_layout(model, wanted)
                except CatalogError:
                    continue
                change: dict[str, Any] = {"recommendation": "mig", "mig_profile": item.mig_alternative}
            elif other.mode in SHARED_KINDS and other.mode != item.kind and len(other.items) > 1:
                candidate = replace(item, kind=other.mode)
                if other.mode == "mps":
                    candidate.thread_pct = _thread_pct(item.sm, th)
                    candidate.memory_limit = int(math.ceil(item.memory / MIB) * MIB)
                if not _fits(other, candidate, model, th):
                    continue
                item.kind, item.thread_pct, item.memory_limit = (
                    candidate.kind,
                    candidate.thread_pct,
                    candidate.memory_limit,
                )
                change = {"recommendation": other.mode}
                if other.mode == "mps":
                    change.update(
                        mps_active_thread_percentage=item.thread_pct,
                        mps_pinned_memory_limit_bytes=item.memory_limit,
                    )
            else:
                continue
            if change["recommendation"] == "mig":
                item.kind, item.mig_profile = "mig", item.mig_alternative
            other.items.append(item)
            removed.add(id(gpu))
            moved[item.job_id] = change
            break
    return [b for b in bins if id(b) not in removed], moved


def _thread_pct(sm_fraction: float, th: Thresholds) -> int:
    """MPS thread percentage for a job that joins an MPS GPU from the packer (as recommend sizes it)."""
    demand = sm_fraction * (1 + th.get("headroom", "compute_ratio"))
    pct = math.ceil(demand * 100 / 5 - 1e-9) * 5
    return int(min(100, max(th.get("mps", "min_thread_percentage"), pct)))


def _mig_layouts(bins: list[GpuBin]) -> None:
    for gpu in bins:
        if gpu.mode != "mig":
            continue
        model = model_for_nvml_name(gpu.model)
        assert model is not None
        placements = place_mig_layout(model, _first_fit(i.mig_profile for i in gpu.items))
        gpu.mig_layout = [
            {"profile": p.profile.name, "start": p.start, "job_id": i.job_id}
            for p, i in zip(placements, gpu.items, strict=True)
        ]


def _node_groups(bins: list[GpuBin], th: Thresholds) -> dict[str, dict]:
    """Group GPUs into nodes per (model, sharing family): device-plugin sharing is per node."""
    per_node = int(th.get("plan", "gpus_per_node"))
    families: dict[tuple[str, str], list[GpuBin]] = {}
    for gpu in bins:
        family = gpu.mode if gpu.mode in SHARED_KINDS else "whole"
        families.setdefault((gpu.model, family), []).append(gpu)
    groups: dict[str, dict] = {}
    for (model, family), members in sorted(families.items()):
        for n, start in enumerate(range(0, len(members), per_node), start=1):
            name = f"{model.lower()}-{family}-{n}"
            chunk = members[start : start + per_node]
            for index, gpu in enumerate(chunk):
                gpu.node_group = name
                gpu.name = f"{name}/gpu{index}"
            groups[name] = {"model": model, "sharing": family, "gpus": [g.name for g in chunk]}
    return groups


def build_plan(recs: pd.DataFrame, th: Thresholds) -> Plan:
    """Pack the recommended jobs; see the module docstring for the rules."""
    if recs.empty:
        return Plan(0, 0, 0, {}, 0.0, 0.0, 0.0, [], {})
    start, end = float(recs["start"].min()), float(recs["end"].max())
    window_hours = max((end - start) / 3600.0, 1e-9)
    if "duration_s" in recs and len(recs):
        window_hours = max(window_hours, float(recs["duration_s"].max()) / 3600.0)
    # a GPU hosting a job we cannot size stays as it is, with every job on it: moving its
    # neighbours away would not free it
    unknown = recs[recs["recommendation"] == "insufficient-data"]
    held = {u for uuids in unknown["uuids"] for u in str(uuids).split(",") if u}
    on_held = recs["uuids"].map(lambda v: bool(held & set(str(v).split(","))))
    items = _items(recs[~on_held])
    bins, moved = _absorb_lone_sharers(_pack(items, th), th)
    _mig_layouts(bins)
    pinned = recs[on_held & (recs["recommendation"] != "reclaim")]
    kept: dict[str, str] = {}
    jobs_on: dict[
        str, list
    ] = {}  # uuid -> the pinned rows on it, in row order (one pass, not one scan per GPU)
    for row in pinned.itertuples(index=False):
        for uuid in dict.fromkeys(u for u in str(row.uuids).split(",") if u):
            kept[uuid] = str(row.gpu_model)
            jobs_on.setdefault(uuid, []).append(row)
    for uuid, model in sorted(kept.items()):
        gpu = GpuBin(name=f"{model}@{uuid}", model=model, mode="unchanged", original_uuid=uuid)
        gpu.items = [
            Item(
                r.job_id,
                "unchanged",
                model,
                r.start,
                r.end,
                1,
                0.0,
                0.0,
                0.0,
                0.0 if math.isnan(r.gpu_hours_used) else r.gpu_hours_used,
            )
            for r in jobs_on[uuid]
        ]
        bins.append(gpu)
    groups = _node_groups([b for b in bins if b.mode != "unchanged"], th)
    before: dict[str, set[str]] = {}
    for row in recs.itertuples(index=False):
        for uuid in str(row.uuids).split(","):
            if uuid:
                before.setdefault(str(row.gpu_model), set()).add(uuid)
    after: dict[str, int] = {}
    for gpu in bins:
        after[gpu.model] = after.get(gpu.model, 0) + 1
    by_model: dict[str, dict[str, float]] = {}
    for model in sorted(set(before) | set(after)):
        b, a = len(before.get(model, ())), after.get(model, 0)
        by_model[model] = {"gpus_before": b, "gpus_after": a, "gpus_freed": b - a}
    used = float(recs["gpu_hours_used"].fillna(0.0).sum())
    gpus_before = sum(len(v) for v in before.values())
    gpus_after = len(bins)
    layout = []
    for gpu in bins:
        used_hours = sum(i.used_hours / max(i.gpus, 1) for i in gpu.items)
        entry = {
            "gpu": gpu.name,
            "model": gpu.model,
            "node_group": gpu.node_group,
            "sharing": gpu.mode,
            "jobs": [i.job_id for i in gpu.items],
            "projected_utilization": round(used_hours / window_hours, 4),
            "memory_committed_bytes": int(gpu.max_sum("memory")) if gpu.mode in SHARED_KINDS else None,
        }
        if gpu.mode == "mig":
            entry["mig_layout"] = gpu.mig_layout
        if gpu.mode == "mps":
            entry["mps_clients"] = [
                {
                    "job_id": i.job_id,
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": i.thread_pct,
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": i.memory_limit,
                }
                for i in gpu.items
            ]
        if gpu.mode == "time-slicing":
            entry["replicas"] = int(
                max((sum(1 for o in gpu.items if o.start <= i.start <= o.end) for i in gpu.items), default=0)
            )
        if gpu.original_uuid:
            entry["uuid"] = gpu.original_uuid
        layout.append(entry)
    notes = []
    downsized = recs[recs["recommendation"] == "downsize-model"]
    if len(downsized):
        notes.append(
            f"{len(downsized)} job(s) move to a smaller GPU model; per-model counts show where GPUs go"
        )
    return Plan(
        gpus_before=gpus_before,
        gpus_after=gpus_after,
        gpus_freed=gpus_before - gpus_after,
        by_model=by_model,
        utilization_before=round(used / (gpus_before * window_hours), 4) if gpus_before else 0.0,
        utilization_after=round(used / (gpus_after * window_hours), 4) if gpus_after else 0.0,
        window_hours=round(window_hours, 3),
        layout=layout,
        node_groups=groups,
        notes=notes,
        moved=moved,
    )
