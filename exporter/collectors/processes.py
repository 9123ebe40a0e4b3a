"""Optional per-process detail (off by default: a `pid` label churns series).

Bounded by `--collector.processes.max` per node: the processes using the most memory are kept and
`gpulens_processes_dropped` says how many were left out (a node-wide count, filled here).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    Unit,
    fill,
    fresh,
    gpu_labels,
    non_empty,
    readable,
)
from gpulens.exporter.snapshot import Area, NodeSnapshot, ProcessSample

PROCESS_LABELS = (*GPU_LABELS, "gpu_instance", "pid", "kind")

DROPPED = FamilySpec[ProcessSample](
    "gpulens_processes_dropped",
    Kind.GAUGE,
    "Processes left out of the per-process series by the limit.",
    "processes beyond `--collector.processes.max` (the largest by memory are kept)",
    labels=(),
    unit=Unit.PROCESSES,
    label_doc="(none)",
    mig="",
)
FAMILIES: tuple[FamilySpec[ProcessSample], ...] = (
    FamilySpec("gpu_process_memory_used_bytes", Kind.GAUGE,
               "GPU memory used by the process (NVML running processes usedGpuMemory).",
               "process lists `usedGpuMemory`", lambda p: p.used_memory_bytes, labels=PROCESS_LABELS,
               unit=Unit.BYTES, mig="per process",
               label_doc="gpu_instance (empty without MIG), pid, kind"
               " (`compute`/`graphics`/`mps_server`/`mps_client`)"),
    FamilySpec("gpu_process_sm_utilization_ratio", Kind.GAUGE,
               "SM utilization of the process over the last sample"
               " (NVML process utilization; absent on MIG).",
               "`GetProcessUtilization(since last sample)` latest `smUtil` / 100; absent on MIG",
               lambda p: p.sm_util_ratio, labels=PROCESS_LABELS, unit=Unit.RATIO, mig="per process"),
    DROPPED,
)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    rows: list[tuple[list[str], ProcessSample]] = []
    for gpu in readable(snapshot, Area.PROCESSES):
        base = gpu_labels(gpu)
        lists = gpu.processes
        if lists is None:
            continue
        for p in (*lists.processes, *lists.mps_clients):
            gi = "" if p.gpu_instance is None else str(p.gpu_instance)
            rows.append(([*base, gi, str(p.pid), p.kind], p))
    rows.sort(key=lambda r: -(r[1].used_memory_bytes or 0))
    keep = rows[: options.processes_max]
    fill(FAMILIES, families, keep)
    families[DROPPED.name].add_metric([], float(len(rows) - len(keep)))
    yield from non_empty(*families.values())


SPEC = CollectorSpec(
    Area.PROCESSES,
    False,
    "per-process memory and SM utilization (pid label; bounded)",
    collect,
    families=FAMILIES,
)
