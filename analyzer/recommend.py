"""One explainable recommendation per job profile: an ordered list of rules.

`recommend_one` tries `RULES` in order; each rule returns a `Recommendation` or `None` (not
mine), and the last one always answers. Every reason names the numbers (and the percentile)
that decided it; thresholds come from `thresholds.yaml`.

1. `insufficient-data`: no activity signal, too few samples or too little coverage, a GPU model
   the catalog does not know and whose memory total the data lacks, or no memory samples. A model
   the catalog does not know but whose `gpu_memory_total_bytes` is in the data gets advice from
   memory alone (exclusive, time-slicing or MPS by memory fit with headroom, never MIG), with a
   note that its compute limits and MIG profiles are unknown.
2. `reclaim`: allocated and idle (p95 activity and idle fraction both say nothing ran), unless the
   job serves (`serving_note`: its pod's server metrics, activity in most samples, or activity in
   most clock hours of its lifetime: a live, low-traffic server is sized and may share; or, on a
   GPU it now shares, last week's report found it serving: `served_last_week`).
   Then, for a sized job: an exclusive single-GPU job whose memory leaks (`memory_leak`: its
   least-squares memory trend adds up to `leak.min_growth_fraction` of its peak over a run of at
   least `leak.min_hours`; a job whose memory restarts is judged per cycle, `cycle_leak`) stays
   `exclusive` until it is fixed; any other job's reason says so. A leak that restarts is never
   false saturation: its peak before each restart is the leak.
3. `time-slicing`: idle-dominated single-GPU work with bursts (notebooks, interactive), whose
   memory need leaves room on the GPU; time-slicing caps nothing, so bursts keep the whole GPU.
4. `exclusive` (or `downsize-model`): compute demand at the sizing percentile at or above
   `exclusive.min_activity` (a cap would throttle it), multi-GPU, or memory need over the GPU.
   A smaller model of the fleet (fewer SMs x clock and less memory) that holds the job's memory
   need and compute demand with headroom makes it `downsize-model` instead.
5. `mig` or `mps`: the job fits a fraction of the GPU. The MIG profile is the smallest whose
   memory holds the need and whose SMs hold the demand; MPS gets a thread cap and a pinned
   memory limit from `mps_settings`. MIG wins when the job is on a slice already, when it packs
   more such jobs per GPU than MPS, or at least `mig.min_density_ratio` as many with a geometry
   that uses every compute slice (3g+3g leaves one idle: MPS then uses all SMs as densely).
   Whether a partner really fits is the plan's fit test (memory, compute caps, DRAM bandwidth);
   a job that no partner fits stays where it is.

**Burst-aware compute.** Demand is a per-sample high percentile of the activity series, never a
mean: duty cycle (NVML utilization) overstates SM demand, so sizing from it errs on the safe side.
A batch job is sized at the lowest of p95 / p99 / max whose share of samples above it (5 %, 1 %,
0 %) is at most `compute.max_bind_fraction`: that share is how often the cap would bind. A
latency-sensitive job (bursty: activity stddev >= `compute.latency_min_burstiness` x mean, or
p99 >= `compute.latency_peak_ratio` x mean) is never sized below its p99.

Memory need is never below peak + headroom: `max(peak * (1 + ratio), peak + min_bytes)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

import pandas as pd

from gpulens.analyzer import frames, serving
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.signals import DUTY_CYCLE, EQUAL_SPLIT
from gpulens.analyzer.thresholds import Thresholds
from gpulens.analyzer.timesplit import split_only
from gpulens.catalog import GIB, MIB, GpuModel, MigProfile, model_for_nvml_name

ALLOCATOR_HINT = (
    "memory looks pre-allocated: check TF_FORCE_GPU_ALLOW_GROWTH=true (TensorFlow), "
    "XLA_PYTHON_CLIENT_PREALLOCATE=false / XLA_PYTHON_CLIENT_MEM_FRACTION (JAX), "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and torch.cuda.memory_reserved() vs "
    "memory_allocated() (PyTorch), vLLM --gpu-memory-utilization; memory, not compute, blocks sharing"
)

# (percentile column, its name, share of samples above it): the candidates for the sizing basis
PERCENTILES = (("sm_active_p95", "p95", 0.05), ("sm_active_p99", "p99", 0.01), ("sm_active_max", "max", 0.0))


@dataclass
class Recommendation:
    """The decision for one job and the numbers behind it."""

    job_id: str
    recommendation: str
    reason: str
    confidence: float
    confidence_level: str
    mig_profile: str | None = None
    mps_active_thread_percentage: int | None = None
    mps_pinned_memory_limit_bytes: int | None = None
    target_gpu_model: str | None = None
    mig_alternative: str | None = None  # MPS jobs: the slice that would fit (the plan may use it)
    memory_need_bytes: float | None = None
    sm_demand_sms: float | None = None
    sm_fraction: float | None = None  # compute demand at the sizing percentile, share of the GPU
    gpu_fraction: float | None = None  # fraction of one GPU the recommendation occupies
    sizing_percentile: str | None = None  # "p95", "p99" or "max"
    cap_binds_at_most: float | None = None  # share of samples above the demand the cap is sized from
    latency_sensitive: bool = False
    false_saturation: bool = False
    false_saturation_hint: str = ""
    memory_leak: str = ""  # what the memory trend says when it is a leak ("" otherwise)
    # an inference server sized from its KV use: the most it used (non-KV + peak KV), below which
    # no slice or limit may go (NaN: sized from its observed peak as any job)
    serving_floor_bytes: float = math.nan
    # why a job that looks idle is a server all the same ("" when it is not one): one of `Serves`
    serves: str = ""
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class MpsSettings:
    """What one MPS client gets: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and the pinned memory limit."""

    thread_percentage: int
    pinned_memory_limit_bytes: int


def mps_settings(demand_fraction: float, need_bytes: float, th: Thresholds) -> MpsSettings:
    """The one MPS sizing rule (recommend and plan): demand + headroom rounded up to a whole percent
    (what CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and Slurm's `mps` shares take: a coarser step wastes
    the difference on every client, 30.3 % as 35 % fits two per GPU where three fit), memory need
    rounded up to a MiB; at least `mps.min_thread_percentage`, at most 100."""
    demand = demand_fraction * (1 + th.headroom.compute_ratio)
    pct = math.ceil(demand * 100 - 1e-9)
    threads = int(min(100, max(th.mps.min_thread_percentage, pct)))
    return MpsSettings(threads, int(math.ceil(need_bytes / MIB) * MIB))


def signal_note(signal: str) -> str:
    """What a shared GPU's activity figure is, for reasons ("" for a job's own device)."""
    if signal in EQUAL_SPLIT:
        return (
            " (the GPU's activity split equally among its jobs: the data has no per-job shares, "
            "gpu_job_sm_unattributed_ratio is missing, so jobs with different demand look alike)"
        )
    if signal.endswith("_share"):
        return " (its share of the GPU's activity, with its part of what no job accounts for)"
    return ""


def memory_leak(row: Mapping[str, Any], th: Thresholds) -> str:
    """ "grows 28.0 GiB/h over its 1.5 h run (42.0 GiB, 73 % of its 57.6 GiB peak)" when the job's
    memory trend (least-squares slope of its per-step memory) is a leak, else "". A job whose
    memory restarts (`memory_restarts`) is judged per cycle instead (`cycle_leak`): over many
    cycles a sawtooth has no trend."""
    restarts = float(row.get("memory_restarts", math.nan))
    if restarts > 0:
        return cycle_leak(row, th)
    trend = float(row.get("memory_trend_bytes_per_hour", math.nan))
    peak = float(row.get("memory_peak_bytes", math.nan))
    hours = float(row.get("duration_s", math.nan)) / 3600.0
    if not (trend > 0 and peak > 0 and hours >= th.leak.min_hours):
        return ""
    growth = trend * hours
    if trend < th.leak.min_bytes_per_hour or growth < th.leak.min_growth_fraction * peak:
        return ""
    return (
        f"grows {trend / GIB:.1f} GiB/h over its {hours:.1f} h run ({growth / GIB:.1f} GiB, "
        f"{growth / peak:.0%} of its {peak / GIB:.1f} GiB peak)"
    )


def cycle_leak(row: Mapping[str, Any], th: Thresholds) -> str:
    """ "grows 32.0 GiB/h between restarts, period ~2.0 h (12 restarts in the window): ..." when a
    job whose memory restarts grows in each cycle by the `leak.*` thresholds, else "".

    The growth is the median slope of short windows (`memory_cycle_slope_bytes_per_hour`: most
    windows lie inside one cycle), the cycle the run over its restarts (`memory_period_s`); a cycle
    must grow `leak.min_growth_fraction` of the peak at `leak.min_bytes_per_hour` at least, over a
    run of `leak.min_hours`. One deliberate drop (a phase that frees memory) grows in neither part.
    """
    restarts = float(row.get("memory_restarts", math.nan))
    slope = float(row.get("memory_cycle_slope_bytes_per_hour", math.nan))
    period = float(row.get("memory_period_s", math.nan)) / 3600.0
    peak = float(row.get("memory_peak_bytes", math.nan))
    hours = float(row.get("duration_s", math.nan)) / 3600.0
    if not (restarts > 0 and slope > 0 and peak > 0 and period > 0 and hours >= th.leak.min_hours):
        return ""
    growth = min(slope * period, peak)  # a cycle never holds more than its peak
    if slope < th.leak.min_bytes_per_hour or growth < th.leak.min_growth_fraction * peak:
        return ""
    count = int(restarts)
    return (
        f"grows {slope / GIB:.1f} GiB/h between restarts, period ~{period:.1f} h ({count} restart"
        f"{'s' if count != 1 else ''} in the window: a step under {1 - th.leak.restart_drop_fraction:.0%} "
        f"of the step before, leak.restart_drop_fraction); about {growth / GIB:.1f} GiB a cycle, "
        f"{growth / peak:.0%} of its {peak / GIB:.1f} GiB peak (>= leak.min_growth_fraction "
        f"{th.leak.min_growth_fraction:.0%}, median slope over leak.cycle_window_steps "
        f"{th.leak.cycle_window_steps} steps)"
    )


def falsely_saturated(v: JobView, memory_fraction: float) -> bool:
    """Memory held near the device's size at low activity, by neither a leak that restarts (its
    peak comes just before each restart) nor a server whose KV cache is in use."""
    th = v.th
    return (
        memory_fraction >= th.false_saturation.min_memory_fraction
        and v.f("sm_active_mean") < th.false_saturation.max_mean_activity
        and not restarting_leak(v.row, th)
        and not serving.needs_its_pool(v.row, th)
    )


def restarting_leak(row: Mapping[str, Any], th: Thresholds) -> bool:
    """A leak that restarts: its peak before each restart is the leak, not memory it keeps."""
    return bool(cycle_leak(row, th))


LEAK_HINT = (
    "find what keeps allocating (tensors or graphs kept across iterations, caches that never shrink: "
    "torch.cuda.memory_snapshot(), memory_summary()) or restart it on a schedule before it fills the GPU"
)


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def memory_need(peak: float, th: Thresholds) -> float:
    """Peak plus headroom: the floor for any slice or MPS memory limit."""
    return max(peak * (1 + th.headroom.memory_ratio), peak + th.headroom.memory_min_bytes)


def capability(model: GpuModel) -> float:
    """Compute capability as SMs x max SM clock (MHz): what "smaller" means for compute."""
    return float(model.sm_count * model.max_sm_clock_mhz)


def confidence(row: Mapping[str, Any], th: Thresholds) -> tuple[float, str]:
    """From coverage (how much of the lifetime was seen), sample count and variability (CV)."""
    coverage = float(row["coverage"]) if not math.isnan(row["coverage"]) else 0.0
    size = min(1.0, float(row["samples"]) / th.confidence.full_samples)
    burst = row["burstiness"]
    stability = 1.0 / (1.0 + 0.5 * (0.0 if math.isnan(burst) else float(burst)))
    value = round(min(1.0, coverage) * math.sqrt(size) * stability, 2)
    level = "high" if value >= th.confidence.high else "medium"
    if value < th.confidence.medium:
        level = "low"
    return value, level


def choose_mig_profile(model: GpuModel, need_bytes: float, demand_sms: float) -> MigProfile | None:
    """Smallest plain profile (no +me) whose memory holds `need_bytes` and SMs cover `demand_sms`."""
    fits = [
        p
        for p in model.mig_profiles
        if not p.media_extensions and p.memory_bytes >= need_bytes and p.sm_count >= demand_sms
    ]
    if not fits:
        return None
    return min(fits, key=lambda p: (p.compute_slices, p.memory_slices, p.memory_bytes))


def mig_fraction(model: GpuModel, profile: MigProfile) -> float:
    """Share of the GPU a profile takes: the larger of its memory and compute slice shares."""
    return max(profile.memory_slices / model.memory_slices, profile.compute_slices / model.compute_slices)


def smaller_model(
    model: GpuModel, need: float, demand_fraction: float, th: Thresholds, fleet: Sequence[GpuModel]
) -> GpuModel | None:
    """The smallest fleet model that is smaller than `model` in compute and memory and still holds
    the memory need and the compute demand (share of `model`, plus headroom)."""
    demand = demand_fraction * (1 + th.headroom.compute_ratio) * capability(model)
    smaller = [
        m
        for m in fleet
        if capability(m) <= capability(model)
        and m.memory_bytes <= model.memory_bytes
        and (capability(m), m.memory_bytes) != (capability(model), model.memory_bytes)
        and m.memory_bytes >= need
        and capability(m) >= demand
    ]
    return min(smaller, key=lambda m: (capability(m), m.memory_bytes, m.key)) if smaller else None


@dataclass(frozen=True)
class Sizing:
    """Memory need and compute demand of one job on its model (the numbers sized rules read)."""

    model: GpuModel
    need: float  # bytes
    mem_fraction: float
    percentile: str  # the sizing percentile's name
    binds: float  # share of samples above it
    demand: float  # activity at the percentile, as the job's device measured it
    demand_fraction: float  # the same as a share of the whole GPU
    demand_sms: float  # SMs with headroom
    device_sms: float
    latency_sensitive: bool
    basis_name: str  # "p99 duty cycle of its 1g.10gb slice", for reasons
    burst_note: str  # why the job is latency-sensitive ("" when it is not)


@dataclass
class JobView:
    """One profile row as the rules read it."""

    row: Mapping[str, Any]
    th: Thresholds
    fleet: Sequence[GpuModel]
    job: str
    conf: float
    level: str
    numbers: dict[str, float]
    sizing: Sizing | None = None

    def f(self, column: str) -> float:
        value = self.row[column]
        return math.nan if value is None else float(value)

    def rec(self, kind: Kind, reason: str, **kw: object) -> Recommendation:
        return Recommendation(self.job, kind.value, reason, self.conf, self.level, numbers=self.numbers, **kw)  # type: ignore[arg-type]

    def no_data(self, reason: str) -> Recommendation:
        return Recommendation(
            self.job, Kind.INSUFFICIENT_DATA.value, reason, 0.0, "low", numbers=self.numbers
        )


Rule = Callable[[JobView], Recommendation | None]


def _no_activity(v: JobView) -> Recommendation | None:
    if v.row["activity_signal"] != "none":
        return None
    return v.no_data(
        f"no activity samples in {int(v.row['samples'])} samples: the exporter reported neither SM "
        "activity nor utilization for this job (e.g. MIG on a pre-Hopper GPU without DCGM)"
    )


def _too_little_data(v: JobView) -> Recommendation | None:
    samples, coverage = int(v.row["samples"]), v.f("coverage")
    min_samples, min_cov = v.th.data.min_samples, v.th.data.min_coverage
    if samples >= min_samples and coverage >= min_cov and not math.isnan(v.f("sm_active_p95")):
        return None
    return v.no_data(
        f"{samples} samples, {_pct(coverage)} coverage ({v.row['activity_signal']}); "
        f"need >= {min_samples} samples and >= {_pct(min_cov)} coverage"
    )


class Serves(StrEnum):
    """The evidence that a job which looks idle serves (jobs.json `serves`; next week's carry-over
    reads it)."""

    METRICS = "server-metrics"
    MEDIAN = "median-activity"
    HOURS = "active-hours"
    LAST_WEEK = "last-week"


# sharing modes under which a quiet job's own activity can be invisible: NVML gives each process's
# utilization in whole percent of time (a server at 0.3 % reads 0), and the device's finer figure
# is split by those, so hours with its bursts show none of them
SHARED_NOW = frozenset({"mps", "time_slicing", "time-slicing"})


def servers_of(jobs: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """Job ids and workloads last week's report found serving though they looked idle (rows of its
    `jobs.json` with `serves`): next week, on a GPU they share, that still holds."""
    out: set[str] = set()
    for row in jobs:
        if isinstance(row, Mapping) and row.get("serves"):
            out.update(str(row[k]) for k in ("job_id", "workload") if row.get(k))
    return frozenset(out)


def serving_evidence(v: JobView) -> tuple[Serves | None, str]:
    """(evidence, why) a job that looks idle by the reclaim thresholds serves all the same, or
    (None, "") when it does not look idle or nothing says it serves."""
    p95, idle = v.f("sm_active_p95"), v.f("idle_fraction")
    th = v.th.reclaim
    if p95 >= th.max_p95 or idle < th.min_idle_fraction:
        return None, ""
    median = v.f("sm_active_p50")
    # rows of other sources (imported traces, older callers) may lack the hours: never spared by them
    active, hours = (float(v.row.get(c) or 0.0) for c in ("active_hours", "lifetime_hours"))
    share = active / hours if hours > 0 else math.nan
    if serving.serves(v.row):  # its pod's inference server published its metrics all along
        return Serves.METRICS, f"its pod publishes {v.row['serving_server']} server metrics"
    if median > th.serving_min_median:
        return Serves.MEDIAN, (
            f"median activity {100 * median:.1f} % > reclaim.serving_min_median "
            f"{100 * th.serving_min_median:.1f} %"
        )
    if share >= th.serving_min_active_hour_fraction and hours >= th.serving_min_hours:
        return Serves.HOURS, (
            f"active in {int(active)} of {int(hours)} hours (>= reclaim.serving_min_active_hour_fraction "
            f"{_pct(th.serving_min_active_hour_fraction)}, over at least reclaim.serving_min_hours "
            f"{th.serving_min_hours:g})"
        )
    served = v.row.get("served_last_week")
    if pd.api.types.is_bool(served) and served and str(v.row.get("sharing") or "") in SHARED_NOW:
        # a server moved onto a shared GPU cannot show its quiet hours there: last week's
        # evidence holds while it shares (alone again, its own activity decides)
        return Serves.LAST_WEEK, (
            "last week's report found it serving (followed by its workload), and on the GPU it now "
            "shares its quiet activity is below what NVML attributes per process"
        )
    return None, ""


def serving_note(v: JobView) -> str:
    """Why a job that looks idle by the reclaim thresholds serves all the same (its reason says so;
    it is sized and may share), or "" (it does not look idle, or it is reclaimed). Taking a live
    server's GPU away is an outage, keeping a quiet one on a shared GPU costs little."""
    return _serving(v)[1]


