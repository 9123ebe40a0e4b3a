"""MIG instances: identity, memory, SMs and processes per GPU instance.

Only per-instance values are here; device-wide values (power, temperature, clocks) stay on the parent
series, so sums over instances never double count. Instances are re-enumerated every sample.
`gpu_mig_memory_used_bytes` excludes the instance's reserved memory, like the parent's
`gpu_memory_used_bytes`, so the instances' used memory sums to the parent's used memory.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    MIG_LABELS,
    CollectorOptions,
    CollectorSpec,
    add_optional,
    gauge,
    gpu_labels,
    non_empty,
    readable,
)
from gpulens.exporter.snapshot import Area, NodeSnapshot


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    info = gauge(
        "gpu_mig_instance_info",
        "MIG device (GPU instance with its compute instance) identity (NVML MIG device handles); always 1.",
        [*GPU_LABELS, "gpu_instance", "compute_instance", "mig_profile", "mig_uuid"],
    )
    total = gauge(
        "gpu_mig_memory_total_bytes",
        "Memory of the MIG instance (NVML memory info v2 of the MIG handle).",
        MIG_LABELS,
    )
    used = gauge(
        "gpu_mig_memory_used_bytes",
        "Memory allocated in the MIG instance, excluding its reserved memory"
        " (NVML memory info v2 of the MIG handle).",
        MIG_LABELS,
    )
    reserved = gauge(
        "gpu_mig_memory_reserved_bytes",
        "Memory of the MIG instance reserved by the driver (NVML memory info v2).",
        MIG_LABELS,
    )
    sms = gauge(
        "gpu_mig_multiprocessors",
        "Streaming multiprocessors of the MIG instance (NVML device attributes).",
        MIG_LABELS,
    )
    procs = gauge(
        "gpu_mig_processes",
        "Compute and graphics processes on the MIG instance (NVML process lists).",
        MIG_LABELS,
    )
    for gpu in readable(snapshot, Area.MIG):
        base = gpu_labels(gpu)
        for m in gpu.mig_instances:
            info.add_metric([*base, str(m.gpu_instance), str(m.compute_instance), m.profile, m.uuid], 1.0)
            labels = [*base, str(m.gpu_instance), m.profile]
            add_optional(total, labels, m.memory_total_bytes)
            add_optional(used, labels, m.memory_used_bytes)
            add_optional(reserved, labels, m.memory_reserved_bytes)
            add_optional(sms, labels, m.multiprocessors)
            procs.add_metric(labels, float(len(m.processes)))
    yield from non_empty(info, total, used, reserved, sms, procs)


SPEC = CollectorSpec(Area.MIG, True, "MIG instance identity, memory, SMs and process counts", collect)
