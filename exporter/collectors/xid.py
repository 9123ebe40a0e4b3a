"""Xid critical errors counted from the NVML event set (see `backends/events.py`).

Counts are real counters since the exporter started; a GPU instance id carried by the event adds a
per-instance count as well. The per-GPU count includes instance-attributed events, so summing
`gpu_mig_xid_errors_total` with `gpu_xid_errors_total` would double count.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    CollectorOptions,
    CollectorSpec,
    counter,
    gauge,
    non_empty,
)
from gpulens.exporter.snapshot import Area, NodeSnapshot


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    total = counter(
        "gpu_xid_errors_total",
        "Xid critical error events since the exporter started, by Xid code"
        " (NVML event set, XidCriticalError).",
        [*GPU_LABELS, "xid"],
    )
    last = gauge(
        "gpu_xid_last_timestamp_seconds",
        "Time the last Xid event with this code was received.",
        [*GPU_LABELS, "xid"],
    )
    mig_total = counter(
        "gpu_mig_xid_errors_total",
        "Xid events attributed by NVML to a GPU instance, by Xid code"
        " (also counted in gpu_xid_errors_total).",
        [*GPU_LABELS, "gpu_instance", "xid"],
    )
    for x in snapshot.xids:
        if x.gpu_instance is None:
            labels = [str(x.gpu), x.uuid, str(x.xid)]
            total.add_metric(labels, float(x.count))
            last.add_metric(labels, x.last_timestamp)
        else:
            mig_total.add_metric([str(x.gpu), x.uuid, str(x.gpu_instance), str(x.xid)], float(x.count))
    yield from non_empty(total, last, mig_total)


SPEC = CollectorSpec(Area.XID, True, "Xid error counters from the NVML event set", collect)