def _serving(v: JobView) -> tuple[Serves | None, str]:
    """(evidence, the reason's note) of `serving_evidence`, "" as the note when there is none."""
    evidence, why = serving_evidence(v)
    if evidence is None:
        return None, ""
    p95, idle = v.f("sm_active_p95"), v.f("idle_fraction")
    return evidence, (
        f"looks idle (idle in {_pct(idle)} of samples, p95 activity {_pct(p95)}) but {why}: "
        "a server, not idle; never reclaimed, may share"
    )


def _idle(v: JobView) -> Recommendation | None:
    p95, idle = v.f("sm_active_p95"), v.f("idle_fraction")
    if p95 >= v.th.reclaim.max_p95 or idle < v.th.reclaim.min_idle_fraction:
        return None
    if serving_note(v):
        return None  # it serves: sized (and shared) by the rules below, its reason says why
    return v.rec(
        Kind.RECLAIM,
        f"allocated and idle: idle in {_pct(idle)} of samples, p95 activity {_pct(p95)}"
        f"{signal_note(str(v.row['activity_signal']))}, "
        f"{v.f('gpu_hours_allocated'):.1f} GPU-hours allocated, {v.f('gpu_hours_used'):.2f} used",
        gpu_fraction=0.0,
    )


def _unknown_model(v: JobView) -> Recommendation | None:
    """A model the catalog does not know: advice from memory alone (its memory total from
    `gpu_memory_total_bytes`), never MIG, with a note that compute limits and MIG are unknown."""
    if model_for_nvml_name(str(v.row["gpu_model"])) is not None:
        return None
    name, total, peak = v.row["gpu_model"], v.f("device_memory_bytes"), v.f("memory_peak_bytes")
    if math.isnan(total) or total <= 0:
        return v.no_data(
            f"GPU model {name!r} is not in the catalog and the data has no gpu_memory_total_bytes for it; "
            "pass --gpu-model"
        )
    if math.isnan(peak):
        return None  # _no_memory says so
    note = (
        f"; GPU model {name!r} is not in the catalog: advice from its memory alone "
        f"({_gib(total)}, gpu_memory_total_bytes), its compute limits and MIG profiles are unknown"
    )
    if v.row["sharing"] == "mig":
        return v.no_data(f"on a MIG slice of a model gpulens cannot size slices for{note}")
    th = v.th
    need = memory_need(peak, th)
    basis = sizing_basis(v)
    demand = min(1.0, basis.demand)
    demand_text = f"{basis.basis_name} {_pct(demand)}"
    saturated = falsely_saturated(v, peak / total)
    sized: dict[str, Any] = {
        "memory_need_bytes": need,
        "sm_fraction": demand,
        "sizing_percentile": basis.percentile,
        "cap_binds_at_most": basis.binds,
        "latency_sensitive": basis.latency_sensitive,
        "false_saturation": saturated,
        "false_saturation_hint": (serving.preallocation_hint(v.row) or ALLOCATOR_HINT) if saturated else "",
    }
    v.numbers.update(memory_need_bytes=need, compute_demand=demand, mem_fraction=need / total)
    gpus, idle = int(v.row["gpus"]), v.f("idle_fraction")
    # the order of the sized rules: memory, multi-GPU, idle-dominated, busy, then a fraction
    if need > total or gpus > 1:
        why = f"peak memory {_gib(peak)} + headroom exceeds its {_gib(total)}" if need > total else ""
        why = why or f"multi-GPU job ({gpus} GPUs) at {demand_text}: keep whole GPUs"
        return v.rec(Kind.EXCLUSIVE, why + note, gpu_fraction=1.0, **sized)
    if idle >= th.time_slicing.min_idle_fraction:
        return v.rec(
            Kind.TIME_SLICING,
            f"idle-dominated: idle in {_pct(idle)} of samples with bursts to {_pct(v.f('sm_active_max'))}; "
            f"time-slicing caps nothing; memory need {_gib(need)} of {_gib(total)}" + note,
            gpu_fraction=need / total,
            **sized,
        )
    if demand >= th.exclusive.min_activity:
        why = f"busy: {demand_text} >= {_pct(th.exclusive.min_activity)}; a cap would throttle it"
        return v.rec(Kind.EXCLUSIVE, why + note, gpu_fraction=1.0, **sized)
    settings = mps_settings(demand, need, th)
    return v.rec(
        Kind.MPS,
        f"light: {demand_text} + headroom -> {settings.thread_percentage} % threads (binds in at most "
        f"{_pct(basis.binds)} of samples), peak {_gib(peak)} -> {_gib(settings.pinned_memory_limit_bytes)} "
        f"pinned limit of {_gib(total)}" + note,
        mps_active_thread_percentage=settings.thread_percentage,
        mps_pinned_memory_limit_bytes=settings.pinned_memory_limit_bytes,
        gpu_fraction=max(need / total, settings.thread_percentage / 100),
        **sized,
    )


