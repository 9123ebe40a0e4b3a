"""Power, energy and temperatures. Device-wide values: exported on the parent GPU only.

`gpu_temperature_threshold_celsius` is filled here rather than by an accessor: one series per
threshold the GPU reports.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    POWER_THERMAL,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    Unit,
    add_values,
    fresh,
    non_empty,
    per_gpu_record,
    readers,
)
from gpulens.exporter.snapshot import NodeSnapshot, PowerThermalReading

THRESHOLDS = FamilySpec[PowerThermalReading](
    "gpu_temperature_threshold_celsius", Kind.GAUGE,
    "Temperature at which the GPU slows down or shuts down (NVML temperature threshold).",
    "`GetTemperatureThreshold(SLOWDOWN / SHUTDOWN)`",
    labels=(*GPU_LABELS, "threshold"), unit=Unit.CELSIUS, label_doc="threshold (`slowdown`/`shutdown`)",
)  # fmt: skip

FAMILIES: tuple[FamilySpec[PowerThermalReading], ...] = (
    FamilySpec("gpu_power_watts", Kind.GAUGE, "Board power draw (NVML power usage, mW / 1000).",
               "`GetPowerUsage` (mW / 1000)", lambda p: p.power_watts, unit=Unit.WATTS),
    FamilySpec("gpu_power_limit_watts", Kind.GAUGE,
               "Enforced power limit (NVML enforced power limit, mW / 1000).",
               "`GetEnforcedPowerLimit` (mW / 1000)", lambda p: p.power_limit_watts, unit=Unit.WATTS),
    FamilySpec("gpu_energy_joules_total", Kind.COUNTER,
               "Energy consumed since the driver loaded (NVML total energy consumption, mJ / 1000; Volta+).",
               "`GetTotalEnergyConsumption` (mJ / 1000; resets when the driver reloads)",
               lambda p: p.energy_joules, unit=Unit.JOULES),
    FamilySpec("gpu_temperature_celsius", Kind.GAUGE,
               "GPU core temperature (NVML temperature, GPU sensor).",
               "`GetTemperature(NVML_TEMPERATURE_GPU)`", lambda p: p.temperature_celsius, unit=Unit.CELSIUS),
    FamilySpec("gpu_memory_temperature_celsius", Kind.GAUGE,
               "HBM temperature (NVML field 82, MEMORY_TEMP).",
               "field 82 `NVML_FI_DEV_MEMORY_TEMP`", lambda p: p.memory_temperature_celsius,
               unit=Unit.CELSIUS),
    THRESHOLDS,
)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    reading, thresholds = readers(FAMILIES, families), families[THRESHOLDS.name]
    for labels, power in per_gpu_record(snapshot, POWER_THERMAL):
        add_values(reading, labels, power)
        for name, celsius in power.temperature_thresholds:
            thresholds.add_metric([*labels, name], celsius)
    yield from non_empty(*families.values())


SPEC = CollectorSpec(
    POWER_THERMAL.area,
    True,
    "power, power limit, energy counter, GPU and memory temperature",
    collect,
    families=FAMILIES,
)
