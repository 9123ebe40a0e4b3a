"""Which metric family measures what for a job, by sharing mode: the one table both sources use.

The file path (pandas over a history) and the Prometheus path (PromQL aggregation) read this
table, so they pick the same signal for the same job and produce the same profile.

- `exclusive` jobs own the whole GPU: device-wide SM activity describes the job.
- `mig` jobs own a GPU instance: per-instance activity (relative to the slice's SMs).
- `shared` (MPS, time-slicing) jobs share the device. The exporter publishes each job's share of
  the device's SM figure (`gpu_job_sm_utilization_ratio`) and the part no job accounts for
  (`gpu_job_sm_unattributed_ratio`): per GPU they add up to the figure, SM activity where the GPU
  is profiled, else NVML utilization (docs/attribution.md). Where a GPU publishes the remainder,
  the job's own share plus its part of the remainder (in proportion to its share; on a capped
  MPS GPU by its room under its cap: `profile._room_split`) is used
  (`sm_active_share`, or `utilization_share` on an unprofiled GPU), so two jobs with different
  demand on one GPU get different sizes, and a job is measured on the same scale whole (it gets
  the whole figure) and shared (its GPU's jobs add up to the figure): a move is not a drop.
  Older data has no remainder: the per-job family was then raw per-process utilization, whose
  client times overlap under MPS, so the device's SM activity split equally among the GPU's
  jobs (`sm_active_equal_split`) comes next, then per-process utilization, then the device duty
  cycle split equally. The reason says when an equal split decided.

Each chain is tried in order; the first signal with at least one sample for a job is used, and
its name is reported as `activity_signal` so a reader knows whether SM activity or the coarser
NVML utilization ("a kernel was running") decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpulens.jobids import MPS_SERVER_JOB_ID

Scope = Literal["gpu", "mig", "job", "job_share", "gpu_share"]
Kind = Literal["exclusive", "mig", "shared"]

# the exporter's remainder of the device SM figure: where a GPU publishes it, the per-job family
# holds shares that add up (docs/attribution.md), not raw per-process utilization
UNATTRIBUTED = "gpu_job_sm_unattributed_ratio"
# the device's SM figure the shares divide when the GPU is profiled (else NVML utilization)
PROFILED_FIGURE = "gpu_sm_active_ratio"
# the active-thread cap an MPS client runs under, as the exporter measures it (a ratio per job and
# GPU): not a signal of demand, but the share of the GPU the client may use, which the plan's
# caps are judged against (`profile.thread_caps_now`); absent where it is not measured
THREAD_CAP = "gpu_job_mps_active_thread_ratio"
# the job id of the exporter's row for an MPS server process (`gpulens.jobids`, shared with the
# exporter): no kernels of its own, so never room for its clients' remainder (`profile._room_split`)
MPS_SERVER_JOB = MPS_SERVER_JOB_ID


@dataclass(frozen=True)
class Signal:
    name: str  # reported name
    family: str  # metric family (docs/metrics.md)
    # gpu: join on uuid; mig: join on uuid + gpu_instance; job: series carry job_id;
    # job_share: series carry job_id, kept at steps where the job's GPU (and instance) publishes
    #   UNATTRIBUTED and, by `figure`, has (gpu_sm_active_ratio) or lacks (gpu_utilization_ratio)
    #   the profiled figure;
    # gpu_share: the device value divided by the number of jobs on that GPU at that step
    scope: Scope
    figure: str = ""  # job_share: the device family the shares are of


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
        Signal("sm_active_share", "gpu_job_sm_utilization_ratio", "job_share", PROFILED_FIGURE),
        Signal("utilization_share", "gpu_job_sm_utilization_ratio", "job_share", "gpu_utilization_ratio"),
        Signal("sm_active_equal_split", "gpu_sm_active_ratio", "gpu_share"),
        Signal("job_sm_utilization", "gpu_job_sm_utilization_ratio", "job"),
        Signal("utilization_equal_split", "gpu_utilization_ratio", "gpu_share"),
    ),
}

# duty-cycle signals: fraction of time a kernel ran, not of SMs used (see recommend.py, "activity
# basis"). NVML process utilization (`smUtil`) is time-based too, and under MPS the clients' times
# overlap, so it cannot be summed as SM demand.
DUTY_CYCLE = frozenset({"utilization", "utilization_share", "utilization_equal_split", "job_sm_utilization"})
# shared-GPU estimates that split the device's figure equally (data without per-job shares)
EQUAL_SPLIT = frozenset({"sm_active_equal_split", "utilization_equal_split"})

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

# the time a job runs kernels (a fraction of the step): what a time-sliced neighbour waits for,
# whatever share of the SMs those kernels use. The exporter's per-job duty cycle (per-process NVML
# utilization summed) where published; a whole GPU's own duty cycle is its job's
BUSY: dict[str, tuple[Signal, ...]] = {
    "exclusive": (
        Signal("job_duty_cycle", "gpu_job_duty_cycle_ratio", "job"),
        Signal("utilization", "gpu_utilization_ratio", "gpu"),
    ),
    "mig": (Signal("job_duty_cycle", "gpu_job_duty_cycle_ratio", "job"),),
    "shared": (Signal("job_duty_cycle", "gpu_job_duty_cycle_ratio", "job"),),
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
    "job_name",
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