def _no_memory(v: JobView) -> Recommendation | None:
    if not math.isnan(v.f("memory_peak_bytes")):
        return None
    return v.no_data("no GPU memory samples: cannot size a slice safely")


PRE_RULES: tuple[Rule, ...] = (_no_activity, _too_little_data, _idle, _unknown_model, _no_memory)


@dataclass(frozen=True)
class Basis:
    """The percentile compute is sized from, and why (model-independent: shares of the device)."""

    percentile: str  # "p95", "p99" or "max"
    binds: float  # share of samples above it
    demand: float  # activity at the percentile, as the job's device measured it
    latency_sensitive: bool
    burst_note: str  # why the job is latency-sensitive ("" when it is not)
    basis_name: str  # "p99 duty cycle of its 1g.10gb slice", for reasons


def sizing_basis(v: JobView) -> Basis:
    """The burst-aware sizing percentile (see the module docstring)."""
    row, th = v.row, v.th
    mean = v.f("sm_active_mean")
    burstiness, p99 = v.f("burstiness"), v.f("sm_active_p99")
    if math.isnan(p99):
        p99 = v.f("sm_active_max")
    bursty = not math.isnan(burstiness) and burstiness >= th.compute.latency_min_burstiness
    peaky = mean > 0 and p99 >= th.compute.latency_peak_ratio * mean
    latency = bursty or peaky
    burst_note = ""
    if latency:
        burst_note = (
            f"bursty (stddev {burstiness:.1f} x mean)" if bursty else f"bursts to {p99 / mean:.1f} x its mean"
        )
    candidates = PERCENTILES[1:] if latency else PERCENTILES
    column, name, binds = next(
        (
            (c, n, b)
            for c, n, b in candidates
            if b <= th.compute.max_bind_fraction + 1e-12 and not math.isnan(v.f(c))
        ),
        candidates[-1],
    )
    demand = v.f(column)
    if math.isnan(demand):
        demand = v.f("sm_active_max")
    signal = "duty cycle" if row["activity_signal"] in DUTY_CYCLE else "SM activity"
    basis_name = f"{name} {signal}"
    if row["sharing"] == "mig" and row["mig_profile_now"]:
        basis_name += f" of its {row['mig_profile_now']} slice"
    basis_name += signal_note(str(row["activity_signal"]))
    return Basis(name, binds, demand, latency, burst_note, basis_name)


