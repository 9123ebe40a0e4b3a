"""Each job's modes: the ways it may share a GPU, among which the plan chooses while it packs.

`recommend.py` gives every job one mode; a fleet can still need a GPU fewer when some jobs take
another mode they fit as well (three jobs on 3g.40gb slices need two GPUs, the same three under
MPS caps of 30 % one). `modes_of` lists a sharing job's modes, its recommended one first, each
sized by recommend.py's own rules, never re-derived: the MPS cap and pinned limit from
`mps_settings` (demand at the sizing percentile + headroom, need = peak + headroom), the MIG
profile the recommendation named (`mig_alternative`), or for a time-sliced job the one
`choose_mig_profile` picks from its need and demand; a slice only where its share of the memory
bandwidth (its memory slices) holds the job's DRAM activity, which MPS and time-slicing test
against their neighbours instead. Time-slicing (no cap) stays the mode of the jobs the
idle-dominated rule chose it for. A job keeps its one mode when it is whole (exclusive,
downsized, multi-GPU), a server under pressure (never shrunk), a leak (sized from a peak it
outgrows) or a job whose demand is only a time-split share (`timesplit.SPLIT`). The plan's fit
tests decide where each mode fits (`bins.fits`).

`lower_bound` is the packer's cheap gate: the fewest GPUs any choice of modes could need.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulens.analyzer import serving
from gpulens.analyzer.hysteresis import KEPT_LIMIT, KEPT_NOTE, KEPT_THREADS
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.recommend import choose_mig_profile, mps_settings
from gpulens.analyzer.thresholds import Thresholds
from gpulens.analyzer.timesplit import split_only
from gpulens.catalog import GpuModel, model_for_nvml_name

# the recommendations whose job may take another sharing mode
FLEXIBLE = frozenset({Kind.MIG, Kind.MPS, Kind.TIME_SLICING})


@dataclass(frozen=True)
class Mode:
    """One way a job may run: its kind and that kind's settings (None where it has none)."""

    kind: Kind
    mig_profile: str | None = None
    thread_pct: int | None = None
    memory_limit: int | None = None
    note: str = field(default="", compare=False)  # why its settings are not the newly sized ones


def _num(value: object) -> float:
    """A float from a column that may hold None/NaN (NaN then)."""
    if value is None:
        return math.nan
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _row_dict(row: Any) -> Mapping[str, Any]:
    """A row as the mapping `serving.pressure` reads: a dict, a `frames.rows` namedtuple or an
    object's attributes."""
    if isinstance(row, Mapping):
        return row
    as_dict = getattr(row, "_asdict", None)
    return dict(as_dict() if as_dict is not None else vars(row))


def own_mode(row: Any) -> Mode:
    """The mode the recommendation gives the job (its settings as the row carries them: the
    hysteresis dead band may have kept a running MPS cap)."""
    kind = Kind(str(row.recommendation))
    if kind == Kind.MIG:
        return Mode(kind, mig_profile=_text(row.mig_profile) or None)
    if kind == Kind.MPS:
        pct, limit = _num(row.mps_active_thread_percentage), _num(row.mps_pinned_memory_limit_bytes)
        return Mode(
            kind,
            thread_pct=None if math.isnan(pct) else int(pct),
            memory_limit=None if math.isnan(limit) else int(limit),
        )
    return Mode(kind)


def modes_of(row: Any, th: Thresholds) -> tuple[Mode, ...]:
    """The job's modes, its recommended one first; () when it has no other (module docstring)."""
    kind = str(row.recommendation)
    if kind not in FLEXIBLE or int(_num(getattr(row, "gpus", 1)) or 1) != 1:
        return ()
    if _text(getattr(row, "memory_leak", "")):
        return ()
    if split_only(_row_dict(row)):
        return ()  # no cap or slice sized from a time-split share (`timesplit.SPLIT`)
    if _text(getattr(row, "serving_server", "")) and serving.pressure(_row_dict(row), th):
        return ()
    if _text(getattr(row, "serving_server", "")) and serving.pool_above_need(_row_dict(row)):
        return ()  # no slice or limit below the pool it allocates as configured
    need, demand = _num(row.memory_need_bytes), _num(row.sm_fraction)
    if math.isnan(need) or math.isnan(demand):
        return ()
    own = own_mode(row)
    out = [own]
    if kind != Kind.MPS and demand < th.exclusive.min_activity:  # as the busy rule would judge it
        out.extend(_mps_mode(row, demand, need, th))
    model = model_for_nvml_name(str(row.gpu_model))
    profile = _mig_profile(row, kind, model, need)
    if profile and model is not None and not _bandwidth_fits(row, model, profile, th):
        profile = None
    if kind != Kind.MIG and profile:
        out.append(Mode(Kind.MIG, mig_profile=profile))
    return tuple(out) if len(out) > 1 else ()


