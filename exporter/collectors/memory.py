"""Framebuffer and BAR1 memory of the whole GPU (instances are in the mig collector).

`gpu_memory_used_bytes` excludes the driver-reserved part: total = used + free + reserved.
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
from gpulens.exporter.snapshot import Area, NodeSnapshot


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    total = gauge(
        "gpu_memory_total_bytes", "Total framebuffer memory (NVML memory info v2 total).", GPU_LABELS
    )
    used = gauge(
        "gpu_memory_used_bytes",
        "Framebuffer memory allocated, excluding driver-reserved memory"
        " (total - free - reserved, NVML memory info v2).",
        GPU_LABELS,
    )
    free = gauge("gpu_memory_free_bytes", "Framebuffer memory free (NVML memory info v2 free).", GPU_LABELS)
    reserved = gauge(
        "gpu_memory_reserved_bytes",
        "Framebuffer memory reserved by the driver and firmware (NVML memory info v2).",
        GPU_LABELS,
    )
    bar1_total = gauge(
        "gpu_bar1_memory_total_bytes", "BAR1 aperture size (NVML BAR1 memory info).", GPU_LABELS
    )
    bar1_used = gauge(
        "gpu_bar1_memory_used_bytes", "BAR1 aperture in use (NVML BAR1 memory info).", GPU_LABELS
    )
    for gpu in readable(snapshot, Area.MEMORY):
        labels = gpu_labels(gpu)
        add_optional(total, labels, gpu.memory_total_bytes)
        add_optional(used, labels, gpu.memory_used_bytes)
        add_optional(free, labels, gpu.memory_free_bytes)
        add_optional(reserved, labels, gpu.memory_reserved_bytes)
        add_optional(bar1_total, labels, gpu.bar1_total_bytes)
        add_optional(bar1_used, labels, gpu.bar1_used_bytes)
    yield from non_empty(total, used, free, reserved, bar1_total, bar1_used)


SPEC = CollectorSpec(Area.MEMORY, True, "framebuffer total/used/free/reserved and BAR1 memory", collect)
