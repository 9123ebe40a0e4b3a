"""Build small synthetic histories (sample frames) for analyzer tests.

Jobs are described by what they did (activity and memory per step); the frame holds the series
the exporter would have produced for them, with the labels of docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

GIB = 1024**3
STEP = 60.0
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a multiple of every step used in tests


@dataclass
class SynthJob:
    job_id: str
    uuid: str
    activity: np.ndarray  # one value per step of the job's lifetime (0..1)
    memory: np.ndarray  # bytes per step
    model: str = "NVIDIA A100-SXM4-40GB"
    sharing: str = "exclusive"
    gpu_instance: str = ""
    mig_profile: str = ""
    first_step: int = 0
    user: str = "alice"
    namespace: str = "team-a"
    node: str = "node-1"
    extra_uuids: list[str] = field(default_factory=list)
    activity_family: str | None = None  # override the family the activity is written to
    dram: np.ndarray | None = None  # DRAM activity per step (exclusive jobs: gpu_dram_active_ratio)
    source: str = "slurm"
    name: str = ""  # job_name (a Slurm job's name)
    # an MPS client's active-thread cap per step as the exporter measures it (a ratio; NaN: none
    # published at that step): gpu_job_mps_active_thread_ratio
    thread_cap: np.ndarray | None = None
    # its duty cycle per step (the time it ran kernels) as the exporter publishes it:
    # gpu_job_duty_cycle_ratio
    duty: np.ndarray | None = None


def steady(n: int, level: float, jitter: float = 0.02, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(level + rng.normal(0, jitter, n), 0, 1)


def flat(n: int, value: float) -> np.ndarray:
    return np.full(n, float(value))


@dataclass
class IdleGpu:
    """A GPU that reports `gpu_info` for `steps` steps and runs no job."""

    uuid: str
    model: str = "NVIDIA A100-SXM4-40GB"
    node: str = "node-1"
    steps: int = 60


def frame(
    jobs: list[SynthJob], step: float = STEP, start: float = START, idle: list[IdleGpu] | None = None
) -> pd.DataFrame:
    """Long sample table (history schema) for the jobs (and GPUs that ran none)."""
    rows: list[dict[str, Any]] = []
    gpus_seen: dict[str, tuple[str, str, set[int]]] = {
        gpu.uuid: (gpu.model, gpu.node, set(range(gpu.steps))) for gpu in idle or []
    }
    for job in jobs:
        n = len(job.activity)
        for k in range(n):
            t = start + (job.first_step + k) * step
            for uuid in [job.uuid, *job.extra_uuids]:
                gpus_seen.setdefault(uuid, (job.model, job.node, set()))[2].add(job.first_step + k)
                base = {"timestamp": t, "instance": job.node, "uuid": uuid, "gpu": uuid[-1:]}
                rows.append(
                    {
                        **base,
                        "metric": "gpu_job_info",
                        "value": 1.0,
                        "gpu_instance": job.gpu_instance,
                        "job_id": job.job_id,
                        "job_source": job.source,
                        "job_user": job.user,
                        "job_name": job.name,
                        "job_namespace": job.namespace,
                        "sharing": job.sharing,
                    }
                )
                act = float(job.activity[k])
                mem = float(job.memory[k])
                if job.sharing == "mig":
                    mig = {**base, "gpu_instance": job.gpu_instance, "mig_profile": job.mig_profile}
                    rows.append({**mig, "metric": "gpu_mig_instance_info", "value": 1.0})
                    rows.append(
                        {**mig, "metric": job.activity_family or "gpu_mig_sm_active_ratio", "value": act}
                    )
                elif job.sharing in ("mps", "time_slicing"):
                    rows.append(
                        {
                            **base,
                            "metric": job.activity_family or "gpu_job_sm_utilization_ratio",
                            "job_id": job.job_id,
                            "value": act,
                        }
                    )
                else:
                    rows.append(
                        {**base, "metric": job.activity_family or "gpu_sm_active_ratio", "value": act}
                    )
                    if job.dram is not None:
                        rows.append({**base, "metric": "gpu_dram_active_ratio", "value": float(job.dram[k])})
                rows.append(
                    {
                        **base,
                        "metric": "gpu_job_memory_used_bytes",
                        "gpu_instance": job.gpu_instance,
                        "job_id": job.job_id,
                        "value": mem,
                    }
                )
                if job.duty is not None:
                    rows.append(
                        {
                            **base,
                            "metric": "gpu_job_duty_cycle_ratio",
                            "gpu_instance": job.gpu_instance,
                            "job_id": job.job_id,
                            "value": float(job.duty[k]),
                        }
                    )
                if job.thread_cap is not None and not np.isnan(job.thread_cap[k]):
                    rows.append(
                        {
                            **base,
                            "metric": "gpu_job_mps_active_thread_ratio",
                            "gpu_instance": job.gpu_instance,
                            "job_id": job.job_id,
                            "value": float(job.thread_cap[k]),
                        }
                    )
    for uuid, (model, node, steps) in gpus_seen.items():
        for k in sorted(steps):
            rows.append(
                {
                    "timestamp": start + k * step,
                    "metric": "gpu_info",
                    "value": 1.0,
                    "instance": node,
                    "uuid": uuid,
                    "gpu": uuid[-1:],
                    "model": model,
                }
            )
    out = pd.DataFrame(rows)
    return out.fillna("")


def seed_case(n: int = 120) -> list[SynthJob]:
    """Four ~10 GB low-activity jobs, each alone on an A100-40GB."""
    return [
        SynthJob(
            job_id=f"seed-{i}",
            uuid=f"GPU-seed-000{i}",
            activity=steady(n, 0.15, 0.03, seed=i),
            memory=flat(n, 10e9),
        )
        for i in range(4)
    ]


def with_device_shares(samples: pd.DataFrame, remainder: float = 0.05, profiled: bool = True) -> pd.DataFrame:
    """What today's exporter adds for shared GPUs: per GPU and step, the device's SM figure (SM
    activity when `profiled`, else NVML utilization) and the unattributed remainder, so that the
    jobs' `gpu_job_sm_utilization_ratio` shares plus the remainder add up to the figure."""
    jobs = samples[samples["metric"] == "gpu_job_sm_utilization_ratio"]
    per_gpu = jobs.groupby(["timestamp", "instance", "uuid", "gpu"], as_index=False)["value"].sum()
    rest = per_gpu.assign(metric="gpu_job_sm_unattributed_ratio", gpu_instance="", value=remainder)
    figure = "gpu_sm_active_ratio" if profiled else "gpu_utilization_ratio"
    device = per_gpu.assign(metric=figure, value=per_gpu["value"] + remainder)
    return pd.concat([samples, rest, device], ignore_index=True).fillna("")