def size(v: JobView) -> Sizing:
    """Memory need and burst-aware compute demand (see the module docstring)."""
    row, th = v.row, v.th
    model = model_for_nvml_name(str(row["gpu_model"]))
    assert model is not None  # _unknown_model ran first
    need = memory_need(v.f("memory_peak_bytes"), th)
    kv = serving.kv_need(row, th)
    if kv is not None:  # a server sized from its KV use, not from the pool it pre-allocates
        need = min(need, memory_need(kv.footprint, th))
    basis = sizing_basis(v)
    demand = basis.demand
    device_sms = v.f("device_sms") if not math.isnan(v.f("device_sms")) else float(model.sm_count)
    demand_fraction = min(1.0, demand * device_sms / model.sm_count)
    demand_sms = demand * device_sms * (1 + th.headroom.compute_ratio)
    return Sizing(
        model=model,
        need=need,
        mem_fraction=need / model.memory_bytes,
        percentile=basis.percentile,
        binds=basis.binds,
        demand=demand,
        demand_fraction=demand_fraction,
        demand_sms=demand_sms,
        device_sms=device_sms,
        latency_sensitive=basis.latency_sensitive,
        basis_name=basis.basis_name,
        burst_note=basis.burst_note,
    )


def _sized(v: JobView, s: Sizing) -> dict[str, object]:
    """The sizing columns every sized recommendation carries, and the false-saturation flag."""
    peak = v.f("memory_peak_bytes")
    device_memory = v.f("device_memory_bytes")
    if math.isnan(device_memory) or not device_memory:
        device_memory = float(s.model.memory_bytes)
    saturated = falsely_saturated(v, peak / device_memory)
    return {
        "memory_need_bytes": s.need,
        "sm_demand_sms": s.demand_sms,
        "sm_fraction": s.demand_fraction,
        "sizing_percentile": s.percentile,
        "cap_binds_at_most": s.binds,
        "latency_sensitive": s.latency_sensitive,
        "false_saturation": saturated,
        "false_saturation_hint": (serving.preallocation_hint(v.row) or ALLOCATOR_HINT) if saturated else "",
    }


