"""Collectors: one module per area, each a pure function from a snapshot to metric families.

`REGISTRY` maps names to specs in a stable order, which is the render order: the native collectors,
then the other exporters' views of the same snapshot. `SWITCHABLE` (the native ones) drives the
node_exporter-style `--collector.<name>` / `--no-collector.<name>` flags; a compat collector is
on when `--compat` names its mode (`CollectorSpec.compat`). The `exporter` meta collector is always
on and renders last, with the status of every other.
"""

from __future__ import annotations

from gpulens.exporter.collectors import (
    clocks,
    dcgm_compat,
    device,
    health,
    health_status,
    jobs,
    jobstats_compat,
    memory,
    mig,
    mps,
    nvidia_gpu_exporter_compat,
    pcie_nvlink,
    power_thermal,
    processes,
    profiling,
    topology,
    xid,
)
from gpulens.exporter.collectors.base import CollectorOptions, CollectorSpec
from gpulens.exporter.compat import CompatSpec

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
        dcgm_compat.SPEC,
        jobstats_compat.SPEC,
        nvidia_gpu_exporter_compat.SPEC,
    )
}

SWITCHABLE: dict[str, CollectorSpec] = {name: spec for name, spec in REGISTRY.items() if spec.compat is None}

DEFAULT_ENABLED = frozenset(name for name, spec in SWITCHABLE.items() if spec.default_enabled)


def enabled(collectors: frozenset[str] | None, compat: CompatSpec) -> tuple[str, ...]:
    """The collectors to run, in render order: the switchable ones asked for (the defaults when
    None), and the compat views whose `--compat` mode is on (whatever `collectors` says of them)."""
    wanted = DEFAULT_ENABLED if collectors is None else collectors
    modes = compat.modes
    return tuple(
        name
        for name, spec in REGISTRY.items()
        if (name in wanted if spec.compat is None else spec.compat in modes)
    )


__all__ = ["DEFAULT_ENABLED", "REGISTRY", "SWITCHABLE", "CollectorOptions", "CollectorSpec", "enabled"]
