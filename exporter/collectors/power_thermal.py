"""Power, energy and temperatures. Device-wide values: exported on the parent GPU only."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    CollectorOptions,
    CollectorSpec,
    add_optional,
    counter,
    gauge,
    gpu_labels,
    non_empty,
    readable,
)
from gpulens.exporter.snapshot import Area, NodeSnapshot


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    power = gauge("gpu_power_watts", "Board power draw (NVML power usage, mW / 1000).", GPU_LABELS)
    limit = gauge(
        "gpu_power_limit_watts", "Enforced power limit (NVML enforced power limit, mW / 1000).", GPU_LABELS
    )
    energy = counter(
        "gpu_energy_joules_total",
        "Energy consumed since the driver loaded (NVML total energy consumption, mJ / 1000; Volta+).",
        GPU_LABELS,
    )
    temp = gauge(
        "gpu_temperature_celsius", "GPU core temperature (NVML temperature, GPU sensor).", GPU_LABELS
    )
    mem_temp = gauge(
        "gpu_memory_temperature_celsius", "HBM temperature (NVML field 82, MEMORY_TEMP).", GPU_LABELS
    )
    thresholds = gauge(
        "gpu_temperature_threshold_celsius",
        "Temperature at which the GPU slows down or shuts down (NVML temperature threshold).",
        [*GPU_LABELS, "threshold"],
    )
    for gpu in readable(snapshot, Area.POWER_THERMAL):
        labels = gpu_labels(gpu)
        add_optional(power, labels, gpu.power_watts)
        add_optional(limit, labels, gpu.power_limit_watts)
        add_optional(energy, labels, gpu.energy_joules)
        add_optional(temp, labels, gpu.temperature_celsius)
        add_optional(mem_temp, labels, gpu.memory_temperature_celsius)
        for name, celsius in gpu.temperature_thresholds:
            thresholds.add_metric([*labels, name], celsius)
    yield from non_empty(power, limit, energy, temp, mem_temp, thresholds)


SPEC = CollectorSpec(
    Area.POWER_THERMAL, True, "power, power limit, energy counter, GPU and memory temperature", collect
)
