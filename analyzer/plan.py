"""Consolidation plan: pack recommended jobs onto as few of the fleet's GPUs as the rules allow.

`build_plan` runs four named steps:

1. **hold**: a GPU hosting a job we cannot size (`insufficient-data`) whose lifetime is unknown
   stays as it is, with every job on it (moving its neighbours would not free it). One whose
   lifetime is known is packed as a whole GPU over that lifetime only (`_unsized`).
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
   packer also chooses the modes (`_joint_packings`: all-MPS, all-MIG, and a first fit over every
   mode of each job) and those packings compete too; the fit tests judge every placement.
3. **account**: GPUs before = every GPU of the inventory (`gpu_info` over the window, idle GPUs
   included); the plan never uses more GPUs of a model than the fleet has: jobs moved to a model
   without room go back to their own, and a model whose packing would need more GPUs than it has
   keeps its jobs where they are, and so does a model whose packing needs as many GPUs as its jobs
   use now (moving them would free nothing). Freed per model is therefore never negative.
4. **layout**: each packed GPU is put on a real GPU of the inventory (the one its largest job runs
   on when it can), with its node, jobs, MIG placements, MPS client settings and the interference
   risk of jobs that share it.

Fit tests (evidence, not a "more than half a GPU" rule):

- `exclusive` / `downsize-model`: one job at a time per GPU (sequential jobs may reuse it);
- `mig`: a static geometry; a new slice fits only when `catalog.place_mig_layout` places the whole
  set (slices are not reused over time: reconfiguring needs an idle GPU; a later job reusing an
  idle slice of its profile would be sound, but the layout holds one job per slice);
- `mps`: pinned memory limits sum to at most the GPU memory, the thread caps of every job on the
  GPU to 100 % (Slurm's MPS shares are per GPU, not per instant; on Kubernetes each client's cap
  to 100 / clients, the device plugin's split), clients to the model's MPS client limit, the
  co-located SM demand to `mps.max_load` and DRAM activity to `plan.max_dram_load`;
- `time-slicing`: memory need sums to the GPU memory (no isolation), at most
  `time_slicing.max_replicas` jobs, mean activity to `plan.max_gpu_load`, the co-located SM
  demand to `time_slicing.max_interference` and DRAM activity to `plan.max_dram_load`.

Co-located demand (MIG isolates it, MPS and time-slicing do not): where the job and those it
meets have per-bin series (`demand`), their sum may exceed the limit in at most
`compute.max_bind_fraction` of each job's bins (two bursty jobs that never burst together
share); otherwise their p95s (MPS: sizing-percentile demand) summed over time stay within it.
`interference` reports both per shared GPU.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, SupportsInt, cast

import pandas as pd

from gpulens.analyzer import demand, forked, fragmentation, frames, modes
from gpulens.analyzer.freetime import Capacity, FreeTime, set_bits
from gpulens.analyzer.instantload import COLUMNS, InstantLoad
from gpulens.analyzer.kinds import SHARED, WHOLE, Kind
from gpulens.analyzer.modes import Mode
from gpulens.analyzer.profile import FleetGpu
from gpulens.analyzer.recommend import memory_need, mps_settings
from gpulens.analyzer.thresholds import Thresholds
from gpulens.analyzer.topology import Tier, Topology, best_set
from gpulens.catalog import CatalogError, GpuModel, model_for_nvml_name, place_mig_layout

UNCHANGED = "unchanged"  # the mode of a held GPU (or a model kept as it is)
KUBERNETES = "kubernetes"


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
    sm: float  # compute demand at the sizing percentile, share of the GPU
    load: float  # mean activity as a share of the GPU (projected utilisation)
    used_hours: float
    p95: float = 0.0  # p95 compute demand, share of the GPU (interference)
    dram: float = 0.0  # p95 DRAM activity, share of the GPU's bandwidth (0 when not measured)
    source: str = ""  # job_source: Kubernetes MPS caps follow the device plugin's split
    origin_model: str = ""  # the model the job runs on now
    origin_mode: str = ""  # how it shares now (profile `sharing`)
    origin_uuids: tuple[str, ...] = ()
    mig_profile: str | None = None
    mig_alternative: str | None = None
    thread_pct: int | None = None
    memory_limit: int | None = None
    device_memory: float = math.inf  # a model the catalog does not know: its memory from the data
    unsized: bool = False  # too little data to size: packed whole over its lifetime, not resized
    # per-bin SM demand / DRAM activity as shares of the whole GPU (`demand`); None: not measured,
    # the percentile sums decide for it (module docstring)
    sm_series: demand.Series | None = None
    dram_series: demand.Series | None = None
    # its recommended mode first, then the others it fits (`modes.modes_of`); () = only its own
    modes: tuple[Mode, ...] = ()


@dataclass
class GpuBin:
    """One GPU after consolidation."""

    name: str
    model: str
    mode: str  # a Kind value, or "unchanged"
    items: list[Item] = field(default_factory=list)
    node_group: str = ""
    mig_layout: list[dict[str, Any]] = field(default_factory=list)
    original_uuid: str = ""
    node: str = ""

    def _overlapping(self, item: Item) -> list[Item]:
        """Placed items overlapping `item` (the packer's innermost loop)."""
        start, end = item.start, item.end
        return [o for o in self.items if o.start <= end and start <= o.end]

    def peaks(self, item: Item, attrs: tuple[str, ...]) -> dict[str, float]:
        """Largest sum over time of each attribute (and "count") among overlapping items, plus `item`."""
        others = self._overlapping(item)
        best = dict.fromkeys(attrs, 0.0)
        if others:  # each attribute read once per job, summed in the jobs' order at every start
            columns = {a: [getattr(o, a) or 0 for o in others] for a in attrs if a != "count"}
            spans = [(o.start, o.end) for o in others]
            for t in [item.start] + [a for a, _ in spans if a > item.start]:
                active = [n for n, (a, b) in enumerate(spans) if a <= t <= b]
                for attr, column in columns.items():
                    value = sum(map(column.__getitem__, active))
                    if value > best[attr]:
                        best[attr] = value
                if "count" in best and len(active) > best["count"]:
                    best["count"] = len(active)
        return {a: best[a] + (1 if a == "count" else (getattr(item, a) or 0)) for a in attrs}

    def within(self, item: Item, bounds: tuple[tuple[str, float], ...]) -> bool:
        """Whether `peaks(item, ...)` stays within every (attribute, bound): the same sums, in the
        same order, stopping at the first start where one goes past its bound (a refused fit,
        most first-fit probes, then costs a fraction of the peaks)."""
        own = [1 if attr == "count" else (getattr(item, attr) or 0) for attr, _ in bounds]
        if any(0.0 + x > bound for x, (_, bound) in zip(own, bounds, strict=True)):
            return False  # peaks' sums start from 0.0
        others = self._overlapping(item)
        if not others:
            return True
        spans = [(o.start, o.end) for o in others]
        # an attribute's column is read when its bound is first checked: most refusals come on
        # memory at the item's start, before the other columns are needed
        columns: list[list[float] | None] = [None] * len(bounds)
        for t in [item.start] + [a for a, _ in spans if a > item.start]:
            active = [n for n, (a, b) in enumerate(spans) if a <= t <= b]
            for k, ((attr, bound), x) in enumerate(zip(bounds, own, strict=True)):
                if attr == "count":
                    value: float = len(active)
                else:
                    column = columns[k]
                    if column is None:
                        column = columns[k] = [getattr(o, attr) or 0 for o in others]
                    value = sum(map(column.__getitem__, active))
                if value + x > bound:
                    return False
        return True

    def max_sum(self, attr: str) -> float:
        """Largest sum of `attr` over time among the placed items (committed memory, interference)."""
        return max(
            (
                sum(getattr(o, attr) or 0 for o in self.items if o.start <= i.start <= o.end)
                for i in self.items
            ),
            default=0.0,
        )

    def concurrency(self) -> int:
        return int(
            max((sum(1 for o in self.items if o.start <= i.start <= o.end) for i in self.items), default=0)
        )


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


def fleet_from_recs(recs: pd.DataFrame) -> list[FleetGpu]:
    """The GPUs the jobs used, when no inventory is given (idle GPUs are then unknown)."""
    seen: dict[str, FleetGpu] = {}
    for row in frames.rows(recs):
        for uuid in _uuids(row.uuids):
            seen.setdefault(uuid, FleetGpu(uuid, str(row.gpu_model), str(getattr(row, "instance", "") or "")))
    return list(seen.values())


def _uuids(value: object) -> list[str]:
    return [u for u in str(value).split(",") if u and u != "nan"]


def _first_fit(profiles: Iterable[str | None]) -> list[tuple[str, int | None]]:
    """MIG placement requests, each at its first free start; a missing profile ("") cannot be placed."""
    return [(profile or "", None) for profile in profiles]


def _int_or_none(value: object) -> int | None:
    """Integer settings from a DataFrame column that may hold NaN/None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(cast(SupportsInt, value))  # a number (numpy's included) once NaN/None are out


def _num(value: object) -> float:
    """A float from a column that may hold None/NaN (as 0)."""
    if value is None:
        return 0.0
    number = float(value)  # type: ignore[arg-type]
    return 0.0 if math.isnan(number) else number


def lifetime(row: object, margin: float) -> tuple[float, float]:
    """When a job holds its GPU: from its first sample to one step after its last (`duration_s`
    counts that step), then `plan.lifetime_margin_s` more (teardown, and the next job's scheduling
    before its first sample): a job uses a GPU after another only when it starts at least that
    long after the other's last step."""
    start, end = float(row.start), float(row.end)  # type: ignore[attr-defined]
    end = max(end, start + _num(getattr(row, "duration_s", 0.0)))
    return start, end + margin


def _known_lifetime(row: object) -> bool:
    return math.isfinite(_num(getattr(row, "start", math.nan))) and math.isfinite(
        _num(getattr(row, "end", math.nan))
    )


def _unsized(row: object, margin: float) -> Item:
    """A job with too little data to size: a whole GPU of its model per GPU it has, over its lifetime
    only (before and after, the GPU is free for others; a job seen for minutes no longer holds a
    GPU for the whole window)."""
    start, end = lifetime(row, margin)
    gpus = max(1, int(_num(getattr(row, "gpus", 1)) or 1))
    return Item(
        job_id=str(row.job_id),  # type: ignore[attr-defined]
        kind=Kind.EXCLUSIVE.value,
        unsized=True,
        model=str(row.gpu_model),  # type: ignore[attr-defined]
        start=start,
        end=end,
        gpus=gpus,
        memory=_num(getattr(row, "device_memory_bytes", 0.0)),
        sm=1.0,
        load=1.0,
        used_hours=_num(getattr(row, "gpu_hours_used", 0.0)),
        source=str(getattr(row, "job_source", "") or ""),
        origin_model=str(row.gpu_model),  # type: ignore[attr-defined]
        origin_mode=str(getattr(row, "sharing", "") or ""),
        origin_uuids=tuple(_uuids(getattr(row, "uuids", ""))),
        device_memory=_num(getattr(row, "device_memory_bytes", 0.0)) or math.inf,
    )


def _items(recs: pd.DataFrame, th: Thresholds) -> list[Item]:
    items = []
    series = demand.of(recs) or demand.Demand(1.0)
    margin = float(th.plan.lifetime_margin_s)
    for row in frames.rows(recs):
        kind = row.recommendation
        if kind == Kind.INSUFFICIENT_DATA:
            items.append(_unsized(row, margin))  # `hold` kept those without a known lifetime
            continue
        if kind == Kind.RECLAIM:
            continue
        start, end = lifetime(row, margin)
        model = row.target_gpu_model if kind == Kind.DOWNSIZE else row.gpu_model
        whole = kind in WHOLE
        gpus = int(row.gpus) if whole else 1
        load = _num(row.gpu_hours_used) / (row.duration_s / 3600.0) / max(gpus, 1) if row.duration_s else 0.0
        known = model_for_nvml_name(str(row.gpu_model))
        scale = _num(row.device_sms) / known.sm_count if known and _num(row.device_sms) else 1.0
        memory = _num(row.memory_need_bytes)
        held = _num(getattr(row, "memory_peak_bytes", math.nan))
        if kind == Kind.TIME_SLICING and not math.isnan(held):
            # nothing enforces memory between time-sliced jobs: a server sized from its KV use
            # (whose advice lowers --gpu-memory-utilization) is packed at what it holds now, so the
            # GPU stays safe until, and unless, someone applies that advice
            memory = max(memory, memory_need(held, th))
        items.append(
            Item(
                job_id=row.job_id,
                kind=Kind.EXCLUSIVE.value if kind == Kind.DOWNSIZE else str(kind),
                model=str(model),
                start=start,
                end=end,
                gpus=gpus,
                memory=memory,
                sm=min(_num(row.sm_fraction), 1.0),
                load=0.0 if math.isnan(load) else float(load),
                used_hours=_num(row.gpu_hours_used),
                p95=min(1.0, _num(row.sm_active_p95) * scale),
                dram=min(1.0, _num(getattr(row, "dram_active_p95", 0.0)) * scale),
                source=str(getattr(row, "job_source", "") or ""),
                origin_model=str(row.gpu_model),
                origin_mode=str(row.sharing),
                origin_uuids=tuple(_uuids(row.uuids)),
                mig_profile=row.mig_profile if kind == Kind.MIG else None,
                mig_alternative=row.mig_alternative if isinstance(row.mig_alternative, str) else None,
                thread_pct=_int_or_none(row.mps_active_thread_percentage),
                memory_limit=_int_or_none(row.mps_pinned_memory_limit_bytes),
                device_memory=_num(row.device_memory_bytes) or math.inf,
                sm_series=_scaled(series.sm.get(str(row.job_id)), scale),
                dram_series=_scaled(series.dram.get(str(row.job_id)), scale),
                modes=modes.modes_of(row, th),
            )
        )
    return items


def _scaled(series: demand.Series | None, scale: float) -> demand.Series | None:
    return None if series is None else series.scaled(scale)


def _colocated(gpu: GpuBin, item: Item, figure: str) -> list[demand.Series] | None:
    """The `figure` ("sm" or "dram") series of `item` and of the jobs it would meet on `gpu`;
    None when one of them has none (its percentile then goes into the percentile sum). A job
    whose DRAM activity is not measured adds nothing to either sum."""
    out = []
    for job in [*gpu._overlapping(item), item]:
        found = job.sm_series if figure == "sm" else job.dram_series
        if found is None:
            if figure == "dram" and not job.dram:
                continue
            return None
        out.append(found)
    return out


def _series_within(series: list[demand.Series] | None, limit: float, th: Thresholds) -> bool:
    """Whether the co-located sum exceeds `limit` in at most `compute.max_bind_fraction` of each
    job's bins (True without series: the percentile sums decided)."""
    if series is None:
        return True
    return demand.colocated(series, limit).over_share <= th.compute.max_bind_fraction + 1e-12


def fits(gpu: GpuBin, item: Item, model: GpuModel | None, th: Thresholds) -> bool:
    """Whether `item` can join `gpu` (the fit tests of the module docstring)."""
    if gpu.mode != item.kind or gpu.model != item.model:
        return False
    memory_total = model.memory_bytes if model else item.device_memory
    if item.kind == Kind.EXCLUSIVE:
        return not gpu._overlapping(item)
    if item.kind == Kind.MIG:
        if model is None:
            return False
        try:
            place_mig_layout(model, _first_fit([*(o.mig_profile for o in gpu.items), item.mig_profile]))
        except CatalogError:
            return False
        return True
    # Slurm's MPS shares are configured per GPU, not per instant: every client's cap counts.
    # Checked before the peaks: on a fleet of MPS GPUs nearly every first-fit probe ends here,
    # and the peaks over time are the packer's costliest step.
    if item.kind == Kind.MPS and sum(o.thread_pct or 0 for o in gpu.items) + (item.thread_pct or 0) > 100:
        return False
    if item.kind != Kind.MPS:  # time-slicing: every limit a bound, the first excess refuses
        sm, dram = _colocated(gpu, item, "sm"), _colocated(gpu, item, "dram")
        return (
            gpu.within(item, _sliced_bounds(item, model, th, sm is not None, dram is not None))
            and _series_within(sm, th.time_slicing.max_interference, th)
            and _series_within(dram, th.plan.max_dram_load, th)
        )
    # one pass over the GPU's items for every limit of MPS (the packer's hottest call)
    peak = gpu.peaks(item, ("memory", "dram", "count", "sm"))
    if peak["memory"] > memory_total:
        return False
    clients = th.mps.max_clients or (model.mps_max_clients if model else 48)
    if peak["count"] > clients:
        return False
    dram = _colocated(gpu, item, "dram")
    if dram is None and peak["dram"] > th.plan.max_dram_load + 1e-9:
        return False
    sm = _colocated(gpu, item, "sm")
    if sm is None and peak["sm"] > th.mps.max_load + 1e-9:
        return False
    if not (_series_within(dram, th.plan.max_dram_load, th) and _series_within(sm, th.mps.max_load, th)):
        return False
    sharers = [*gpu._overlapping(item), item]
    if any(o.source == KUBERNETES for o in sharers):
        split = 100 // int(peak["count"])
        return all((o.thread_pct or 0) <= split for o in sharers)
    return True


def _sliced_bounds(
    item: Item, model: GpuModel | None, th: Thresholds, sm_series: bool, dram_series: bool
) -> tuple[tuple[str, float], ...]:
    """A time-sliced GPU's limits for `item`, in the order `GpuBin.within` checks them; the p95
    sums of SM demand and DRAM activity only where the co-located series do not decide."""
    bounds: list[tuple[str, float]] = [("memory", model.memory_bytes if model else item.device_memory)]
    if not dram_series:
        bounds.append(("dram", th.plan.max_dram_load + 1e-9))
    bounds += [("count", th.time_slicing.max_replicas), ("load", th.plan.max_gpu_load + 1e-9)]
    if not sm_series:
        bounds.append(("p95", th.time_slicing.max_interference + 1e-9))
    return tuple(bounds)


def _own(item: Item, bounds: tuple[tuple[str, float], ...]) -> list[float]:
    """`item`'s own part of each bounded sum (as `GpuBin.within` counts it)."""
    return [1 if attr == "count" else (getattr(item, attr) or 0) for attr, _ in bounds]


def _over(load: InstantLoad | None, item: Item, model: GpuModel | None, th: Thresholds) -> list[bool]:
    """The time-sliced GPUs that certainly refuse `item` at its start (none without an index)."""
    if load is None:
        return []
    # only the bounds every GPU holds it to: where it has series, a GPU whose jobs all have
    # theirs judges by the co-located sums, which an instant's percentile sum cannot rule out
    bounds = _sliced_bounds(
        item, model, th, item.sm_series is not None, item.dram_series is not None or not item.dram
    )
    return load.over(item.start, _own(item, bounds), bounds)


def _place(load: InstantLoad | None, slot: int, item: Item) -> None:
    if load is not None:
        load.add(slot, id(item), item.start, item.end, [getattr(item, c) or 0 for c in COLUMNS])


def _size(item: Item) -> float:
    model = model_for_nvml_name(item.model)
    return max(item.memory / (model.memory_bytes if model else item.device_memory), item.sm, item.load)


def _resident(item: Item) -> bool:
    """The job already runs this way, on this model: it has a GPU of the packing's kind now."""
    return item.kind == item.origin_mode and item.model == item.origin_model and bool(item.origin_uuids)


def _free_time(items: Iterable[Item]) -> FreeTime | None:
    """The interval index of an exclusive pool, or None when a job's times cannot be ordered (NaN:
    the plain scan then decides, as `fits` does)."""
    try:
        return FreeTime(t for i in items for t in (i.start, i.end))
    except ValueError:
        return None


def pack(items: list[Item], th: Thresholds, in_place: bool = False) -> list[GpuBin]:
    """First-fit decreasing among the GPUs an item can join at all (same mode and model).

    `in_place`: jobs that already run this way (`_resident`) are packed first and onto the GPU
    they share now (a GPU's residents stay together, never on another resident group's GPU);
    the others first-fit; then GPUs whose jobs all fit elsewhere are emptied (`_merge`). The
    same GPU count with fewer moves: no swap of two MIG slices between GPUs for nothing.

    Exclusive pools find their first free GPU through a `FreeTime` index (the same GPU the scan
    with `fits` picks: without it first fit is quadratic in the jobs, ~1 M fits calls for
    10,000 jobs); MPS pools call `fits` only on GPUs a `Capacity` tree says have room for the
    job's share; time-sliced and MIG pools scan with `fits`.
    """
    bins: list[GpuBin] = []
    counters: dict[str, int] = {}
    order = sorted(items, key=lambda i: (i.model, i.kind, -_size(i), i.start, i.job_id))
    if in_place:
        order.sort(key=lambda i: not (_resident(i) and i.gpus == 1))  # stable: residents first
    # each pool's GPUs in creation order: a GPU's position there is its slot (its bit in the
    # bitsets), and first fit goes by it
    created: dict[tuple[str, str], list[GpuBin]] = {}
    slot: dict[int, int] = {}  # id(bin) -> its position in `created`
    homes: dict[tuple[str, str], dict[str, int]] = {}  # pool -> GPU its residents run on now -> slots
    # id(bin) -> the MPS thread shares on it: an MPS GPU without room for a job's share is passed
    # over without calling fits, which refuses it first anyway (without this, first-fit over a
    # fleet of full MPS GPUs is quadratic in the jobs: 15 M fits calls for 10,000 jobs)
    shares: dict[int, int] = {}
    # the smallest MPS share per pool: a GPU without room for it is full and leaves the pool
    least_share: dict[tuple[str, str], int] = {}
    members: dict[tuple[str, str], list[Item]] = {}
    for item in order:
        members.setdefault((item.kind, item.model), []).append(item)
        if item.kind == Kind.MPS:
            key = (item.kind, item.model)
            least_share[key] = min(least_share.get(key, 100), item.thread_pct or 0)
    indexes = {key: _free_time(pool) for key, pool in members.items() if key[0] == Kind.EXCLUSIVE}
    # MPS pools: each GPU's room (100 - its shares; -1 once full) in a max tree over its slots
    rooms = {key: Capacity(sum(i.gpus for i in pool)) for key, pool in members.items() if key[0] == Kind.MPS}
    # time-sliced pools: what each GPU carries at an instant, to pass over the GPUs a job's start
    # already rules out (nearly every refused fit) without testing them one by one
    loads = {
        key: InstantLoad(sum(i.gpus for i in pool))
        for key, pool in members.items()
        if key[0] == Kind.TIME_SLICING
    }
    for item in order:
        model = model_for_nvml_name(item.model)
        key = (item.kind, item.model)
        made = created.setdefault(key, [])
        pool_homes = homes.setdefault(key, {})
        resident = in_place and _resident(item) and item.gpus == 1
        allowed = (1 << len(made)) - 1
        if resident:  # only the GPUs its fellow residents run on (never another resident group's)
            allowed = 0
            for uuid in item.origin_uuids:
                allowed |= pool_homes.get(uuid, 0)
        index = indexes.get(key)
        chosen: list[GpuBin] = []
        if index is not None:
            for free in index.free(item.start, item.end, allowed):
                if len(chosen) == item.gpus:
                    break
                chosen.append(made[free])
        elif key in rooms:  # MPS: only the GPUs with room for its share, lowest first
            share, at = item.thread_pct or 0, 0
            while len(chosen) < item.gpus and (found := rooms[key].first(share, at)) is not None:
                at = found + 1
                if allowed >> found & 1 and fits(made[found], item, model, th):
                    chosen.append(made[found])
        else:
            candidates = made
            if resident:
                candidates = [g for g in made if allowed >> slot[id(g)] & 1]
            over = _over(loads.get(key), item, model, th) if candidates else []
            for gpu in candidates:
                if len(chosen) == item.gpus:
                    break
                n = slot[id(gpu)]
                if not (n < len(over) and over[n]) and fits(gpu, item, model, th):
                    chosen.append(gpu)
        while len(chosen) < item.gpus:
            counters[item.model] = counters.get(item.model, 0) + 1
            gpu = GpuBin(name=f"{item.model}#{counters[item.model]}", model=item.model, mode=item.kind)
            bins.append(gpu)
            slot[id(gpu)] = len(made)
            made.append(gpu)
            chosen.append(gpu)
        for gpu in chosen:
            gpu.items.append(item)
            if index is not None:
                index.add(slot[id(gpu)], item.start, item.end)
            _place(loads.get(key), slot[id(gpu)], item)
            shares[id(gpu)] = shares.get(id(gpu), 0) + (item.thread_pct or 0)
            if item.kind == Kind.MPS:
                # full: no later item of this pool fits (fits refuses it first), so it has no room
                # (a list.remove here compared GPUs field by field: 2 M comparisons at 50,000 jobs)
                full = shares[id(gpu)] + least_share[key] > 100
                rooms[key].set(slot[id(gpu)], -1 if full else 100 - shares[id(gpu)])
            if resident:
                for uuid in item.origin_uuids:
                    pool_homes[uuid] = pool_homes.get(uuid, 0) | 1 << slot[id(gpu)]
    return _merge(bins, th) if in_place else bins


def _merge(bins: list[GpuBin], th: Thresholds) -> list[GpuBin]:
    """Empty the GPUs (fewest jobs first) whose every job fits on another GPU of its mode and model.

    Exclusive GPUs are found through a `FreeTime` index and MPS GPUs with room for a share
    through a `Capacity` tree, as in `pack`; time-sliced and MIG GPUs are scanned."""
    shares = {id(b): sum(i.thread_pct or 0 for i in b.items) for b in bins}  # as in pack
    groups: dict[tuple[str, str], list[GpuBin]] = {}
    for b in bins:
        groups.setdefault((b.mode, b.model), []).append(b)
    slot = {id(b): n for group in groups.values() for n, b in enumerate(group)}
    alive = {key: (1 << len(group)) - 1 for key, group in groups.items()}  # the group's kept GPUs
    indexes: dict[tuple[str, str], FreeTime | None] = {}
    rooms: dict[tuple[str, str], Capacity] = {}  # MPS groups: each GPU's room for shares, as in pack
    loads: dict[tuple[str, str], InstantLoad] = {}  # time-sliced groups, as in pack
    for key, group in groups.items():
        if key[0] == Kind.TIME_SLICING:
            loads[key] = InstantLoad(sum(len(b.items) for b in group))
            for b in group:
                for i in b.items:
                    _place(loads[key], slot[id(b)], i)
        if key[0] == Kind.MPS:
            rooms[key] = Capacity(len(group))
            for b in group:
                rooms[key].set(slot[id(b)], 100 - shares[id(b)])
        if key[0] == Kind.EXCLUSIVE:
            built = indexes[key] = _free_time(i for b in group for i in b.items)
            if built is not None:
                for b in group:
                    for i in b.items:
                        built.add(slot[id(b)], i.start, i.end)
    for gpu in sorted(bins, key=lambda b: (len(b.items), b.name)):
        model = model_for_nvml_name(gpu.model)
        key = (gpu.mode, gpu.model)
        group, index = groups[key], indexes.get(key)
        others_mask = alive[key] & ~(1 << slot[id(gpu)])
        if not others_mask or any(i.gpus != 1 for i in gpu.items):
            continue
        placed: list[tuple[GpuBin, Item]] = []
        for item in gpu.items:
            share = item.thread_pct or 0
            mps = item.kind == Kind.MPS  # MPS GPUs without room for its share are passed over
            if index is not None:
                free = next(index.free(item.start, item.end, others_mask), None)
                target = None if free is None else group[free]
            elif key in rooms:
                target, at = None, 0
                while (found := rooms[key].first(share, at)) is not None:
                    at = found + 1
                    if others_mask >> found & 1 and fits(group[found], item, model, th):
                        target = group[found]
                        break
            else:
                over = _over(loads.get(key), item, model, th)
                target = next(
                    (
                        group[n]
                        for n in set_bits(others_mask)
                        if not (n < len(over) and over[n])
                        and not (mps and shares[id(group[n])] + share > 100)
                        and fits(group[n], item, model, th)
                    ),
                    None,
                )
            if target is None:
                break
            target.items.append(item)
            if index is not None:
                index.add(slot[id(target)], item.start, item.end)
            _place(loads.get(key), slot[id(target)], item)
            shares[id(target)] += share
            if key in rooms:
                rooms[key].set(slot[id(target)], 100 - shares[id(target)])
            placed.append((target, item))
        if len(placed) == len(gpu.items):
            alive[key] &= ~(1 << slot[id(gpu)])
            if key in rooms:
                rooms[key].set(slot[id(gpu)], -1)
        else:
            for target, item in placed:
                target.items.remove(item)
                if index is not None:
                    index.remove(slot[id(target)], item.start, item.end)
                if key in loads:
                    loads[key].remove(slot[id(target)], id(item))
                shares[id(target)] -= item.thread_pct or 0
                if key in rooms:
                    rooms[key].set(slot[id(target)], 100 - shares[id(target)])
    return [b for b in bins if alive[(b.mode, b.model)] >> slot[id(b)] & 1]


def _as_mps(item: Item, th: Thresholds) -> Item:
    settings = mps_settings(item.sm, item.memory, th)
    return replace(
        item,
        kind=Kind.MPS.value,
        thread_pct=settings.thread_percentage,
        memory_limit=settings.pinned_memory_limit_bytes,
    )


def _take_partner(gpu: GpuBin, bins: list[GpuBin], th: Thresholds) -> bool:
    """A lone sharer takes a job from the fullest GPU of its mode and model that keeps two; never
    a job that already runs that way (taking a partner saves no GPU: it must not move a resident)."""
    model = model_for_nvml_name(gpu.model)
    donors = [
        b for b in bins if b is not gpu and b.mode == gpu.mode and b.model == gpu.model and len(b.items) > 2
    ]
    for donor in sorted(donors, key=lambda b: -len(b.items)):
        for item in sorted(donor.items, key=_size):
            if not _resident(item) and fits(gpu, item, model, th):
                donor.items.remove(item)
                gpu.items.append(item)
                return True
    return False


def _join_other(gpu: GpuBin, bins: list[GpuBin], removed: set[int], th: Thresholds) -> dict[str, Any] | None:
    """A lone sharer joins another GPU of its model in another mode; returns its new settings."""
    item = gpu.items[0]
    model = model_for_nvml_name(gpu.model)
    if model is None:
        return None
    for other in bins:
        if other is gpu or id(other) in removed or other.model != gpu.model or len(other.items) < 1:
            continue
        if other.mode == Kind.MIG and item.kind == Kind.MPS and item.mig_alternative:
            wanted = _first_fit([*(o.mig_profile for o in other.items), item.mig_alternative])
            try:
                place_mig_layout(model, wanted)
            except CatalogError:
                continue
            item.kind, item.mig_profile = Kind.MIG.value, item.mig_alternative
            other.items.append(item)
            return {"recommendation": Kind.MIG.value, "mig_profile": item.mig_alternative}
        if other.mode in SHARED and other.mode != item.kind and len(other.items) > 1:
            candidate = _as_mps(item, th) if other.mode == Kind.MPS else replace(item, kind=other.mode)
            if not fits(other, candidate, model, th):
                continue
            item.kind, item.thread_pct, item.memory_limit = (
                candidate.kind,
                candidate.thread_pct,
                candidate.memory_limit,
            )
            other.items.append(item)
            change: dict[str, Any] = {"recommendation": other.mode}
            if other.mode == Kind.MPS:
                change.update(
                    mps_active_thread_percentage=item.thread_pct,
                    mps_pinned_memory_limit_bytes=item.memory_limit,
                )
            return change
    return None


def settle_lone_sharers(bins: list[GpuBin], th: Thresholds) -> tuple[list[GpuBin], dict[str, dict[str, Any]]]:
    """No GPU is shared (MPS, time-slicing, MIG) by a single job: it joins another GPU (one GPU
    fewer), takes a partner that does not run that way already, or stays whole (a job already on
    a MIG slice keeps its slice)."""
    moved: dict[str, dict[str, Any]] = {}
    removed: set[int] = set()
    for gpu in bins:
        if (gpu.mode not in SHARED and gpu.mode != Kind.MIG) or len(gpu.items) != 1 or id(gpu) in removed:
            continue
        change = _join_other(gpu, bins, removed, th) if gpu.mode in SHARED else None
        if change is not None:
            removed.add(id(gpu))
            moved[gpu.items[0].job_id] = change
            continue
        if _take_partner(gpu, bins, th):
            continue
        item = gpu.items[0]
        if gpu.mode == Kind.MIG and item.origin_mode == Kind.MIG:
            continue  # already on a slice: it keeps one (the GPU's other slices stay free)
        item.kind, item.thread_pct, item.memory_limit = Kind.EXCLUSIVE.value, None, None
        gpu.mode = Kind.EXCLUSIVE.value
        moved[item.job_id] = {
            "recommendation": Kind.EXCLUSIVE.value,
            "note": "no other job fits beside it and a GPU shared by one job saves nothing: "
            "it keeps a whole GPU",
        }
    return [b for b in bins if id(b) not in removed], moved


def _moves(bins: list[GpuBin]) -> int:
    """Jobs a packing takes off the GPU they run on now (each GPU lands where most of its jobs
    are) or runs in another mode than the one recommended (it restarts as well)."""
    out = 0
    for gpu in bins:
        votes = Counter(u for i in gpu.items for u in i.origin_uuids)
        home = votes.most_common(1)[0][0] if votes else ""
        out += sum(1 for i in gpu.items if home not in i.origin_uuids or _mode_changed(i))
    return out


def _mode_of(item: Item) -> Mode:
    """The mode `item` is packed in, with that mode's settings."""
    kind = Kind(item.kind)
    if kind == Kind.MIG:
        return Mode(kind, mig_profile=item.mig_profile)
    if kind == Kind.MPS:
        return Mode(kind, thread_pct=item.thread_pct, memory_limit=item.memory_limit)
    return Mode(kind)


def _mode_changed(item: Item) -> bool:
    return bool(item.modes) and _mode_of(item) != item.modes[0]


def _as_mode(item: Item, mode: Mode) -> Item:
    """A copy of `item` packed in `mode` (a slice it leaves stays its way back as a lone sharer)."""
    own = item.modes[0] if item.modes else None
    return replace(
        item,
        kind=mode.kind.value,
        mig_profile=mode.mig_profile,
        thread_pct=mode.thread_pct,
        memory_limit=mode.memory_limit,
        mig_alternative=own.mig_profile if own is not None and own.kind == Kind.MIG else item.mig_alternative,
    )


def _gpu_fraction(item: Item, model: GpuModel | None) -> float:
    """The share of one GPU `item` occupies in its mode, as recommend.py's `gpu_fraction` counts
    it: MPS its memory or thread cap, MIG its slice's memory or compute slices, time-slicing its
    memory, else the whole GPU."""
    total = model.memory_bytes if model else item.device_memory
    memory = min(1.0, item.memory / total) if total else 1.0
    if item.kind == Kind.MPS:
        return max(memory, (item.thread_pct or 100) / 100)
    if item.kind == Kind.MIG and model is not None and item.mig_profile:
        profile = model.mig_profile(item.mig_profile)
        return max(profile.compute_slices / model.compute_slices, profile.memory_slices / model.memory_slices)
    if item.kind == Kind.TIME_SLICING:
        return memory
    return 1.0


def _footprint(item: Item, model: GpuModel | None, th: Thresholds) -> float:
    """`_gpu_fraction`, and for time-slicing also its replica and mean-load shares: the order of
    the joint first fit, and the mode in which a job that fits no GPU opens one."""
    if item.kind == Kind.TIME_SLICING:
        replicas = 1 / max(th.time_slicing.max_replicas, 1)
        return max(_gpu_fraction(item, model), replicas, item.load / max(th.plan.max_gpu_load, 1e-9))
    return _gpu_fraction(item, model)


# jobs of one model up to which the joint first fit (every mode of every job against every GPU,
# with `fits` alone: quadratic) runs; above it only the one-mode-for-all packings are tried
JOINT_MAX_ITEMS = 400


def pack_joint(items: list[Item], th: Thresholds) -> list[GpuBin]:
    """First-fit decreasing that chooses each job's mode as it goes: a job joins the first GPU
    that one of its modes fits (`fits`: the same safety line as `pack`), else opens a GPU in the
    mode where it takes least of one. Whole-GPU jobs are packed by `pack`."""
    whole = [i for i in items if i.kind in WHOLE or i.kind == Kind.EXCLUSIVE or i.gpus != 1]
    shared = [i for i in items if not (i.kind in WHOLE or i.kind == Kind.EXCLUSIVE or i.gpus != 1)]
    bins = pack(whole, th)
    counters = Counter(b.model for b in bins)
    opened: dict[str, list[GpuBin]] = {}
    variants = {id(i): [_as_mode(i, m) for m in i.modes] or [i] for i in shared}  # the recommended mode first
    catalog = {i.model: model_for_nvml_name(i.model) for i in shared}

    def smallest(item: Item) -> float:
        return min(_footprint(v, catalog[item.model], th) for v in variants[id(item)])

    for item in sorted(shared, key=lambda i: (i.model, -smallest(i), i.start, i.job_id)):
        model, mine = catalog[item.model], variants[id(item)]
        target = next(
            (
                (gpu, v)
                for gpu in opened.get(item.model, [])
                for v in mine
                if gpu.mode == v.kind and fits(gpu, v, model, th)
            ),
            None,
        )
        if target is None:
            v = min(mine, key=lambda v: _footprint(v, model, th))  # the first on a tie
            counters[item.model] += 1
            gpu = GpuBin(name=f"{item.model}#{counters[item.model]}", model=item.model, mode=v.kind)
            opened.setdefault(item.model, []).append(gpu)
            bins.append(gpu)
            target = (gpu, v)
        target[0].items.append(target[1])
    return bins


def _joint_changes(bins: list[GpuBin], baseline: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The new settings of every job a joint packing runs in another mode than recommended, with
    the GPU counts that justify it."""
    count = Counter(b.model for b in bins)
    out: dict[str, dict[str, Any]] = {}
    for gpu in bins:
        model = model_for_nvml_name(gpu.model)
        for item in gpu.items:
            if not _mode_changed(item) or item.kind not in (Kind.MPS, Kind.MIG, Kind.TIME_SLICING):
                continue
            own, now = item.modes[0], _mode_of(item)
            change: dict[str, Any] = {"recommendation": now.kind.value}
            if now.kind == Kind.MPS:
                change.update(
                    mps_active_thread_percentage=now.thread_pct,
                    mps_pinned_memory_limit_bytes=now.memory_limit,
                    mig_alternative=own.mig_profile or item.mig_alternative,
                )
            if now.kind == Kind.MIG:
                change["mig_profile"] = now.mig_profile
            change["gpu_fraction"] = _gpu_fraction(item, model)
            change["note"] = (
                f"modes chosen jointly: as {_describe(now)} instead of {_describe(own)}, the "
                f"{gpu.model} jobs fit {count[gpu.model]} GPU(s), {baseline.get(gpu.model, 0)} "
                "with each job's recommended mode"
            )
            out[item.job_id] = change
    return out


def _describe(mode: Mode) -> str:
    if mode.kind == Kind.MPS:
        limit = f", {mode.memory_limit / 1024**3:.1f} GiB pinned limit" if mode.memory_limit else ""
        return f"MPS ({mode.thread_pct} % threads{limit})"
    if mode.kind == Kind.MIG:
        return f"MIG {mode.mig_profile}"
    return mode.kind.value


# jobs from which the packing from scratch runs in a forked child beside the one in place
# (`forked`: ~0.5 s of a 10,000-job plan on the second core; a fork costs ~10 ms)
FORK_MIN_ITEMS = 2_000


Packing = tuple[list[GpuBin], dict[str, dict[str, Any]]]


def _packing(items: list[Item], th: Thresholds, in_place: bool) -> Packing:
    """`pack` on copies of the items, lone sharers settled."""
    return settle_lone_sharers(pack([replace(i) for i in items], th, in_place=in_place), th)


def _fewest_moves(
    items: list[Item], th: Thresholds, ceiling: dict[str, int] | None = None
) -> tuple[list[GpuBin], dict[str, dict[str, Any]]]:
    """Pack twice (first-fit decreasing, and in place) on copies of the items, each job in its
    recommended mode, then where it may pay, with the modes chosen jointly (`_joint_packings`;
    `ceiling`: per model, the GPUs a packing must need fewer of to be used at all), and keep, per
    GPU model, the packing with the fewest GPUs, then the fewest jobs moved (in place on a tie):
    a layout that frees nothing more never moves a job, and one model's gain never costs another
    model needless moves."""
    with forked.start(lambda: _packing(items, th, False), fork=len(items) >= FORK_MIN_ITEMS) as scratch:
        in_place = _packing(items, th, True)
        from_scratch = scratch.result()
    packings = [in_place, from_scratch]
    packings += _joint_packings(items, packings, th, ceiling or {})
    return best_per_model(packings, {i.job_id: i.model for i in items})


def _span(item: Item) -> modes.Span:
    return modes.Span(item.start, item.end, item.modes or (_mode_of(item),), item.memory)


def _joint_packings(
    items: list[Item], done: list[Packing], th: Thresholds, ceiling: dict[str, int]
) -> list[Packing]:
    """Packings of the models where another choice of the jobs' modes could need fewer GPUs:
    their lower bound (`modes.lower_bound`) below both the fewest GPUs the packings `done` need
    and the model's `ceiling`. Each such model is packed with every job that has an MPS mode in
    it, then with every job that has a MIG slice on one (both from scratch and in place), and
    while it has at most `JOINT_MAX_ITEMS` jobs, with each job's mode chosen as it is placed
    (`pack_joint`). The fit tests judge every placement, so each packing is as safe as `pack`'s;
    `best_per_model` keeps a joint packing only for fewer GPUs (or as many with fewer moves)."""
    fewest: dict[str, int] = {}
    for bins, _ in done:
        for model, n in Counter(b.model for b in bins).items():
            fewest[model] = min(fewest.get(model, n), n)
    by_model: dict[str, list[Item]] = {}
    for item in items:
        by_model.setdefault(item.model, []).append(item)
    models = {
        model
        for model, mine in by_model.items()
        if any(i.modes for i in mine)
        and modes.lower_bound(model, map(_span, mine))
        < min(fewest.get(model, 0), ceiling.get(model, math.inf))
    }
    if not models:
        return []
    pool = [i for i in items if i.model in models]
    out: list[Packing] = []
    for kind in (Kind.MPS, Kind.MIG):
        chosen = [_choose(i, kind) for i in pool]
        if all(c is i for c, i in zip(chosen, pool, strict=True)):
            continue
        for in_place in (True, False):
            bins, moved = _packing(chosen, th, in_place)
            out.append((bins, {**_joint_changes(bins, fewest), **moved}))
    small = [i for i in pool if len(by_model[i.model]) <= JOINT_MAX_ITEMS]
    if small:
        bins, moved = settle_lone_sharers(pack_joint([replace(i) for i in small], th), th)
        out.append((bins, {**_joint_changes(bins, fewest), **moved}))
    return out


def _choose(item: Item, kind: Kind) -> Item:
    """`item` in its mode of `kind` when it has one, else as recommended (the item itself)."""
    if not item.modes or item.modes[0].kind == kind:
        return item
    mode = next((m for m in item.modes if m.kind == kind), None)
    return item if mode is None else _as_mode(item, mode)


def best_per_model(
    packings: list[tuple[list[GpuBin], dict[str, dict[str, Any]]]], model_of: dict[str, str]
) -> tuple[list[GpuBin], dict[str, dict[str, Any]]]:
    """Per GPU model, the bins and lone-sharer changes of the packing with the fewest GPUs of that
    model, then the fewest jobs moved there; the first packing on a tie.

    Why per model: neither step crosses models (an item packs only onto GPUs of its own model,
    lone sharers settle among them), so each model's part of a packing is a whole plan for that
    model, and the best part of each is never worse than the best whole packing: a model that
    frees a GPU only from scratch no longer makes another model's jobs move for nothing.
    `model_of`: job id -> the model it is packed on (the same in every packing)."""
    best: dict[str, tuple[int, int, int]] = {}  # model -> (GPUs, moves, packing): the least wins
    for n, (bins, _) in enumerate(packings):
        per_model: dict[str, list[GpuBin]] = {}
        for gpu in bins:
            per_model.setdefault(gpu.model, []).append(gpu)
        for model, group in per_model.items():
            score = (len(group), _moves(group), n)
            best[model] = min(best.get(model, score), score)
    chosen = {model: score[2] for model, score in best.items()}
    if len(set(chosen.values())) <= 1:  # one packing wins everywhere: it is the plan as it is
        return packings[next(iter(chosen.values()), 0)]
    bins = [gpu for n, (packed, _) in enumerate(packings) for gpu in packed if chosen[gpu.model] == n]
    moved = {
        job: change
        for n, (_, changes) in enumerate(packings)
        for job, change in changes.items()
        if chosen.get(model_of.get(job, ""), n) == n
    }
    return bins, moved


def hold(recs: pd.DataFrame) -> tuple[pd.DataFrame, list[GpuBin]]:
    """Step 1: GPUs with a job we cannot size and whose lifetime is unknown stay as they are;
    returns the movable rows and them. A job we cannot size but know the lifetime of is packed
    as a whole GPU over that lifetime (`_unsized`)."""
    insufficient = recs[recs["recommendation"] == Kind.INSUFFICIENT_DATA]
    timeless = [not _known_lifetime(row) for row in frames.rows(insufficient)]
    unknown = insufficient[pd.Series(timeless, index=insufficient.index, dtype=bool)]
    held = {u for uuids in unknown["uuids"] for u in _uuids(uuids)}
    on_held = recs["uuids"].map(lambda v: bool(held & set(_uuids(v))))
    pinned = recs[on_held & (recs["recommendation"] != Kind.RECLAIM)]
    return recs[~on_held], _kept_as_they_are(pinned)


def held_changes(recs: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Jobs on held GPUs that could have been sized: they stay as they run now."""
    movable, _ = hold(recs)
    stay = recs[~recs["job_id"].isin(movable["job_id"])]
    stay = stay[~stay["recommendation"].isin([Kind.RECLAIM, Kind.INSUFFICIENT_DATA])]
    return {
        str(row.job_id): {**_as_now(row), "note": "shares a GPU with a job that has too little data"}
        for row in frames.rows(stay)
    }


def _kept_as_they_are(recs: pd.DataFrame) -> list[GpuBin]:
    """One unchanged GPU per uuid the jobs use now, with those jobs."""
    bins: dict[str, GpuBin] = {}
    for row in frames.rows(recs):
        for uuid in _uuids(row.uuids):
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
                    _num(row.gpu_hours_used) / max(1, len(_uuids(row.uuids))),
                    origin_model=str(row.gpu_model),
                    origin_uuids=tuple(_uuids(row.uuids)),
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
    return change


def account(
    movable: pd.DataFrame, held: list[GpuBin], fleet: list[FleetGpu], th: Thresholds
) -> tuple[list[GpuBin], dict[str, dict[str, Any]], list[str]]:
    """Steps 2-3: pack, settle lone sharers and keep every model within the fleet's count."""
    capacity = _capacity(fleet)
    for gpu in held:
        capacity[gpu.model] = capacity.get(gpu.model, 0) - 1
    items = _items(movable, th)
    notes: list[str] = []
    kept_models: set[str] = set()
    why: dict[str, str] = {}  # kept model -> why its jobs stay, when packing it gains nothing
    reverted: dict[str, dict[str, Any]] = {}
    while True:
        packed = [i for i in items if i.model not in kept_models]
        bins, moved = _fewest_moves(packed, th, _ceiling(packed, capacity))
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


def _assign_gpus(
    bins: list[GpuBin],
    fleet: list[FleetGpu],
    topology: Topology | None = None,
    mix: dict[int, float] | None = None,
) -> None:
    """Step 4a: every bin onto a real GPU of its model, the one its residents or else its largest
    job use when free; on Kubernetes a node's GPUs keep one sharing family where the fleet has room.
    Between otherwise equal free GPUs, the one whose node's fragmentation for the task `mix` grows
    least (FGD: a GPU of an already broken node before one of a node whole jobs could still use)."""
    free: dict[str, list[FleetGpu]] = {}
    by_uuid = {g.uuid: g for g in fleet}
    for card in fleet:
        free.setdefault(card.model, []).append(card)
    taken: set[str] = set()
    for gpu in bins:  # held and kept GPUs keep their own uuid
        if gpu.original_uuid:
            taken.add(gpu.original_uuid)
    mix = mix or {1: 1.0}
    left = Counter(g.node for g in fleet if g.uuid not in taken)  # node -> its GPUs no bin has yet
    cost = {n: fragmentation.cost_of_taking(f, mix) for n, f in left.items()}  # kept per pick
    node_family: dict[str, str] = {}  # Kubernetes node -> the one sharing family it gets
    ordered = sorted(bins, key=lambda b: -max((i.used_hours for i in b.items), default=0.0))
    for gpu in ordered:
        if gpu.original_uuid:
            gpu.node = by_uuid[gpu.original_uuid].node if gpu.original_uuid in by_uuid else ""
            continue
        family = gpu.mode if gpu.mode in SHARED else "whole"
        kubernetes = any(i.source == KUBERNETES for i in gpu.items)

        def same_family(uuid: str, family: str = family, kubernetes: bool = kubernetes) -> bool:
            # the device plugin shares every full GPU of a node one way (its `devices` subsets
            # are ignored): MPS, time-sliced and whole GPUs go to separate Kubernetes nodes
            node = by_uuid[uuid].node if uuid in by_uuid else ""
            return not kubernetes or node_family.get(node, family) == family

        # the GPU its residents (jobs that already run this way) share now, else its largest job's
        ranked = sorted(gpu.items, key=lambda i: (not _resident(i), -i.used_hours))
        wanted = [u for i in ranked for u in i.origin_uuids]
        pick = next(
            (
                u
                for u in wanted
                if u not in taken
                and by_uuid.get(u, FleetGpu("", "", "")).model == gpu.model
                and same_family(u)
            ),
            None,
        )
        if pick is None:
            nodes = {by_uuid[u].node for u in wanted if u in by_uuid}
            pool = [g for g in free.get(gpu.model, []) if g.uuid not in taken]
            pool.sort(
                key=lambda g: (not same_family(g.uuid), g.node not in nodes, cost[g.node], g.node, g.uuid)
            )
            pick = pool[0].uuid if pool else None
        if pick is not None:
            taken.add(pick)
            gpu.original_uuid, gpu.node = pick, by_uuid[pick].node
            left[gpu.node] -= 1
            cost[gpu.node] = fragmentation.cost_of_taking(left[gpu.node], mix)
            if kubernetes:
                node_family.setdefault(gpu.node, family)
    if topology is not None and topology.nodes:
        _keep_local(bins, by_uuid, topology, node_family)


def _keep_local(
    bins: list[GpuBin], by_uuid: dict[str, FleetGpu], topology: Topology, node_family: dict[str, str]
) -> None:
    """Step 4b: a multi-GPU job the plan moves gets the most local GPUs it can (best worst link:
    one NVLink domain, else one PCIe switch, else one NUMA node), among the GPUs it was given and
    those no bin uses, of its model (on Kubernetes, on nodes that keep whole GPUs). A job that
    stays where it runs is left alone: moving it is the topology finding's advice, not the plan's."""
    used = {b.original_uuid for b in bins if b.original_uuid}
    groups: dict[str, list[GpuBin]] = {}
    for gpu in bins:
        for item in gpu.items:
            if item.gpus > 1 and gpu.mode != UNCHANGED:
                groups.setdefault(item.job_id, []).append(gpu)
    for job, members in groups.items():
        item = next(i for i in members[0].items if i.job_id == job)
        placed = [b.original_uuid for b in members]
        if len(members) != item.gpus or not all(placed) or set(placed) <= set(item.origin_uuids):
            continue
        if any(len(b.items) != 1 for b in members):  # a GPU it shares over time with another job
            continue
        kubernetes = item.source == KUBERNETES
        best: tuple[tuple[Tier, int, int, str], tuple[str, ...]] | None = None
        for topo in topology.nodes:
            pool = [
                u
                for u in topo.index
                if u in by_uuid
                and by_uuid[u].model == members[0].model
                and (u not in used or u in placed)
                and (not kubernetes or node_family.get(by_uuid[u].node, "whole") == "whole")
            ]

            def cost(
                chosen: tuple[str, ...], placed: list[str] = placed, item: Item = item
            ) -> tuple[int, int]:
                return (-len(set(chosen) & set(item.origin_uuids)), -len(set(chosen) & set(placed)))

            chosen = best_set(topo, pool, item.gpus, cost)
            if chosen is not None:
                key = (topo.worst(chosen)[0], *cost(chosen), topo.node)
                if best is None or key < best[0]:
                    best = (key, chosen)
        now = topology.of(placed)
        tier_now = now.worst(placed)[0] if now is not None else Tier.UNKNOWN
        if best is None or best[0][0] >= tier_now:
            continue
        target = set(best[1])
        stay = [b for b in members if b.original_uuid in target]
        leave = [b for b in members if b.original_uuid not in target]
        fresh = sorted(target - {b.original_uuid for b in stay})
        for gpu, uuid in zip(leave, fresh, strict=True):
            used.discard(gpu.original_uuid)
            used.add(uuid)
            gpu.original_uuid, gpu.node = uuid, by_uuid[uuid].node


def _mig_layouts(bins: list[GpuBin]) -> None:
    for gpu in bins:
        if gpu.mode != Kind.MIG:
            continue
        model = model_for_nvml_name(gpu.model)
        assert model is not None
        placements = place_mig_layout(model, _first_fit(i.mig_profile for i in gpu.items))
        gpu.mig_layout = [
            {"profile": p.profile.name, "start": p.start, "job_id": i.job_id}
            for p, i in zip(placements, gpu.items, strict=True)
        ]


def _node_groups(bins: list[GpuBin], th: Thresholds) -> dict[str, dict[str, Any]]:
    """Group GPUs into nodes per (model, sharing family): device-plugin sharing is per node."""
    per_node = th.plan.gpus_per_node
    families: dict[tuple[str, str], list[GpuBin]] = {}
    for gpu in bins:
        family = gpu.mode if gpu.mode in SHARED else "whole"
        families.setdefault((gpu.model, family), []).append(gpu)
    groups: dict[str, dict[str, Any]] = {}
    for (model, family), members in sorted(families.items()):
        for n, start in enumerate(range(0, len(members), per_node), start=1):
            name = f"{model.lower()}-{family}-{n}"
            chunk = members[start : start + per_node]
            for index, gpu in enumerate(chunk):
                gpu.node_group = name
                gpu.name = f"{name}/gpu{index}"
            groups[name] = {"model": model, "sharing": family, "gpus": [g.name for g in chunk]}
    return groups


def percentile_name(quantile: float) -> str:
    """0.95 -> "p95", 0.99 -> "p99", 1.0 -> "max" (as `sizing_percentile` names them)."""
    return "max" if quantile >= 1.0 else f"p{quantile * 100:g}"


def interference(gpu: GpuBin, th: Thresholds) -> dict[str, float | str]:
    """How the co-located jobs of a shared GPU load it together, and a level.

    Always the largest sum over time of their p95 SM demand and p95 DRAM activity (`*_p95_sum`).
    Where every job has its series (`demand`), what decides: the co-located sum per bin at the
    sizing percentile `1 - compute.max_bind_fraction` (`sm_sum_high`, `dram_sum_high`, named by
    `percentile`) and the largest share of a job's bins where it exceeds the GPU's limit
    (`sm_over_share`: over `mps.max_load` or `time_slicing.max_interference`; `dram_over_share`:
    over `plan.max_dram_load`). The level is "high" when a sum goes past its limit more often than
    `compute.max_bind_fraction` allows (or, by percentiles, when the p95 sums exceed 1)."""
    sm_p95, dram_p95 = gpu.max_sum("p95"), gpu.max_sum("dram")
    out: dict[str, float | str] = {"sm_p95_sum": round(sm_p95, 3), "dram_p95_sum": round(dram_p95, 3)}
    sm_series = [i.sm_series for i in gpu.items]
    dram_series = [i.dram_series for i in gpu.items if i.dram_series is not None or i.dram]
    if not gpu.items or any(s is None for s in sm_series) or any(s is None for s in dram_series):
        worst = max(sm_p95, dram_p95)
        out["basis"] = "sum of p95s"
        out["risk"] = "high" if worst > 1.0 else "medium" if worst > 0.7 else "low"
        return out
    quantile = 1.0 - th.compute.max_bind_fraction
    sm_limit = th.mps.max_load if gpu.mode == Kind.MPS else th.time_slicing.max_interference
    sm = demand.colocated([s for s in sm_series if s is not None], sm_limit, quantile)
    dram = demand.colocated([s for s in dram_series if s is not None], th.plan.max_dram_load, quantile)
    over = max(sm.over_share, dram.over_share) > th.compute.max_bind_fraction + 1e-12
    out.update(
        basis="co-located series",
        percentile=percentile_name(quantile),
        sm_sum_high=round(sm.high, 3),
        sm_over_share=round(sm.over_share, 4),
        dram_sum_high=round(dram.high, 3),
        dram_over_share=round(dram.over_share, 4),
        risk="high" if over else "medium" if max(sm.high, dram.high) > 0.7 else "low",
    )
    return out


def _entry(gpu: GpuBin, window_hours: float, th: Thresholds) -> dict[str, Any]:
    used_hours = sum(i.used_hours / max(i.gpus, 1) for i in gpu.items)
    entry: dict[str, Any] = {
        "gpu": gpu.name,
        "model": gpu.model,
        "node_group": gpu.node_group,
        "node": gpu.node,
        "sharing": gpu.mode,
        "jobs": [i.job_id for i in gpu.items],
        "projected_utilization": round(used_hours / window_hours, 4),
        "memory_committed_bytes": int(gpu.max_sum("memory")) if gpu.mode in SHARED else None,
    }
    if gpu.mode in SHARED:
        entry["interference"] = interference(gpu, th)
    if gpu.mode == Kind.MIG:
        entry["mig_layout"] = gpu.mig_layout
    if gpu.mode == Kind.MPS:
        entry["mps_clients"] = [
            {
                "job_id": i.job_id,
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": i.thread_pct,
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": i.memory_limit,
            }
            for i in gpu.items
        ]
    if gpu.mode == Kind.TIME_SLICING:
        entry["replicas"] = gpu.concurrency()
    if gpu.original_uuid:
        entry["uuid"] = gpu.original_uuid
    return entry


def _freed(fleet: list[FleetGpu], bins: list[GpuBin], recs: pd.DataFrame) -> list[dict[str, Any]]:
    """Inventory GPUs no packed GPU uses, and why they are free."""
    used = {b.original_uuid for b in bins}
    had_jobs = {u for v in recs["uuids"] for u in _uuids(v)}
    idle_only = {u for v in recs.loc[recs["recommendation"] == Kind.RECLAIM, "uuids"] for u in _uuids(v)}
    busy = {u for v in recs.loc[recs["recommendation"] != Kind.RECLAIM, "uuids"] for u in _uuids(v)}
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
    recs: pd.DataFrame, th: Thresholds, fleet: list[FleetGpu] | None = None, topology: Topology | None = None
) -> Plan:
    """Hold, pack and account, then lay the result out on the fleet's GPUs (module docstring);
    `topology` keeps the multi-GPU jobs it moves topology-local (`_keep_local`)."""
    fleet = fleet_from_recs(recs) if fleet is None else _with_job_gpus(fleet, recs)
    if recs.empty and not fleet:
        return Plan(0, 0, 0, {}, 0.0, 0.0, 0.0, [], {})
    window_hours = _window_hours(recs)
    movable, held = hold(recs) if len(recs) else (recs, [])
    bins, moved, notes = account(movable, held, fleet, th) if len(recs) else ([], {}, [])
    if len(recs):
        moved.update(held_changes(recs))
    mix = fragmentation.task_mix(int(_num(g)) for g in recs["gpus"]) if len(recs) else {1: 1.0}
    _assign_gpus(bins, fleet, topology, mix)
    _mig_layouts(bins)
    groups = _node_groups([b for b in bins if b.mode != UNCHANGED], th)
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
        layout=[_entry(b, window_hours, th) for b in bins],
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
    ran = {u for v in recs["uuids"] for u in _uuids(v)} if len(recs) else set()
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