def _demand_text(s: Sizing) -> str:
    """ "p99 SM activity 34 % (latency-sensitive: bursty ...)" for reasons."""
    note = f" (latency-sensitive: {s.burst_note})" if s.latency_sensitive else ""
    return f"{s.basis_name} {_pct(s.demand)}{note}"


def _whole_gpu(v: JobView, s: Sizing, reason: str) -> Recommendation:
    """Exclusive, or a smaller fleet model that still holds the job."""
    if v.th.downsize.enabled:
        target = smaller_model(s.model, s.need, s.demand_fraction, v.th, v.fleet)
        if target is not None:
            return v.rec(
                Kind.DOWNSIZE,
                f"{reason}; a {target.key} ({_gib(target.memory_bytes)}, {target.sm_count} SMs at "
                f"{target.max_sm_clock_mhz} MHz = {capability(target) / capability(s.model):.0%} of a "
                f"{s.model.key}) holds memory need {_gib(s.need)} and {_pct(s.demand_fraction)} of a "
                f"{s.model.key} + headroom",
                target_gpu_model=target.key,
                gpu_fraction=1.0,
                **_sized(v, s),
            )
    return v.rec(Kind.EXCLUSIVE, reason, gpu_fraction=1.0, **_sized(v, s))


def _serving_pressure(v: JobView, s: Sizing) -> Recommendation | None:
    """An inference server that queues or preempts keeps what it has: a smaller slice or pool
    would queue it more (its own metrics say its KV cache is already short)."""
    why = serving.pressure(v.row, v.th)
    if not why:
        return None
    sized = {**_sized(v, s), "memory_need_bytes": memory_need(v.f("memory_peak_bytes"), v.th)}
    profile = str(v.row.get("mig_profile_now") or "")
    if v.row["sharing"] == "mig" and profile:
        return v.rec(
            Kind.MIG,
            f"serving under pressure: {why}; never shrunk: keep its {profile} slice",
            mig_profile=profile,
            gpu_fraction=mig_fraction(s.model, s.model.mig_profile(profile)),
            **sized,
        )
    return v.rec(
        Kind.EXCLUSIVE,
        f"serving under pressure: {why}; never shrunk: keep a whole GPU",
        gpu_fraction=1.0,
        **sized,
    )


