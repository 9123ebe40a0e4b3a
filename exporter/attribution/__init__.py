"""Per-job attribution: which Slurm job / Kubernetes pod uses which GPU, MIG instance or MPS share.

Runs inside the exporter, so it depends on the standard library only (plus grpcio/protobuf for the
kubelet pod-resources API, imported lazily and optional). See docs/attribution.md.
"""

from gpulens.exporter.attribution.attributor import Attributor
from gpulens.exporter.attribution.model import (
    AttributionConfig,
    DeviceHolder,
    DeviceRef,
    JobIdentity,
    JobUsage,
    ProcessRef,
)

__all__ = [
    "AttributionConfig",
    "Attributor",
    "DeviceHolder",
    "DeviceRef",
    "JobIdentity",
    "JobUsage",
    "ProcessRef",
]
