"""Framebuffer and BAR1 memory of the whole GPU (instances are in the mig collector).

`gpu_memory_used_bytes` excludes the driver-reserved part: total = used + free + reserved.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    MEMORY,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    Unit,
    collect_specs,
    per_gpu_record,
)
from gpulens.exporter.snapshot import MemoryReading, NodeSnapshot

_V2 = "GetMemoryInfo(version=nvmlMemory_v2)"

FAMILIES: tuple[FamilySpec[MemoryReading], ...] = (
    FamilySpec("gpu_memory_total_bytes", Kind.GAUGE,
               "Total framebuffer memory (NVML memory info v2 total).",
               f"`{_V2}.total`", lambda m: m.memory_total_bytes, unit=Unit.BYTES, mig="parent = whole GPU"),
    FamilySpec("gpu_memory_used_bytes", Kind.GAUGE,
               "Framebuffer memory allocated, excluding driver-reserved memory"
               " (total - free - reserved, NVML memory info v2).",
               f"`{_V2}`; **used = total - free - reserved** (excludes the driver-reserved part; v1"
               " fallback without reserved)",
               lambda m: m.memory_used_bytes, unit=Unit.BYTES, mig="parent = whole GPU"),
    FamilySpec("gpu_memory_free_bytes", Kind.GAUGE, "Framebuffer memory free (NVML memory info v2 free).",
               f"`{_V2}.free`", lambda m: m.memory_free_bytes, unit=Unit.BYTES, mig="parent = whole GPU"),
    FamilySpec("gpu_memory_reserved_bytes", Kind.GAUGE,
               "Framebuffer memory reserved by the driver and firmware (NVML memory info v2).",
               f"`{_V2}.reserved`", lambda m: m.memory_reserved_bytes, unit=Unit.BYTES,
               mig="parent = whole GPU"),
    FamilySpec("gpu_bar1_memory_total_bytes", Kind.GAUGE, "BAR1 aperture size (NVML BAR1 memory info).",
               "`GetBAR1MemoryInfo().bar1Total`", lambda m: m.bar1_total_bytes, unit=Unit.BYTES),
    FamilySpec("gpu_bar1_memory_used_bytes", Kind.GAUGE, "BAR1 aperture in use (NVML BAR1 memory info).",
               "`GetBAR1MemoryInfo().bar1Used`", lambda m: m.bar1_used_bytes, unit=Unit.BYTES),
)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    return collect_specs(FAMILIES, per_gpu_record(snapshot, MEMORY))


SPEC = CollectorSpec(
    MEMORY.area, True, "framebuffer total/used/free/reserved and BAR1 memory", collect, families=FAMILIES
)
