"""Per-job usage from the attribution engine: an identity series plus usage series per job.

Jobs are keyed by (GPU, GPU instance, job id). `gpu_instance` is empty on GPUs without MIG. The
values of `gpu_job_memory_used_bytes` on a GPU add up to the memory NVML reports for its processes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import GPU_LABELS, CollectorOptions, CollectorSpec, gauge, non_empty
from gpulens.exporter.snapshot import Area, NodeSnapshot

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
        "SM utilization of the job (NVML process utilization summed; on MIG the instance's SM activity).",
        USAGE_LABELS,
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
    yield from non_empty(info, mem, sm, procs)


SPEC = CollectorSpec(Area.JOBS, True, "per-job identity, memory, SM utilization and process count", collect)
