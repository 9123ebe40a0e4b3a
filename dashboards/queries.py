"""PromQL fragments shared by several dashboards.

The definitions that must agree across panels (what "idle", "faulty" or a job's "share of a GPU"
means) live here once, written against the metric contract in docs/metrics.md. Where the recording
rules in alerts/recording_rules.yml provide the same thing precomputed, the dashboards use those.
"""

from __future__ import annotations

from gpulens.dashboards.common import CRITICAL_XID_REGEX, NODE_GPU

# attribution rows of real workloads (the MPS server is the pseudo-job job_source="system")
WORKLOAD = 'job_source!="system"'


def sel(metric: str, *matchers: str, base: str = NODE_GPU) -> str:
    """`metric{<base>, <matchers>}`: a selector that always honours the dashboard variables."""
    inner = ", ".join(m for m in (base, *matchers) if m)
    return f"{metric}{{{inner}}}"


def activity(base: str = NODE_GPU) -> str:
    """Per-GPU SM activity (recording rule): `gpu_sm_active_ratio` from GPM / DCGM where present,
    else NVML's coarser utilization. A MIG GPU reports its whole-GPU value on the parent."""
    return sel("instance_gpu:gpu_sm_active:ratio", base=base)


def memory_used_ratio(base: str = NODE_GPU) -> str:
    """Per-GPU memory used / total (recording rule)."""
    return sel("instance_gpu:gpu_memory_used:ratio", base=base)


def faulty_gpus(base: str = NODE_GPU, window: str = "1h") -> str:
    """One series per GPU that is lost, needs a reset / RMA, or had a critical Xid in `window`."""
    critical_xids = xid_events(window, f'xid=~"{CRITICAL_XID_REGEX}"', base=base)
    uncorrected = sel("gpu_ecc_errors_total", 'error="uncorrected"', 'scope="volatile"', base=base)
    return (
        "max by (instance, gpu) (\n"
        f"  {sel('gpu_up', base=base)} == 0\n"
        f"  or {sel('gpu_row_remap_pending', base=base)} == 1\n"
        f"  or {sel('gpu_row_remap_failed', base=base)} == 1\n"
        f"  or {sel('gpu_retired_pages_pending', base=base)} == 1\n"
        f"  or ({critical_xids}) > 0\n"
        f"  or increase({uncorrected}[{window}]) > 0\n"
        ")"
    )


def idle_gpus(base: str = NODE_GPU) -> str:
    """GPUs nobody uses: activity below 5 % and no process (the recording rule's definition)."""
    return f"{sel('instance_gpu:gpu_idle:bool', base=base)} == 1"


def busy_gpus(base: str = NODE_GPU) -> str:
    return f"{sel('instance_gpu:gpu_idle:bool', base=base)} == 0"


def idle_gpu_hours(base: str = NODE_GPU) -> str:
    """Idle GPU-hours over the dashboard range: mean idleness times the range in hours."""
    return f"sum(avg_over_time({sel('instance_gpu:gpu_idle:bool', base=base)}[$__range])) * $__range_s / 3600"


def slot_fraction(base: str = NODE_GPU) -> str:
    """Fraction of its GPU that each (GPU, MIG instance) slot holding a job represents.

    A MIG instance weighs its share of the GPU's instance SMs; a whole GPU weighs 1.
    """
    mig_sms = sel("gpu_mig_multiprocessors", base=base)
    whole = sel("gpu_job_info", 'gpu_instance=""', base=base)
    return (
        f"((sum by (instance, gpu, gpu_instance) ({mig_sms})"
        f" / on (instance, gpu) group_left () sum by (instance, gpu) ({mig_sms}))"
        f" or (max by (instance, gpu, gpu_instance) ({whole}) * 0 + 1))"
    )


def job_waste(base: str = NODE_GPU) -> str:
    """Per (slot, job): the part of a GPU the job holds but leaves idle, 0..1 of one GPU.

    A job's share of a slot is the slot's fraction divided by the jobs on it (MPS and time-slicing
    split a GPU); its use is its SM utilization scaled to the whole GPU (on MIG that utilization is
    relative to the instance). Waste = max(share - use, 0), so shared GPUs are never counted twice.
    The MPS server's pseudo-job (`job_source="system"`) is not a workload and takes no share.
    """
    frac = slot_fraction(base)
    workloads = sel("gpu_job_info", WORKLOAD, base=base)
    jobs = f"count by (instance, gpu, gpu_instance) ({workloads})"
    util = (
        f"max by (instance, gpu, gpu_instance, job_id) ({sel('gpu_job_sm_utilization_ratio', base=base)}"
        f" and on (instance, gpu, gpu_instance, job_id) {workloads})"
    )
    return (
        f"clamp_min(({frac} / {jobs})"
        f" - on (instance, gpu, gpu_instance) group_right ()"
        f" ({util} * on (instance, gpu, gpu_instance) group_left () {frac}), 0)"
    )


def top_wasteful_jobs(base: str = NODE_GPU, k: int = 10) -> str:
    """The `k` jobs with the most idle GPU-hours they held over the dashboard range.

    The waste is averaged at the panel's `$__interval` resolution (a subquery) and scaled by the
    range in hours, so a range shorter than any fixed step still has samples.
    """
    return (
        f"topk({k}, sum by (job_id) (avg_over_time(({job_waste(base)})[$__range:$__interval]))"
        " * $__range_s / 3600)"
    )


XID_RECENT = "instance_gpu_xid:gpu_xid_errors:increase10m"


def xid_events(window: str = "$__range", *matchers: str, base: str = NODE_GPU) -> str:
    """Xid events per (GPU, code) in `window`, counting a counter series born inside the window.

    A per-code counter appears with its first Xid, so `increase()` alone misses that first event;
    a series absent `window` ago contributes its whole value instead (as the recording rule does).
    """
    counter = sel("gpu_xid_errors_total", *matchers, base=base)
    return f"({counter} unless {counter} offset {window}) or increase({counter}[{window}])"
