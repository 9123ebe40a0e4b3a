"""What every analysis must satisfy, whatever the data (the issue's "done when" checks).

Used by the scenario, trace and property tests, so one definition says what "sound" means:

- no MIG slice, MPS pinned limit or downsize target below the job's observed peak memory (an
  inference server sized from its KV use: below its non-KV memory + peak KV use);
- no compute cap below a latency-sensitive job's p99 demand (MPS threads, MIG SMs);
- a plan never uses more GPUs of a model than the fleet has (freed per model >= 0), and
  every GPU of the inventory is counted before;
- no shared GPU commits more memory than it has.
"""

from __future__ import annotations

import math

import pandas as pd

from gpulens.analyzer.pipeline import Analysis
from gpulens.catalog import get_model, model_for_nvml_name


def _float(value: object) -> float:
    if value is None:
        return math.nan
    return float(value)  # type: ignore[arg-type]


def memory_violations(recs: pd.DataFrame) -> list[str]:
    """Jobs whose proposed slice, limit or model holds less than their observed peak memory."""
    bad = []
    for row in recs.itertuples(index=False):
        peak = _float(row.memory_peak_bytes)
        if math.isnan(peak):
            continue
        # an inference server sized from its KV use holds its pre-allocated pool, not its need:
        # the floor is the most it used (non-KV memory + peak KV use, analyzer/serving.py)
        floor = _float(getattr(row, "serving_floor_bytes", math.nan))
        peak = peak if math.isnan(floor) else floor
        kind = row.recommendation
        model = model_for_nvml_name(str(row.gpu_model))
        mig = isinstance(row.mig_profile, str)
        if (
            kind == "mig"
            and mig
            and model is not None
            and model.mig_profile(row.mig_profile).memory_bytes < peak
        ):
            bad.append(f"{row.job_id}: {row.mig_profile} below peak {peak:.0f}")
        if kind == "mps" and _float(row.mps_pinned_memory_limit_bytes) < peak:
            bad.append(f"{row.job_id}: MPS limit {row.mps_pinned_memory_limit_bytes} below peak {peak:.0f}")
        if kind == "downsize-model" and get_model(str(row.target_gpu_model)).memory_bytes < peak:
            bad.append(f"{row.job_id}: {row.target_gpu_model} below peak {peak:.0f}")
    return bad


def compute_violations(recs: pd.DataFrame) -> list[str]:
    """Latency-sensitive jobs whose MPS threads or MIG SMs are below their p99 demand."""
    bad = []
    for row in recs[recs["latency_sensitive"].fillna(False).astype(bool)].itertuples(index=False):
        model = model_for_nvml_name(str(row.gpu_model))
        p99 = _float(row.sm_active_p99)
        if model is None or math.isnan(p99):
            continue
        device_sms = _float(row.device_sms) if not math.isnan(_float(row.device_sms)) else model.sm_count
        demand_sms = p99 * device_sms
        threads = _float(row.mps_active_thread_percentage)
        if row.recommendation == "mps" and threads / 100 * model.sm_count < demand_sms - 1e-6:
            bad.append(f"{row.job_id}: {row.mps_active_thread_percentage} % threads below p99 {p99:.2f}")
        slice_sms = model.mig_profile(row.mig_profile).sm_count if isinstance(row.mig_profile, str) else 0
        if row.recommendation == "mig" and slice_sms < demand_sms - 1e-6:
            bad.append(f"{row.job_id}: {row.mig_profile} below p99 {p99:.2f}")
    return bad


def plan_violations(analysis: Analysis, inventory: int | None = None) -> list[str]:
    """Negative freed per model, more GPUs than the inventory, over-committed memory."""
    plan = analysis.plan
    bad = [f"{m}: freed {v['gpus_freed']}" for m, v in plan.by_model.items() if v["gpus_freed"] < 0]
    if inventory is not None and plan.gpus_before != inventory:
        bad.append(f"gpus_before {plan.gpus_before} != inventory {inventory}")
    for entry in plan.layout:
        model = model_for_nvml_name(entry["model"])
        committed = entry.get("memory_committed_bytes")
        if model is not None and committed is not None and committed > model.memory_bytes:
            bad.append(f"{entry['gpu']}: {committed} bytes committed on a {model.key}")
    return bad


def violations(analysis: Analysis, inventory: int | None = None) -> list[str]:
    """Every check above, as readable lines (empty when sound)."""
    return (
        memory_violations(analysis.recs)
        + compute_violations(analysis.recs)
        + plan_violations(analysis, inventory)
    )
