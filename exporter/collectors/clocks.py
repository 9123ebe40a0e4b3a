"""SM and memory clocks and clock event (throttle) reasons as 0/1 per reason.

The two reason families are filled here rather than by an accessor: one series per reason the
GPU supports.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    CLOCKS,
    GPU_LABELS,
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
from gpulens.exporter.snapshot import ClocksReading, NodeSnapshot

EVENTS = FamilySpec[ClocksReading](
    "gpu_clock_event_active",
    Kind.GAUGE,
    "1 while a clock event (throttle) reason holds clocks down (NVML current clock event reasons);"
    " supported reasons only.",
    "`GetCurrentClocksEventReasons` bit set; one series per reason in `GetSupportedClocksEventReasons`",
    labels=(*GPU_LABELS, "reason"),
    unit=Unit.BOOLEAN,
    label_doc="reason (`gpu_idle`, `applications_clocks_setting`, `sw_power_cap`, `hw_slowdown`,"
    " `sync_boost`, `sw_thermal_slowdown`, `hw_thermal_slowdown`, `hw_power_brake_slowdown`,"
    " `display_clock_setting`)",
)
SECONDS = FamilySpec[ClocksReading](
    "gpu_clock_event_seconds_total",
    Kind.COUNTER,
    "Time clocks were held down by the reason since the driver loaded (NVML CLOCKS_EVENT_REASON_* fields,"
    " ns / 1e9); rate() is the fraction of time throttled, including events between samples.",
    "fields 74, 76, 269, 270, 271 `CLOCKS_EVENT_REASON_*` (cumulative ns / 1e9); `rate()` is the"
    " fraction of time throttled, including short events between samples",
    labels=(*GPU_LABELS, "reason"),
    unit=Unit.SECONDS,
    label_doc="reason (`sw_power_cap`, `sync_boost`, `sw_thermal_slowdown`, `hw_thermal_slowdown`,"
    " `hw_power_brake_slowdown`)",
)

FAMILIES: tuple[FamilySpec[ClocksReading], ...] = (
    FamilySpec("gpu_sm_clock_hertz", Kind.GAUGE, "Current SM clock (NVML clock info SM, MHz x 1e6).",
               "`GetClockInfo(SM)` (MHz x 1e6)", lambda c: c.sm_clock_hertz, unit=Unit.HERTZ),
    FamilySpec("gpu_memory_clock_hertz", Kind.GAUGE, "Current memory clock (NVML clock info MEM, MHz x 1e6).",
               "`GetClockInfo(MEM)` (MHz x 1e6)", lambda c: c.memory_clock_hertz, unit=Unit.HERTZ),
    FamilySpec("gpu_sm_clock_max_hertz", Kind.GAUGE, "Maximum SM clock (NVML max clock info SM, MHz x 1e6).",
               "`GetMaxClockInfo(SM)` (MHz x 1e6)", lambda c: c.sm_clock_max_hertz, unit=Unit.HERTZ),
    EVENTS,
    SECONDS,
)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    reading, events, seconds = readers(FAMILIES, families), families[EVENTS.name], families[SECONDS.name]
    for labels, clocks in per_gpu_record(snapshot, CLOCKS):
        add_values(reading, labels, clocks)
        for reason, active in clocks.clock_events:
            events.add_metric([*labels, reason], 1.0 if active else 0.0)
        for reason, total in clocks.clock_event_seconds:
            seconds.add_metric([*labels, reason], total)
    yield from non_empty(*families.values())


SPEC = CollectorSpec(
    CLOCKS.area, True, "SM/memory clocks and clock event (throttle) reasons", collect, families=FAMILIES
)
