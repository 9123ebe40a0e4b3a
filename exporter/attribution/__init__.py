"""Per-job attribution: which Slurm job / Kubernetes pod uses which GPU, MIG instance or MPS share.

Runs inside the exporter, so it depends on the standard library only (plus optional grpcio for the
kubelet pod-resources API).
"""

from gpulens.exporter.attribution.model import (
    AttributionConfig,
    JobIdentity,
    JobUsage,
    ProcessRef,
)

__all__ = ["AttributionConfig", "JobIdentity", "JobUsage", "ProcessRef"]
