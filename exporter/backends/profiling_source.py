"""Which profiling source feeds the `*_active_ratio` families: `--profiling auto|dcgm|gpm|off`.

- `auto`: DCGM where it is reachable and can profile the GPU, else NVML GPM where the GPU supports it
  (Hopper+), else nothing beyond NVML's coarse utilization. The choice is made per GPU and per
  sample, so a host engine that dies mid-run hands its GPUs to GPM until it is back.
- `dcgm`: DCGM only; GPUs it cannot serve get NVML utilization only (never silently another source).
- `gpm`: NVML GPM only. `off`: no profiling reads.

`gpulens_profiling_source_info{source}` reports the outcome per GPU (`dcgm`, `gpm` or `nvml`).

Under `--simulate`, a real DCGM could not see the simulated GPUs, so DCGM is only used there when
asked for: `--profiling dcgm` or `--dcgm-bindings`. The CLI's `--simulate` branch then installs the
simulated host engine for the node and points `dcgm_bindings` at its fake bindings; this module
only sees a configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gpulens.exporter.backends.dcgm import DcgmProfiler, DcgmSettings
from gpulens.exporter.backends.gpm import GpmProfiler
from gpulens.exporter.config import ExporterConfig
from gpulens.exporter.snapshot import MigSample, ProfilerAnswer, ProfilingSource


class Profiler(Protocol):
    """What the NVML backend asks for a GPU's profiling figures (DCGM, GPM or both)."""

    def read(self, index: int, handle: Any, mig_instances: Sequence[MigSample]) -> ProfilerAnswer: ...

    def forget(self, index: int) -> None: ...

    def close(self) -> None: ...


class FallbackProfiler:
    """Ask `first`; where it does not serve a GPU (source "nvml"), ask `second`."""

    def __init__(self, first: Profiler, second: Profiler) -> None:
        self.first = first
        self.second = second

    def read(self, index: int, handle: Any, mig_instances: Sequence[MigSample]) -> ProfilerAnswer:
        reading = self.first.read(index, handle, mig_instances)
        if reading[0] is not ProfilingSource.NVML:
            return reading
        return self.second.read(index, handle, mig_instances)

    def forget(self, index: int) -> None:
        self.first.forget(index)
        self.second.forget(index)

    def close(self) -> None:
        self.first.close()
        self.second.close()


def dcgm_settings(config: ExporterConfig, simulating: bool) -> DcgmSettings | None:
    """The DCGM to try, or None when this mode (or the simulator) does not use DCGM."""
    if config.profiling not in ("auto", "dcgm"):
        return None
    bindings = config.dcgm_bindings
    if simulating and bindings is None:  # the system's DCGM cannot see simulated GPUs
        return None
    return DcgmSettings(bindings=bindings, address=config.dcgm_address)


def make_profiler_factory(
    config: ExporterConfig,
    clock: Callable[[], float],
    logger: logging.Logger | None = None,
    node: Any = None,
) -> Callable[[Any], Any] | None:
    """A factory for `NvmlBackend(profiler_factory=...)`; None for `--profiling off`.

    With a simulated `node`, DCGM is used only through `config.dcgm_bindings` (the simulated host
    engine is then installed by whoever built the node).
    """
    if config.profiling == "off":
        return None
    log = logger or logging.getLogger("gpulens.exporter")
    settings = dcgm_settings(config, simulating=node is not None)
    use_gpm = config.profiling in ("auto", "gpm")
    rates = bool(config.compat_spec())  # the PCIe/NVLink rates are read by the --compat families only

    def factory(_backend: Any) -> Any:
        gpm = GpmProfiler(clock, interval=config.interval, logger=log, rates=rates) if use_gpm else None
        if settings is None:
            return gpm
        dcgm = DcgmProfiler(
            settings, clock, interval=config.interval, logger=log, optional=config.profiling == "auto"
        )
        return FallbackProfiler(dcgm, gpm) if gpm is not None else dcgm

    return factory
