"""MPS: whether an MPS server owns the GPU context, and its clients.

Per-client memory is attributed to the client's job by the jobs collector; here only totals.
`gpu_mig_mps_clients` is filled here rather than by an accessor: only instances running an MPS
server or clients have it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    MIG_LABELS,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    Unit,
    add_values,
    fresh,
    non_empty,
    per_gpu,
    readable,
    readers,
)
from gpulens.exporter.snapshot import NO_PROCESSES, Area, GpuSample, NodeSnapshot, ProcessKind

# The process lists are read with the device collector's reads (or the processes collector's): on a
# GPU whose lists were not read, no MPS server and no clients are counted.


def _clients(gpu: GpuSample) -> int:
    return len((gpu.processes or NO_PROCESSES).mps_clients)


def _clients_memory(gpu: GpuSample) -> float | None:
    """The MPS clients' memory summed; None when NVML reports it for none of them."""
    clients = (gpu.processes or NO_PROCESSES).mps_clients
    mems = [c.used_memory_bytes for c in clients if c.used_memory_bytes is not None]
    return float(sum(mems)) if mems else None


MIG_CLIENTS = FamilySpec[GpuSample](
    "gpu_mig_mps_clients",
    Kind.GAUGE,
    "MPS client processes on the MIG instance.",
    "MPS clients of an instance running an MPS server",
    labels=tuple(MIG_LABELS),
    unit=Unit.PROCESSES,
    mig="per instance",
)

FAMILIES: tuple[FamilySpec[GpuSample], ...] = (
    FamilySpec("gpu_mps_server_active", Kind.GAUGE,
               "1 if an MPS server process (nvidia-cuda-mps-server) holds a context on the GPU"
               " or one of its instances.",
               "a compute process named `nvidia-cuda-mps-server` (`nvmlSystemGetProcessName`, else"
               " `/proc/<pid>/comm`) on the GPU or any of its instances",
               lambda g: 1.0 if g.mps_server_active else 0.0, unit=Unit.BOOLEAN, mig="parent"),
    FamilySpec("gpu_mps_clients", Kind.GAUGE,
               "MPS client processes on the GPU (NVML MPS compute running processes).",
               "`GetMPSComputeRunningProcesses` (parent and instances)", _clients,
               unit=Unit.PROCESSES, mig="parent"),
    FamilySpec("gpu_mps_clients_memory_used_bytes", Kind.GAUGE,
               "Memory used by the GPU's MPS clients, summed"
               " (NVML MPS compute running processes; absent if not reported).",
               "sum of the MPS clients' `usedGpuMemory` (absent when NVML reports none)", _clients_memory,
               unit=Unit.BYTES, mig="parent"),
    MIG_CLIENTS,
)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    reading, mig_clients = readers(FAMILIES, families), families[MIG_CLIENTS.name]
    for labels, gpu in per_gpu(readable(snapshot, Area.MPS)):
        add_values(reading, labels, gpu)
        for m in gpu.mig_instances:
            if m.mps_clients or any(p.kind is ProcessKind.MPS_SERVER for p in m.processes):
                mig_clients.add_metric([*labels, str(m.gpu_instance), m.profile], float(len(m.mps_clients)))
    yield from non_empty(*families.values())


SPEC = CollectorSpec(Area.MPS, True, "MPS server state and client counts", collect, families=FAMILIES)
