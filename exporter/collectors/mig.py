"""MIG instances: identity, memory, SMs and processes per GPU instance.

Only per-instance values are here; device-wide values (power, temperature, clocks) stay on the parent
series, so sums over instances never double count. Instances are re-enumerated every sample.
`gpu_mig_memory_used_bytes` excludes the instance's reserved memory, like the parent's
`gpu_memory_used_bytes`, so the instances' used memory sums to the parent's used memory.
`gpu_mig_instance_info` (labels beyond the instance's own) is filled here rather than by an accessor.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    MIG_LABELS,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    Unit,
    add_values,
    fresh,
    gpu_labels,
    non_empty,
    readable,
    readers,
)
from gpulens.exporter.snapshot import Area, MigSample, NodeSnapshot

_PER_INSTANCE = "per instance"
_MIG_LABELS = tuple(MIG_LABELS)

INFO = FamilySpec[MigSample](
    "gpu_mig_instance_info",
    Kind.GAUGE,
    "MIG device (GPU instance with its compute instance) identity (NVML MIG device handles); always 1.",
    "`GetMigDeviceHandleByIndex` (empty slots skipped), `GetGpuInstanceId`, `GetComputeInstanceId`,"
    " `GetUUID`; profile from the MIG device name (`... MIG 3g.40gb`)",
    labels=(*GPU_LABELS, "gpu_instance", "compute_instance", "mig_profile", "mig_uuid"),
    unit=Unit.ALWAYS_ONE,
    mig="per instance, re-enumerated every sample",
)

FAMILIES: tuple[FamilySpec[MigSample], ...] = (
    INFO,
    FamilySpec("gpu_mig_memory_total_bytes", Kind.GAUGE,
               "Memory of the MIG instance (NVML memory info v2 of the MIG handle).",
               "`GetMemoryInfo(v2)` of the MIG handle", lambda m: m.memory_total_bytes,
               labels=_MIG_LABELS, unit=Unit.BYTES, mig=_PER_INSTANCE),
    FamilySpec("gpu_mig_memory_used_bytes", Kind.GAUGE,
               "Memory allocated in the MIG instance, excluding its reserved memory"
               " (NVML memory info v2 of the MIG handle).",
               "`GetMemoryInfo(v2)` of the MIG handle; used = total - free - reserved",
               lambda m: m.memory_used_bytes, labels=_MIG_LABELS, unit=Unit.BYTES, mig=_PER_INSTANCE),
    FamilySpec("gpu_mig_memory_reserved_bytes", Kind.GAUGE,
               "Memory of the MIG instance reserved by the driver (NVML memory info v2).",
               "`GetMemoryInfo(v2)` of the MIG handle", lambda m: m.memory_reserved_bytes,
               labels=_MIG_LABELS, unit=Unit.BYTES, mig=_PER_INSTANCE),
    FamilySpec("gpu_mig_multiprocessors", Kind.GAUGE,
               "Streaming multiprocessors of the MIG instance (NVML device attributes).",
               "`GetAttributes(mig).multiprocessorCount`", lambda m: m.multiprocessors,
               labels=_MIG_LABELS, unit=Unit.MULTIPROCESSORS, mig=_PER_INSTANCE),
    FamilySpec("gpu_mig_processes", Kind.GAUGE,
               "Compute and graphics processes on the MIG instance (NVML process lists).",
               "compute + graphics process lists of the MIG handle", lambda m: len(m.processes),
               labels=_MIG_LABELS, unit=Unit.PROCESSES, mig=_PER_INSTANCE),
)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    reading, info = readers(FAMILIES, families), families[INFO.name]
    for gpu in readable(snapshot, Area.MIG):
        base = gpu_labels(gpu)
        for m in gpu.mig_instances:
            info.add_metric([*base, str(m.gpu_instance), str(m.compute_instance), m.profile, m.uuid], 1.0)
            add_values(reading, [*base, str(m.gpu_instance), m.profile], m)
    yield from non_empty(*families.values())


SPEC = CollectorSpec(
    Area.MIG, True, "MIG instance identity, memory, SMs and process counts", collect, families=FAMILIES
)
