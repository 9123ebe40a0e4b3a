"""One explainable recommendation per job profile.

Decision order (each step names the numbers that decided it; thresholds come from YAML):

1. `insufficient-data`: too few samples or too little coverage to say anything.
2. `reclaim`: allocated and idle (p95 activity and idle fraction both say nothing ran).
3. `exclusive`: busy (activity at or above `exclusive.min_activity`), multi-GPU, or needing more
   than half a GPU.
   In a heterogeneous fleet such a job may instead get `downsize-model` when a smaller model in
   the fleet holds its peak memory and SM demand with headroom.
4. `time-slicing`: idle-dominated single-GPU work with bursts (notebooks, interactive), small
   memory; checked before "busy" because its bursts are what time-slicing serves.
5. `mig` or `mps`: the job fits a fraction of the GPU. The MIG profile is chosen memory first
   (smallest with memory >= need) then compute (SMs >= demand scaled to the slice's SM count);
   MPS gets an active-thread percentage from SM demand and a pinned memory limit from memory
   need. MIG wins when it packs at least `mig.min_density_ratio` as many such jobs per GPU as
   MPS would (isolation of memory bandwidth, faults and SMs for a small loss in density);
   otherwise MPS packs tighter and wins.

Memory need is never below peak + headroom: `max(peak * (1 + ratio), peak + min_bytes)`.

Compute demand is measured on the "activity basis": p95 of SM activity when the signal is SM
activity (GPM/DCGM, or per-process SM utilization), but the MEAN when only NVML utilization
(duty cycle) is available: duty cycle is the fraction of time any kernel ran, whatever number of
SMs it used, and its per-sample value is close to 0 or 1 for jobs that launch kernels in bursts,
so its p95 says nothing about SM demand while its mean bounds mean SM activity from above.
Fractions of the GPU compare the basis as measured; headroom is added to limits and slice sizes.

"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import pandas as pd

from gpulens.analyzer.signals import DUTY_CYCLE
from gpulens.analyzer.thresholds import Thresholds
from gpulens.catalog import GIB, MIB, GpuModel, MigProfile, model_for_nvml_name

RECOMMENDATIONS = (
    "exclusive",
    "mig",
    "mps",
    "time-slicing",
    "reclaim",
    "downsize-model",
    "insufficient-data",
)

ALLOCATOR_HINT = (
    "memory looks pre-allocated: check TF_FORCE_GPU_ALLOW_GROWTH=true (TensorFlow), "
    "XLA_PYTHON_CLIENT_PREALLOCATE=false / XLA_PYTHON_CLIENT_MEM_FRACTION (JAX), "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and torch.cuda.memory_reserved() vs "
    "memory_allocated() (PyTorch), vLLM --gpu-memory-utilization; memory, not compute, blocks sharing"
)


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
    sm_fraction: float | None = None  # activity basis as a fraction of the whole GPU (packing)
    gpu_fraction: float | None = None  # fraction of one GPU the recommendation occupies
    false_saturation: bool = False
    false_saturation_hint: str = ""
    numbers: dict[str, float] = field(default_factory=dict)


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def memory_need(peak: float, th: Thresholds) -> float:
    """Peak plus headroom: the floor for any slice or MPS memory limit."""
    return max(peak * (1 + th.get("headroom", "memory_ratio")), peak + th.get("headroom", "memory_min_bytes"))


def confidence(row: Mapping[str, Any], th: Thresholds) -> tuple[float, str]:
    """From coverage (how much of the lifetime was seen), sample count and variability (CV)."""
    coverage = float(row["coverage"]) if not math.isnan(row["coverage"]) else 0.0
    size = min(1.0, float(row["samples"]) / th.get("confidence", "full_samples"))
    burst = row["burstiness"]
    stability = 1.0 / (1.0 + 0.5 * (0.0 if math.isnan(burst) else float(burst)))
    value = round(min(1.0, coverage) * math.sqrt(size) * stability, 2)
    level = "high" if value >= th.get("confidence", "high") else "medium"
    if value < th.get("confidence", "medium"):
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


def thread_percentage(sm_fraction: float, th: Thresholds) -> int:
    """MPS active-thread percentage: SM demand rounded up to 5 %, at least the configured floor."""
    pct = math.ceil(sm_fraction * 100 / 5 - 1e-9) * 5
    return int(min(100, max(th.get("mps", "min_thread_percentage"), pct)))


def pinned_limit(need: float) -> int:
    """MPS pinned memory limit in bytes, rounded up to a whole MiB (never below need)."""
    return int(math.ceil(need / MIB) * MIB)


def _downsize(
    row: Mapping[str, Any], model: GpuModel, need: float, demand_sms: float, fleet: list[GpuModel]
) -> GpuModel | None:
    smaller = [
        m
        for m in fleet
        if m.memory_bytes < model.memory_bytes and m.memory_bytes >= need and m.sm_count >= demand_sms
    ]
    return min(smaller, key=lambda m: (m.memory_bytes, m.sm_count)) if smaller else None


def recommend_one(row: Mapping[str, Any], th: Thresholds, fleet: list[GpuModel]) -> Recommendation:
    """The decision for one profile row (see the module docstring for the order)."""
    conf, level = confidence(row, th)
    job = str(row["job_id"])
    samples, coverage = int(row["samples"]), float(row["coverage"])
    p95, mean, idle = float(row["sm_active_p95"]), float(row["sm_active_mean"]), float(row["idle_fraction"])
    peak = float(row["memory_peak_bytes"])
    numbers = {
        "samples": samples,
        "coverage": round(coverage, 3),
        "sm_active_mean": mean,
        "sm_active_p95": p95,
        "idle_fraction": idle,
        "memory_peak_bytes": peak,
    }

    def rec(kind: str, reason: str, **kw: object) -> Recommendation:
        return Recommendation(job, kind, reason, conf, level, numbers=numbers, **kw)  # type: ignore[arg-type]

    min_samples, min_cov = th.get("data", "min_samples"), th.get("data", "min_coverage")

    def no_data(reason: str) -> Recommendation:
        return Recommendation(job, "insufficient-data", reason, 0.0, "low", numbers=numbers)

    if row["activity_signal"] == "none":
        return no_data(
            f"no activity samples in {samples} samples: the exporter reported neither SM activity nor "
            "utilization for this job (e.g. MIG on a pre-Hopper GPU without DCGM)"
        )
    if samples < min_samples or coverage < min_cov or math.isnan(p95):
        return no_data(
            f"{samples} samples, {_pct(coverage)} coverage ({row['activity_signal']}); "
            f"need >= {min_samples:.0f} samples and >= {_pct(min_cov)} coverage"
        )
    hours = float(row["gpu_hours_allocated"])
    if p95 < th.get("reclaim", "max_p95") and idle >= th.get("reclaim", "min_idle_fraction"):
        return rec(
            "reclaim",
            f"allocated and idle: idle in {_pct(idle)} of samples, p95 activity {_pct(p95)}, "
            f"{hours:.1f} GPU-hours allocated, {float(row['gpu_hours_used']):.2f} used",
            gpu_fraction=0.0,
        )
    model = model_for_nvml_name(str(row["gpu_model"]))
    if model is None:
        return no_data(f"GPU model {row['gpu_model']!r} is not in the catalog; pass --gpu-model")
    if math.isnan(peak):
        return Recommendation(
            job,
            "insufficient-data",
            "no GPU memory samples: cannot size a slice safely",
            0.0,
            "low",
            numbers=numbers,
        )
    need = memory_need(peak, th)
    duty_only = row["activity_signal"] in DUTY_CYCLE
    basis = mean if duty_only else p95
    basis_name = "mean duty cycle" if duty_only else "p95 SM activity"
    if row["sharing"] == "mig" and row["mig_profile_now"]:
        basis_name += f" of its {row['mig_profile_now']} slice"
    if str(row["activity_signal"]).endswith("_share"):
        basis_name += " (device activity split among the GPU's jobs)"
    device_sms = float(row["device_sms"]) if not math.isnan(row["device_sms"]) else float(model.sm_count)
    demand_sms = basis * device_sms * (1 + th.get("headroom", "compute_ratio"))
    sm_fraction = min(1.0, basis * device_sms / model.sm_count)
    mem_fraction = need / model.memory_bytes
    numbers.update(
        memory_need_bytes=need,
        sm_demand_sms=round(demand_sms, 2),
        sm_fraction=sm_fraction,
        mem_fraction=mem_fraction,
    )
    saturated = peak / float(row["device_memory_bytes"] or model.memory_bytes) >= th.get(
        "false_saturation", "min_memory_fraction"
    ) and mean < th.get("false_saturation", "max_mean_activity")
    flags = {"false_saturation": saturated, "false_saturation_hint": ALLOCATOR_HINT if saturated else ""}
    sizing = {"memory_need_bytes": need, "sm_demand_sms": demand_sms, "sm_fraction": sm_fraction}

    def exclusive(reason: str) -> Recommendation:
        busy = sm_fraction >= th.get("exclusive", "min_activity")
        if th.get("downsize", "enabled") and not busy:
            target = _downsize(row, model, need, demand_sms, fleet)
            if target is not None:
                return rec(
                    "downsize-model",
                    f"{reason}; a {target.key} ({_gib(target.memory_bytes)}, {target.sm_count} SMs) holds "
                    f"peak {_gib(peak)} + headroom and {demand_sms:.0f} SMs of demand",
                    target_gpu_model=target.key,
                    gpu_fraction=1.0,
                    **sizing,
                    **flags,
                )
        return rec("exclusive", reason, gpu_fraction=1.0, **sizing, **flags)

    gpus = int(row["gpus"])
    ts_idle = th.get("time_slicing", "min_idle_fraction")
    if gpus == 1 and idle >= ts_idle and mem_fraction <= th.get("time_slicing", "max_memory_fraction"):
        return rec(
            "time-slicing",
            f"idle-dominated: idle in {_pct(idle)} of samples (>= {_pct(ts_idle)}) with bursts to "
            f"{_pct(float(row['sm_active_max']))}, memory need {_gib(need)}",
            gpu_fraction=mem_fraction,
            **sizing,
            **flags,
        )
    if sm_fraction >= th.get("exclusive", "min_activity"):
        limit = th.get("exclusive", "min_activity")
        return exclusive(
            f"busy: {basis_name} {_pct(basis)} = {_pct(sm_fraction)} of the GPU >= {_pct(limit)}"
        )
    if gpus > 1:
        return exclusive(f"multi-GPU job ({gpus} GPUs) at p95 {_pct(p95)}: keep whole GPUs")
    if need > model.memory_bytes:
        return exclusive(f"peak memory {_gib(peak)} + headroom exceeds a {model.key}")
    mps_fraction = max(mem_fraction, sm_fraction)
    profile = choose_mig_profile(model, need, demand_sms) if model.mig_capable else None
    if profile is not None and profile.compute_slices == model.compute_slices:
        profile = None  # the full-GPU instance is a whole GPU: no sharing to recommend
    mig_frac = mig_fraction(model, profile) if profile else math.inf
    numbers.update(mps_gpu_fraction=mps_fraction, mig_gpu_fraction=mig_frac if profile else math.nan)
    if min(mps_fraction, mig_frac) > 0.5:
        return exclusive(
            f"needs more than half a {model.key}: memory {_gib(need)} ({_pct(mem_fraction)}), "
            f"SM demand {_pct(sm_fraction)}"
        )
    clients = th.get("mps", "max_clients") or model.mps_max_clients
    mps_density = min(clients, math.floor(1.0 / max(mps_fraction, 1e-6)))
    mig_density = profile.max_instances if profile else 0
    numbers.update(mps_jobs_per_gpu=mps_density, mig_jobs_per_gpu=mig_density)
    on_mig = row["sharing"] == "mig"
    if profile is not None and (on_mig or mig_density >= th.get("mig", "min_density_ratio") * mps_density):
        return rec(
            "mig",
            f"fits {profile.name}: peak {_gib(peak)} + headroom <= {_gib(profile.memory_bytes)}, "
            f"{basis_name} {_pct(basis)} of {device_sms:.0f} SMs + headroom = {demand_sms:.0f} SMs "
            f"<= {profile.sm_count}; {mig_density} per GPU ({mps_density} with MPS)",
            mig_profile=profile.name,
            gpu_fraction=mig_frac,
            **sizing,
            **flags,
        )
    pct = thread_percentage(demand_sms / model.sm_count, th)
    limit = pinned_limit(need)
    why_not_mig = (
        f"; MIG {profile.name} fits {mig_density} per GPU vs {mps_density} with MPS" if profile else ""
    )
    return rec(
        "mps",
        f"light: {basis_name} {_pct(basis)} -> {pct} % threads, "
        f"peak {_gib(peak)} -> {_gib(limit)} pinned limit" + why_not_mig,
        mps_active_thread_percentage=pct,
        mps_pinned_memory_limit_bytes=limit,
        mig_alternative=profile.name if profile else None,
        gpu_fraction=mps_fraction,
        **sizing,
        **flags,
    )


def fleet_models(profiles: pd.DataFrame) -> list[GpuModel]:
    """Catalog models present in the data: downsize targets only come from the fleet itself."""
    models = {model_for_nvml_name(str(name)) for name in profiles["gpu_model"].unique()}
    return sorted((m for m in models if m is not None), key=lambda m: m.key)


def recommend(profiles: pd.DataFrame, th: Thresholds, fleet: list[GpuModel] | None = None) -> pd.DataFrame:
    """Profiles joined with one recommendation per job (columns of `Recommendation`, minus numbers)."""
    fleet = fleet_models(profiles) if fleet is None else fleet
    # plain dict rows and attribute reads, not iterrows / asdict: a Series per row and a deep copy
    # per recommendation were most of the time for 10,000 jobs
    recs = [recommend_one(row, th, fleet) for row in profiles.to_dict("records")]
    columns = [f.name for f in fields(Recommendation) if f.name != "numbers"]
    rec_frame = pd.DataFrame([{k: getattr(r, k) for k in columns} for r in recs], columns=columns)
    rec_frame["numbers"] = [r.numbers for r in recs]
    return profiles.merge(rec_frame, on="job_id", how="left")
