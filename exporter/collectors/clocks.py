"""SM and memory clocks and clock event (throttle) reasons as 0/1 per reason.

The two reason families are filled here rather than by an accessor: one series per reason the
GPU supports.
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
    add_values,
    fresh,
    non_empty,
    per_gpu,
    readable,
    readers,
)
from gpulens.exporter.snapshot import Area, GpuSample, NodeSnapshot

EVENTS = FamilySpec[GpuSample](
    "gpu_clock_event_active",
    Kind.GAUGE,
    "1 while a clock event (throttle) reason holds clocks down (NVML current clock event reasons);"
    " supported reasons only.",
    "`GetCurrentClocksEventReasons` bit set; one series per reason in `GetSupportedClocksEventReasons`",
    labels=(*GPU_LABELS, "reason"),
    unit="0/1",
    label_doc="reason (`gpu_idle`, `applications_clocks_setting`, `sw_power_cap`, `hw_slowdown`,"
    " `sync_boost`, `sw_thermal_slowdown`, `hw_thermal_slowdown`, `hw_power_brake_slowdown`,"
    " `display_clock_setting`)",
)
SECONDS = FamilySpec[GpuSample](
    "gpu_clock_event_seconds_total",
    Kind.COUNTER,
    "Time clocks were held down by the reason since the driver loaded (NVML CLOCKS_EVENT_REASON_* fields,"
    " ns / 1e9); rate() is the fraction of time throttled, including events between samples.",
    "fields 74, 76, 269, 270, 271 `CLOCKS_EVENT_REASON_*` (cumulative ns / 1e9); `rate()` is the"
    " fraction of time throttled, including short events between samples",
    labels=(*GPU_LABELS, "reason"),
    unit="seconds",
    label_doc="reason (`sw_power_cap`, `sync_boost`, `sw_thermal_slowdown`, `hw_thermal_slowdown`,"
    " `hw_power_brake_slowdown`)",
)

FAMILIES: tuple[FamilySpec[GpuSample], ...] = (
    FamilySpec("gpu_sm_clock_hertz", Kind.GAUGE, "Current SM clock (NVML clock info SM, MHz x 1e6).",
               "`GetClockInfo(SM)` (MHz x 1e6)", lambda g: g.sm_clock_hertz, unit="Hz"),
    FamilySpec("gpu_memory_clock_hertz", Kind.GAUGE, "Current memory clock (NVML clock info MEM, MHz x 1e6).",
               "`GetClockInfo(MEM)` (MHz x 1e6)", lambda g: g.memory_clock_hertz, unit="Hz"),
    FamilySpec("gpu_sm_clock_max_hertz", Kind.GAUGE, "Maximum SM clock (NVML max clock info SM, MHz x 1e6).",
               "`GetMaxClockInfo(SM)` (MHz x 1e6)", lambda g: g.sm_clock_max_hertz, unit="Hz"),
    EVENTS,
    SECONDS,
)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    reading, events, seconds = readers(FAMILIES, families), families[EVENTS.name], families[SECONDS.name]
    for labels, gpu in per_gpu(readable(snapshot, Area.CLOCKS)):
        add_values(reading, labels, gpu)
        for reason, active in gpu.clock_events:
            events.add_metric([*labels, reason], 1.0 if active else 0.0)
        for reason, total in gpu.clock_event_seconds:
            seconds.add_metric([*labels, reason], total)
    yield from non_empty(*families.values())


SPEC = CollectorSpec(
    Area.CLOCKS, True, "SM/memory clocks and clock event (throttle) reasons", collect, families=FAMILIES
)
