"""MPS: whether an MPS server owns the GPU context, and its clients.

Per-client memory is attributed to the client's job by the jobs collector; here only totals.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    MIG_LABELS,
    CollectorOptions,
    CollectorSpec,
    gauge,
    gpu_labels,
    non_empty,
    readable,
)
from gpulens.exporter.snapshot import Area, NodeSnapshot


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    active = gauge(
        "gpu_mps_server_active",
        "1 if an MPS server process (nvidia-cuda-mps-server) holds a context on the GPU"
        " or one of its instances.",
        GPU_LABELS,
    )
    clients = gauge(
        "gpu_mps_clients", "MPS client processes on the GPU (NVML MPS compute running processes).", GPU_LABELS
    )
    client_mem = gauge(
        "gpu_mps_clients_memory_used_bytes",
        "Memory used by the GPU's MPS clients, summed"
        " (NVML MPS compute running processes; absent if not reported).",
        GPU_LABELS,
    )
    mig_clients = gauge("gpu_mig_mps_clients", "MPS client processes on the MIG instance.", MIG_LABELS)
    for gpu in readable(snapshot, Area.MPS):
        labels = gpu_labels(gpu)
        active.add_metric(labels, 1.0 if gpu.mps_server_active else 0.0)
        clients.add_metric(labels, float(len(gpu.mps_clients)))
        mems = [c.used_memory_bytes for c in gpu.mps_clients if c.used_memory_bytes is not None]
        if mems:
            client_mem.add_metric(labels, float(sum(mems)))
        for m in gpu.mig_instances:
            if m.mps_clients or any(p.kind == "mps_server" for p in m.processes):
                mig_clients.add_metric([*labels, str(m.gpu_instance), m.profile], float(len(m.mps_clients)))
    yield from non_empty(active, clients, client_mem, mig_clients)


SPEC = CollectorSpec(Area.MPS, True, "MPS server state and client counts", collect)