def _leaking(v: JobView, s: Sizing) -> Recommendation | None:
    """An exclusive job whose memory grows steadily stays alone: sized from the peak seen so far it
    would outgrow a slice or crowd out the jobs beside it."""
    leak = memory_leak(v.row, v.th)
    if not leak or v.row["sharing"] != "exclusive" or int(v.row["gpus"]) != 1:
        return None
    if restarting_leak(v.row, v.th):
        why = (
            "keep it alone until it is fixed, or restart it on a schedule before it fills the GPU: "
            "its peak before each restart is the leak, not steady demand (no false saturation), "
            "and a slice or a shared GPU would make each cycle end in an out-of-memory error"
        )
    else:
        why = (
            "keep it alone until it is fixed: a slice or a shared GPU sized from "
            "this peak would not hold it for long"
        )
    return v.rec(
        Kind.EXCLUSIVE,
        f"memory leak: {leak}; {why} ({_demand_text(s)})",
        gpu_fraction=1.0,
        **_sized(v, s),
    )


def _idle_dominated(v: JobView, s: Sizing) -> Recommendation | None:
    idle = v.f("idle_fraction")
    min_idle = v.th.time_slicing.min_idle_fraction
    if int(v.row["gpus"]) != 1 or idle < min_idle or s.need >= s.model.memory_bytes:
        return None
    return v.rec(
        Kind.TIME_SLICING,
        f"idle-dominated: idle in {_pct(idle)} of samples (>= {_pct(min_idle)}) with bursts to "
        f"{_pct(v.f('sm_active_max'))} ({_demand_text(s)}); time-slicing caps nothing, so bursts keep "
        f"the whole GPU; memory need {_gib(s.need)}",
        gpu_fraction=s.mem_fraction,
        **_sized(v, s),
    )


