"""Optional per-process detail (off by default: a `pid` label churns series).

Bounded by `--collector.processes.max` per node: the processes using the most memory are kept and
`gpulens_processes_dropped` says how many were left out.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    CollectorOptions,
    CollectorSpec,
    add_optional,
    gauge,
    gpu_labels,
    non_empty,
    readable,
)
from gpulens.exporter.snapshot import Area, NodeSnapshot, ProcessSample


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    labels_names = [*GPU_LABELS, "gpu_instance", "pid", "kind"]
    mem = gauge(
        "gpu_process_memory_used_bytes",
        "GPU memory used by the process (NVML running processes usedGpuMemory).",
        labels_names,
    )
    sm = gauge(
        "gpu_process_sm_utilization_ratio",
        "SM utilization of the process over the last sample (NVML process utilization; absent on MIG).",
        labels_names,
    )
    dropped = gauge(
        "gpulens_processes_dropped", "Processes left out of the per-process series by the limit.", []
    )
    rows: list[tuple[list[str], ProcessSample]] = []
    for gpu in readable(snapshot, Area.PROCESSES):
        base = gpu_labels(gpu)
        for p in (*gpu.processes, *gpu.mps_clients):
            gi = "" if p.gpu_instance is None else str(p.gpu_instance)
            rows.append(([*base, gi, str(p.pid), p.kind], p))
    rows.sort(key=lambda r: -(r[1].used_memory_bytes or 0))
    keep = rows[: options.processes_max]
    for labels, p in keep:
        add_optional(mem, labels, p.used_memory_bytes)
        add_optional(sm, labels, p.sm_util_ratio)
    dropped.add_metric([], float(len(rows) - len(keep)))
    yield from non_empty(mem, sm, dropped)


SPEC = CollectorSpec(
    Area.PROCESSES, False, "per-process memory and SM utilization (pid label; bounded)", collect
)
