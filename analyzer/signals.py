"""Which metric family measures what for a job, by sharing mode: the one table both sources use.

The file path (pandas over a history) and the Prometheus path (PromQL aggregation) read this
table, so they pick the same signal for the same job and produce the same profile.

- `exclusive` jobs own the whole GPU: device-wide SM activity describes the job.
- `mig` jobs own a GPU instance: per-instance activity (relative to the slice's SMs).
- `shared` (MPS, time-slicing) jobs share the device. Device SM activity split evenly among the
  jobs on the GPU at that step (`sm_active_share`) comes first: per-process utilization is a duty
  cycle whose client times overlap under MPS, so it overstates demand; it is the fallback, then
  the device duty cycle split the same way. The reason names the estimate used.

Each chain is tried in order; the first signal with at least one sample for a job is used, and
its name is reported as `activity_signal` so a reader knows whether SM activity or the coarser
NVML utilization ("a kernel was running") decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["gpu", "mig", "job", "gpu_share"]
Kind = Literal["exclusive", "mig", "shared"]


@dataclass(frozen=True)
class Signal:
    name: str  # reported name
    family: str  # metric family (docs/metrics.md)
    # gpu: join on uuid; mig: join on uuid + gpu_instance; job: series carry job_id;
    # gpu_share: the device value divided by the number of jobs on that GPU at that step
    scope: Scope


ACTIVITY: dict[str, tuple[Signal, ...]] = {
    "exclusive": (
        Signal("sm_active", "gpu_sm_active_ratio", "gpu"),
        Signal("utilization", "gpu_utilization_ratio", "gpu"),
        Signal("job_sm_utilization", "gpu_job_sm_utilization_ratio", "job"),
    ),
    "mig": (
        Signal("sm_active", "gpu_mig_sm_active_ratio", "mig"),
        # on MIG the exporter fills the per-job family with the instance's activity
        Signal("instance_activity", "gpu_job_sm_utilization_ratio", "job"),
    ),
    "shared": (
        Signal("sm_active_share", "gpu_sm_active_ratio", "gpu_share"),
        Signal("job_sm_utilization", "gpu_job_sm_utilization_ratio", "job"),
        Signal("utilization_share", "gpu_utilization_ratio", "gpu_share"),
    ),
}

# duty-cycle signals: fraction of time a kernel ran, not of SMs used (see recommend.py, "activity
# basis"). NVML process utilization (`smUtil`) is time-based too, and under MPS the clients' times
# overlap, so it cannot be summed as SM demand.
DUTY_CYCLE = frozenset({"utilization", "utilization_share", "job_sm_utilization"})

# job_source of pseudo-jobs that are infrastructure, not work (the MPS server); never profiled
SYSTEM_SOURCE = "system"

MEMORY: dict[str, tuple[Signal, ...]] = {
    "exclusive": (
        Signal("job_memory", "gpu_job_memory_used_bytes", "job"),
        Signal("gpu_memory", "gpu_memory_used_bytes", "gpu"),
    ),
    "mig": (
        Signal("job_memory", "gpu_job_memory_used_bytes", "job"),
        Signal("mig_memory", "gpu_mig_memory_used_bytes", "mig"),
    ),
    "shared": (Signal("job_memory", "gpu_job_memory_used_bytes", "job"),),
}

DRAM: dict[str, tuple[Signal, ...]] = {
    "exclusive": (Signal("dram_active", "gpu_dram_active_ratio", "gpu"),),
    "mig": (Signal("dram_active", "gpu_mig_dram_active_ratio", "mig"),),
    "shared": (),
}

TENSOR: dict[str, tuple[Signal, ...]] = {
    "exclusive": (Signal("tensor_active", "gpu_tensor_active_ratio", "gpu"),),
    "mig": (Signal("tensor_active", "gpu_mig_tensor_active_ratio", "mig"),),
    "shared": (),
}

# identity labels of gpu_job_info that the profile carries
IDENTITY_LABELS: tuple[str, ...] = (
    "instance",
    "job_source",
    "job_user",
    "job_namespace",
    "job_pod",
    "job_container",
    "sharing",
)


def job_kind(sharing: str, gpu_instance: str) -> Kind:
    """The signal table a job uses, from its `sharing` label (or MIG-ness when the label is absent)."""
    if sharing in ("mps", "time_slicing", "time-slicing"):
        return "shared"
    if sharing == "mig" or (not sharing and gpu_instance):
        return "mig"
    return "exclusive"
