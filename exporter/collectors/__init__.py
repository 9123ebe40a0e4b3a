"""Collectors: one module per area, each a pure function from a snapshot to metric families.

`REGISTRY` maps names to specs in a stable order; it drives the node_exporter-style
`--collector.<name>` / `--no-collector.<name>` flags. The `exporter` meta collector is always on.
"""

from __future__ import annotations

from gpulens.exporter.collectors import (
    clocks,
    device,
    health,
    health_status,
    jobs,
    memory,
    mig,
    mps,
    pcie_nvlink,
    power_thermal,
    processes,
    profiling,
    topology,
    xid,
)
from gpulens.exporter.collectors.base import CollectorOptions, CollectorSpec

REGISTRY: dict[str, CollectorSpec] = {
    spec.name: spec
    for spec in (
        device.SPEC,
        memory.SPEC,
        power_thermal.SPEC,
        clocks.SPEC,
        pcie_nvlink.SPEC,
        health.SPEC,
        xid.SPEC,
        health_status.SPEC,
        mig.SPEC,
        mps.SPEC,
        processes.SPEC,
        jobs.SPEC,
        profiling.SPEC,
        topology.SPEC,
    )
}

DEFAULT_ENABLED = frozenset(name for name, spec in REGISTRY.items() if spec.default_enabled)

__all__ = ["DEFAULT_ENABLED", "REGISTRY", "CollectorOptions", "CollectorSpec"]