def _mps_mode(row: Any, demand: float, need: float, th: Thresholds) -> list[Mode]:
    """The MPS mode of a job recommended another: the settings the dead band kept where it runs
    under MPS now (`hysteresis.KEPT_*`), else newly sized; none at 100 % threads."""
    kept = _num(getattr(row, KEPT_THREADS, None))
    if not math.isnan(kept) and kept < 100:
        limit = _num(getattr(row, KEPT_LIMIT, None))
        note = _text(getattr(row, KEPT_NOTE, ""))
        return [Mode(Kind.MPS, None, int(kept), None if math.isnan(limit) else int(limit), note)]
    settings = mps_settings(demand, need, th)
    if settings.thread_percentage >= 100:
        return []
    return [Mode(Kind.MPS, None, settings.thread_percentage, settings.pinned_memory_limit_bytes)]


def _mig_profile(row: Any, kind: str, model: GpuModel | None, need: float) -> str | None:
    """The slice recommend.py sized for the job: the one it named (MPS: `mig_alternative`), or
    for a time-sliced job the smallest that holds its need and demand (never the whole GPU)."""
    if kind == Kind.MPS:
        return _text(getattr(row, "mig_alternative", None)) or None
    if kind != Kind.TIME_SLICING or model is None or not model.mig_capable:
        return None
    sms = _num(getattr(row, "sm_demand_sms", math.nan))
    if math.isnan(sms):
        return None
    profile = choose_mig_profile(model, need, sms)
    if profile is None or profile.compute_slices == model.compute_slices:
        return None
    return profile.name


def _bandwidth_fits(row: Any, model: GpuModel, profile: str, th: Thresholds) -> bool:
    """Whether the slice's memory bandwidth (its share of the memory slices: MIG partitions the
    memory controllers, the MIG User Guide's "memory bandwidth QoS") holds the job's p95 DRAM
    activity, as a share of the whole GPU, plus the compute headroom (not measured: it holds)."""
    dram = _num(getattr(row, "dram_active_p95", math.nan))
    if math.isnan(dram) or dram <= 0:
        return True
    device_sms = _num(getattr(row, "device_sms", math.nan))
    scale = device_sms / model.sm_count if device_sms > 0 else 1.0
    share = model.mig_profile(profile).memory_slices / model.memory_slices
    return share >= dram * scale * (1 + th.headroom.compute_ratio)


@dataclass(frozen=True)
class Span:
    """What `lower_bound` reads of one job: its lifetime and its modes (its own one when none)."""

    start: float
    end: float
    modes: tuple[Mode, ...]
    memory: float  # bytes needed


def cost(mode: Mode, memory: float, share_of_time: float, model: GpuModel | None) -> float:
    """A share of one GPU that no packing gives the job less of in `mode`: MPS thread caps sum to
    100 % per GPU and MIG compute slices to the model's (both over the whole window: caps are per
    GPU and slices are not reused), time-sliced memory and a whole GPU only while the job lives
    (`share_of_time` of the window)."""
    if mode.kind == Kind.MPS:
        return (mode.thread_pct or 0) / 100.0
    if mode.kind == Kind.MIG:
        if model is None or not mode.mig_profile:
            return 0.0
        return model.mig_profile(mode.mig_profile).compute_slices / model.compute_slices
    if mode.kind == Kind.TIME_SLICING:
        total = model.memory_bytes if model else math.inf
        return min(1.0, memory / total) * share_of_time
    return share_of_time


def lower_bound(model_name: str, jobs: Iterable[Span]) -> int:
    """The fewest GPUs of `model_name` any choice of the jobs' modes could need.

    Every GPU runs one mode, and each mode's GPUs hold at most one GPU's worth of one resource:
    caps (MPS), compute slices (MIG), memory at any instant (time-slicing), one job at a time
    (whole). A job's cheapest mode by that measure, summed (an instant's sums are at least their
    mean over the window), bounds from below every packing that runs each job in one of its
    modes (a lone sharer the plan makes whole is left out: the joint search never needs it)."""
    model = model_for_nvml_name(model_name)
    spans = list(jobs)
    if not spans:
        return 0
    first, last = min(s.start for s in spans), max(s.end for s in spans)
    window = last - first
    total = 0.0
    for span in spans:
        share = (span.end - span.start) / window if window > 0 else 1.0
        total += min(cost(m, span.memory, share, model) for m in span.modes)
    return math.ceil(total - 1e-9)
