"""Where one exporter sampling cycle's CPU goes: simulated driver vs pynvml vs gpulens' own code.

`gpulens bench` measures whole processes, and on a machine without a GPU both exporters call a
driver that is Python (the simulator) instead of C. This splits an in-process cycle (per-GPU reads
run synchronously under cProfile, as `profile_cycle --profile` does) by where the code lives, so
the report can say how much of a missed target is the simulated driver, which a GPU node does
not pay, and how much is ours. cProfile inflates small calls, so shares are approximate.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from dataclasses import dataclass
from pathlib import Path

import gpulens.exporter
import gpulens.sim
from gpulens.devtools.bench.profile_cycle import _advance, _exporter, _sync_cycle
from gpulens.sim.install import uninstall

_EXPORTER_ROOT = str(Path(gpulens.exporter.__file__).resolve().parent)
_SIM_ROOT = str(Path(gpulens.sim.__file__).resolve().parent)


@dataclass(frozen=True)
class CycleBreakdown:
    scenario: str
    cycles: int
    cycle_cpu_ms: float  # median process CPU of a full cycle (threads included), not profiled
    simulated_driver_share: float  # src/gpulens/sim/** (what libnvidia-ml does in C on a GPU node)
    nvml_binding_share: float  # pynvml.py wrappers + ctypes
    gpulens_share: float  # the rest of exporter/** (backend, sampler, collectors, render, attribution)
    other_share: float  # stdlib, prometheus_client, ...

    @property
    def gpulens_cycle_ms(self) -> float:
        """Estimated CPU of our own code per cycle (without the library code it calls)."""
        return self.cycle_cpu_ms * self.gpulens_share

    @property
    def gpulens_cycle_ms_upper(self) -> float:
        """Upper estimate: our code plus every stdlib / prometheus_client / builtin call."""
        return self.cycle_cpu_ms * (self.gpulens_share + self.other_share)


_WAITS = ("acquire' of '_thread.lock", "time.sleep", "select.poll", "wait' of")


def _category(filename: str, name: str) -> str | None:
    """Where a profiled function's own time belongs; None for waiting (not CPU)."""
    if filename == "~":
        if any(w in name for w in _WAITS):
            return None
        return "nvml" if "ctypes" in name or "CFuncPtr" in name else "other"
    if filename.startswith(_SIM_ROOT):
        return "sim"
    if filename.endswith("pynvml.py") or "/ctypes/" in filename:
        return "nvml"
    if filename.startswith(_EXPORTER_ROOT):
        return "gpulens"
    return "other"


def measure_breakdown(scenario: str, interval: float = 2.0, cycles: int = 5) -> CycleBreakdown:
    exporter, clock = _exporter(scenario, interval, None, "real")
    try:
        for _ in range(3):
            exporter.refresh()
            _advance(clock, interval)
        cpu: list[float] = []
        for _ in range(cycles):
            started = time.process_time()
            exporter.refresh()
            cpu.append(time.process_time() - started)
            _advance(clock, interval)
        profiler = cProfile.Profile()
        for _ in range(cycles):
            profiler.enable()
            _sync_cycle(exporter)
            profiler.disable()
            _advance(clock, interval)
    finally:
        exporter.close()
        uninstall()
    totals = {"sim": 0.0, "nvml": 0.0, "gpulens": 0.0, "other": 0.0}
    raw_stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]  # undocumented, stable since 2.x
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in raw_stats.items():
        category = _category(filename, name)
        if category is not None:
            totals[category] += tottime
    whole = sum(totals.values()) or 1.0
    cpu.sort()
    return CycleBreakdown(
        scenario=scenario,
        cycles=cycles,
        cycle_cpu_ms=cpu[len(cpu) // 2] * 1e3,
        simulated_driver_share=totals["sim"] / whole,
        nvml_binding_share=totals["nvml"] / whole,
        gpulens_share=totals["gpulens"] / whole,
        other_share=totals["other"] / whole,
    )
