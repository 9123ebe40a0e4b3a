"""SM and memory clocks and clock event (throttle) reasons as 0/1 per reason."""

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
    sm = gauge("gpu_sm_clock_hertz", "Current SM clock (NVML clock info SM, MHz x 1e6).", GPU_LABELS)
    mem = gauge(
        "gpu_memory_clock_hertz", "Current memory clock (NVML clock info MEM, MHz x 1e6).", GPU_LABELS
    )
    sm_max = gauge(
        "gpu_sm_clock_max_hertz", "Maximum SM clock (NVML max clock info SM, MHz x 1e6).", GPU_LABELS
    )
    events = gauge(
        "gpu_clock_event_active",
        "1 while a clock event (throttle) reason holds clocks down (NVML current clock event reasons);"
        " supported reasons only.",
        [*GPU_LABELS, "reason"],
    )
    seconds = counter(
        "gpu_clock_event_seconds_total",
        "Time clocks were held down by the reason since the driver loaded (NVML CLOCKS_EVENT_REASON_* fields,"
        " ns / 1e9); rate() is the fraction of time throttled, including events between samples.",
        [*GPU_LABELS, "reason"],
    )
    for gpu in readable(snapshot, Area.CLOCKS):
        labels = gpu_labels(gpu)
        add_optional(sm, labels, gpu.sm_clock_hertz)
        add_optional(mem, labels, gpu.memory_clock_hertz)
        add_optional(sm_max, labels, gpu.sm_clock_max_hertz)
        for reason, active in gpu.clock_events:
            events.add_metric([*labels, reason], 1.0 if active else 0.0)
        for reason, total in gpu.clock_event_seconds:
            seconds.add_metric([*labels, reason], total)
    yield from non_empty(sm, mem, sm_max, events, seconds)


SPEC = CollectorSpec(Area.CLOCKS, True, "SM/memory clocks and clock event (throttle) reasons", collect)