def _busy(v: JobView, s: Sizing) -> Recommendation | None:
    limit = v.th.exclusive.min_activity
    if s.demand_fraction < limit:
        return None
    return _whole_gpu(
        v,
        s,
        f"busy: {_demand_text(s)} = {_pct(s.demand_fraction)} of the GPU >= {_pct(limit)}; "
        f"a cap would throttle it in more than {_pct(s.binds)} of samples",
    )


def _multi_gpu(v: JobView, s: Sizing) -> Recommendation | None:
    gpus = int(v.row["gpus"])
    if gpus <= 1:
        return None
    return _whole_gpu(v, s, f"multi-GPU job ({gpus} GPUs) at {_demand_text(s)}: keep whole GPUs")


def _too_big(v: JobView, s: Sizing) -> Recommendation | None:
    if s.need <= s.model.memory_bytes:
        return None
    peak = v.f("memory_peak_bytes")
    return v.rec(
        Kind.EXCLUSIVE,
        f"peak memory {_gib(peak)} + headroom exceeds a {s.model.key}",
        gpu_fraction=1.0,
        **_sized(v, s),
    )


def _split_share(v: JobView, s: Sizing) -> Recommendation | None:
    """A job whose demand is only its time-split share (`timesplit.SPLIT`) stays time-sliced: the
    split cannot tell wide kernels from narrow ones, so a cap or slice sized from it may throttle
    the job (a renderer that needs 30 % read 22 % beside a narrow job)."""
    if not split_only(v.row):
        return None
    return v.rec(
        Kind.TIME_SLICING,
        f"time-sliced beside other jobs: its {_demand_text(s)} ({_pct(s.demand_fraction)} of the GPU) is "
        "a split of the GPU's activity by kernel time, which cannot tell wide kernels from narrow ones: "
        "no MPS cap or MIG slice is sized from it, it stays time-sliced (a week on a whole GPU, or "
        f"alone, measures what it needs); memory need {_gib(s.need)}",
        gpu_fraction=s.mem_fraction,
        **_sized(v, s),
    )


def _fraction(v: JobView, s: Sizing) -> Recommendation | None:
    """MIG when it packs about as densely as MPS, else MPS (always answers)."""
    th, model = v.th, s.model
    peak = v.f("memory_peak_bytes")
    settings = mps_settings(s.demand_fraction, s.need, th)
    mps_fraction = max(s.mem_fraction, settings.thread_percentage / 100)
    profile = choose_mig_profile(model, s.need, s.demand_sms) if model.mig_capable else None
    if profile is not None and profile.compute_slices == model.compute_slices:
        profile = None  # the full-GPU instance is a whole GPU: no sharing to recommend
    mig_frac = mig_fraction(model, profile) if profile else math.nan
    clients = th.mps.max_clients or model.mps_max_clients
    mps_density = min(clients, math.floor(1.0 / max(mps_fraction, 1e-6)))
    mig_density = profile.max_instances if profile else 0
    v.numbers.update(
        mps_gpu_fraction=mps_fraction,
        mig_gpu_fraction=mig_frac,
        mps_jobs_per_gpu=mps_density,
        mig_jobs_per_gpu=mig_density,
    )
    binds = f"binds in at most {_pct(s.binds)} of samples"
    on_mig = v.row["sharing"] == "mig"
    # a geometry of this profile alone that leaves compute slices idle (3g+3g) wins only if denser
    strands = profile is not None and profile.max_instances * profile.compute_slices < model.compute_slices
    denser = mig_density > mps_density or (
        mig_density >= th.mig.min_density_ratio * mps_density and not strands
    )
    if profile is not None and (on_mig or denser):
        return v.rec(
            Kind.MIG,
            f"fits {profile.name}: peak {_gib(peak)} + headroom <= {_gib(profile.memory_bytes)}, "
            f"{_demand_text(s)} of {s.device_sms:.0f} SMs + headroom = {s.demand_sms:.0f} SMs "
            f"<= {profile.sm_count} ({binds}); {mig_density} per GPU ({mps_density} with MPS)",
            mig_profile=profile.name,
            gpu_fraction=mig_frac,
            **_sized(v, s),
        )
    why_not_mig = (
        f"; MIG {profile.name} fits {mig_density} per GPU vs {mps_density} with MPS" if profile else ""
    )
    return v.rec(
        Kind.MPS,
        f"light: {_demand_text(s)} = {_pct(s.demand_fraction)} of the GPU + headroom -> "
        f"{settings.thread_percentage} % threads ({binds}), peak {_gib(peak)} -> "
        f"{_gib(settings.pinned_memory_limit_bytes)} pinned limit" + why_not_mig,
        mps_active_thread_percentage=settings.thread_percentage,
        mps_pinned_memory_limit_bytes=settings.pinned_memory_limit_bytes,
        mig_alternative=profile.name if profile else None,
        gpu_fraction=mps_fraction,
        **_sized(v, s),
    )


