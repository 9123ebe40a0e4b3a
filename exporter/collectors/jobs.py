"""Per-job usage from the attribution engine: an identity series plus usage series per job.

Jobs are keyed by (GPU, GPU instance, job id). `gpu_instance` is empty on GPUs without MIG. The
values of `gpu_job_memory_used_bytes` on a GPU add up to the memory NVML reports for its processes.
`gpu_job_sm_utilization_ratio` is each job's share of the device's SM figure (attribution/shares.py)
and `gpu_job_sm_unattributed_ratio` the rest, so the two add up to `snapshot.sm_figure` of every GPU
(every MIG instance on a MIG GPU); the remainder is left out when attribution failed this sample.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import GPU_LABELS, CollectorOptions, CollectorSpec, gauge, non_empty
from gpulens.exporter.snapshot import Area, NodeSnapshot, sm_figure

USAGE_LABELS = [*GPU_LABELS, "gpu_instance", "job_id"]


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    info = gauge(
        "gpu_job_info",
        "A job running on the GPU or MIG instance, where its identity came from and how the GPU is"
        " shared; always 1.",
        [
            *GPU_LABELS,
            "gpu_instance",
            "job_id",
            "job_source",
            "job_user",
            "job_namespace",
            "job_pod",
            "job_container",
            "sharing",
        ],
    )
    mem = gauge(
        "gpu_job_memory_used_bytes",
        "GPU memory used by the job's processes (NVML per-process used memory, summed).",
        USAGE_LABELS,
    )
    sm = gauge(
        "gpu_job_sm_utilization_ratio",
        "The job's share of the device's SM figure (gpu_sm_active_ratio, else gpu_utilization_ratio; on"
        " MIG gpu_mig_sm_active_ratio), split by the processes' NVML utilization.",
        USAGE_LABELS,
    )
    unattributed = gauge(
        "gpu_job_sm_unattributed_ratio",
        "The part of the device's SM figure no job's processes account for: with the jobs'"
        " gpu_job_sm_utilization_ratio it adds up to the figure.",
        [*GPU_LABELS, "gpu_instance"],
    )
    procs = gauge("gpu_job_processes", "Processes of the job on the GPU or MIG instance.", USAGE_LABELS)
    usage: dict[tuple[str, ...], list[float | None]] = {}
    seen_info: set[tuple[str, ...]] = set()
    for job in snapshot.jobs:
        gi = "" if job.gpu_instance is None else str(job.gpu_instance)
        ident = job.identity
        info_labels = (
            str(job.gpu),
            job.uuid,
            gi,
            ident.job_id,
            ident.source,
            ident.user,
            ident.namespace,
            ident.pod,
            ident.container,
            job.sharing,
        )
        if info_labels not in seen_info:
            seen_info.add(info_labels)
            info.add_metric(list(info_labels), 1.0)
        key: tuple[str, ...] = (str(job.gpu), job.uuid, gi, ident.job_id)
        row = usage.setdefault(key, [0.0, None, 0.0])
        row[0] = float(row[0] or 0) + job.memory_used_bytes
        if job.sm_utilization_ratio is not None:
            row[1] = min(1.0, float(row[1] or 0) + job.sm_utilization_ratio)
        row[2] = float(row[2] or 0) + job.processes
    for key, (memory, ratio, count) in usage.items():
        labels = list(key)
        mem.add_metric(labels, float(memory or 0))
        if ratio is not None:
            sm.add_metric(labels, ratio)
        procs.add_metric(labels, float(count or 0))
    shared: dict[tuple[str, str], float] = {}
    for (gpu, _uuid, gi, _job), (_mem, ratio, _count) in usage.items():
        shared[(gpu, gi)] = shared.get((gpu, gi), 0.0) + float(ratio or 0.0)
    for gpu_sample in snapshot.gpus if not snapshot.jobs_error else ():
        if not gpu_sample.up:
            continue
        device = gpu_sample.identity
        devices = [(str(m.gpu_instance), sm_figure(m)) for m in gpu_sample.mig_instances] or [
            ("", sm_figure(gpu_sample))
        ]
        for gi, figure in devices:
            if figure is not None:
                rest = max(0.0, min(figure, 1.0) - shared.get((str(device.index), gi), 0.0))
                unattributed.add_metric([str(device.index), device.uuid, gi], rest)
    yield from non_empty(info, mem, sm, procs, unattributed)


SPEC = CollectorSpec(Area.JOBS, True, "per-job identity, memory, SM utilization and process count", collect)
