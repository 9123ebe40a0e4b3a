"""Xid critical errors counted from the NVML event set (see `backends/events.py`).

Counts are real counters since the exporter started; a GPU instance id carried by the event adds a
per-instance count as well. The per-GPU count includes instance-attributed events, so summing
`gpu_mig_xid_errors_total` with `gpu_xid_errors_total` would double count. The rows are Xid counts
(per GPU and code, or per GPU instance and code), not GPUs.
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
    non_empty,
)
from gpulens.exporter.snapshot import Area, NodeSnapshot, XidCount

TOTAL = FamilySpec[XidCount](
    "gpu_xid_errors_total",
    Kind.COUNTER,
    "Xid critical error events since the exporter started, by Xid code (NVML event set, XidCriticalError).",
    "NVML event set, `nvmlEventTypeXidCriticalError` (`eventData` = Xid), counted since the exporter started",
    lambda x: x.count,
    labels=(*GPU_LABELS, "xid"),
    unit=Unit.EVENTS,
    mig="all Xids of the GPU, MIG-attributed or not",
)
LAST = FamilySpec[XidCount](
    "gpu_xid_last_timestamp_seconds",
    Kind.GAUGE,
    "Time the last Xid event with this code was received.",
    "time the event was received",
    lambda x: x.last_timestamp,
    labels=(*GPU_LABELS, "xid"),
    unit=Unit.SECONDS_SINCE_EPOCH,
    mig="parent",
)
MIG_TOTAL = FamilySpec[XidCount](
    "gpu_mig_xid_errors_total",
    Kind.COUNTER,
    "Xid events attributed by NVML to a GPU instance, by Xid code (also counted in gpu_xid_errors_total).",
    "events whose `gpuInstanceId` is set",
    lambda x: x.count,
    labels=(*GPU_LABELS, "gpu_instance", "xid"),
    unit=Unit.EVENTS,
    mig="per instance (also counted in `gpu_xid_errors_total`: do not add the two)",
)
FAMILIES: tuple[FamilySpec[XidCount], ...] = (TOTAL, LAST, MIG_TOTAL)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    fill(
        (TOTAL, LAST),
        families,
        (([str(x.gpu), x.uuid, str(x.xid)], x) for x in snapshot.xids if x.gpu_instance is None),
    )
    fill(
        (MIG_TOTAL,),
        families,
        (
            ([str(x.gpu), x.uuid, str(x.gpu_instance), str(x.xid)], x)
            for x in snapshot.xids
            if x.gpu_instance is not None
        ),
    )
    yield from non_empty(*families.values())


SPEC = CollectorSpec(Area.XID, True, "Xid error counters from the NVML event set", collect, families=FAMILIES)