SizedRule = Callable[[JobView, Sizing], Recommendation | None]
SIZED_RULES: tuple[SizedRule, ...] = (
    _serving_pressure,
    _leaking,
    _idle_dominated,
    _busy,
    _multi_gpu,
    _too_big,
    _split_share,
    _fraction,
)


def recommend_one(row: Mapping[str, Any], th: Thresholds, fleet: Sequence[GpuModel]) -> Recommendation:
    """The first rule that answers, `PRE_RULES` then (once the job is sized) `SIZED_RULES`."""
    conf, level = confidence(row, th)
    numbers = {
        "samples": int(row["samples"]),
        "coverage": round(float(row["coverage"]), 3),
        "sm_active_mean": float(row["sm_active_mean"]),
        "sm_active_p95": float(row["sm_active_p95"]),
        "sm_active_p99": float(row["sm_active_p99"]),
        "idle_fraction": float(row["idle_fraction"]),
        "memory_peak_bytes": float(row["memory_peak_bytes"]),
    }
    view = JobView(row, th, fleet, str(row["job_id"]), conf, level, numbers)
    leak = memory_leak(row, th)
    numbers.update(
        memory_trend_bytes_per_hour=float(row.get("memory_trend_bytes_per_hour", math.nan)),
        memory_restarts=float(row.get("memory_restarts", math.nan)),
        memory_cycle_slope_bytes_per_hour=float(row.get("memory_cycle_slope_bytes_per_hour", math.nan)),
    )
    for rule in PRE_RULES:
        found = rule(view)
        if found is not None:
            if found.recommendation not in (Kind.INSUFFICIENT_DATA, Kind.RECLAIM):
                _flag_leak(found, leak)  # a model the catalog does not know, sized from memory
                _flag_serving(found, view)
            return found
    sizing = size(view)
    view.sizing = sizing
    numbers.update(
        memory_need_bytes=sizing.need,
        compute_demand=sizing.demand_fraction,
        sm_demand_sms=round(sizing.demand_sms, 2),
        mem_fraction=sizing.mem_fraction,
    )
    for sized_rule in SIZED_RULES:
        found = sized_rule(view, sizing)
        if found is not None:
            _flag_leak(found, leak)
            _flag_serving(found, view)
            _serving_advice(found, row, th, sizing)
            return found
    raise AssertionError("the last rule always answers")  # pragma: no cover


def _serving_advice(found: Recommendation, row: Mapping[str, Any], th: Thresholds, s: Sizing) -> None:
    """A server sized from its KV use: the reason says how, and names the flag value that
    allocates that much where it goes (its slice, its MPS limit's GPU, or its whole GPU). One that
    published its KV use but not its pool's bytes says which figure its server leaves out."""
    kv = serving.kv_need(row, th)
    if found.recommendation == Kind.RECLAIM:
        return
    if kv is None:
        note = serving.unsized(row, th)
        found.reason += f"; {note}" if note else ""
        return
    found.numbers.update(serving_floor_bytes=kv.floor, serving_footprint_bytes=kv.footprint)
    found.serving_floor_bytes = kv.floor
    if found.mig_profile:
        profile = s.model.mig_profile(found.mig_profile)
        where = kv.advice(profile.memory_bytes, f"a {profile.name}")
    else:
        where = kv.advice(s.model.memory_bytes, f"the {s.model.key}")
        if found.mps_pinned_memory_limit_bytes:
            where += f", held by its {_gib(found.mps_pinned_memory_limit_bytes)} MPS pinned limit"
    found.reason += f"; {kv.reason()}: set {where}"


def _flag_serving(found: Recommendation, v: JobView) -> None:
    """A job spared from `reclaim` because it serves says so in its reason and in `serves`."""
    evidence, note = _serving(v)
    if evidence is not None:
        found.reason += f"; {note}"
        found.serves = str(evidence)


def _flag_leak(found: Recommendation, leak: str) -> None:
    """Every sized recommendation carries the leak, and its reason says so."""
    found.memory_leak = leak
    if leak and not found.reason.startswith("memory leak"):
        found.reason += f"; memory leak: {leak}"


def fleet_models(profiles: pd.DataFrame) -> list[GpuModel]:
    """Catalog models present in the profiles (when no inventory is given)."""
    models = {model_for_nvml_name(str(name)) for name in profiles["gpu_model"].unique()}
    return sorted((m for m in models if m is not None), key=lambda m: m.key)


def recommend(
    profiles: pd.DataFrame, th: Thresholds, fleet: Sequence[GpuModel] | None = None
) -> pd.DataFrame:
    """Profiles joined with one recommendation per job (columns of `Recommendation`, minus numbers).

    `fleet`: the models downsizing may pick (the inventory's, idle GPUs included); by default the
    models the profiled jobs ran on.
    """
    fleet = fleet_models(profiles) if fleet is None else fleet
    # plain dict rows and attribute reads, not iterrows / asdict: a Series per row and a deep copy
    # per recommendation were most of the time for 10,000 jobs
    recs = [recommend_one(row, th, fleet) for row in frames.records(profiles)]
    columns = [f.name for f in fields(Recommendation) if f.name != "numbers"]
    rec_frame = pd.DataFrame([{k: getattr(r, k) for k in columns} for r in recs], columns=columns)
    rec_frame["numbers"] = [r.numbers for r in recs]
    out = profiles.merge(rec_frame, on="job_id", how="left")
    out.attrs.update(profiles.attrs)  # the jobs' demand series (`demand.ATTR`) go on to the plan
    return out
