"""Where one exporter sampling cycle's CPU goes: the NVML calls vs gpulens' own code vs the rest.

`gpulens bench` measures whole processes, which says how much a cycle costs but not where. This
runs the same exporter in-process on the native simulated driver (C, as on a GPU node; the node is
published between cycles, outside the timed part), times full cycles by process CPU, then splits
cycles run under cProfile (per-GPU reads synchronously on this thread, as `profile_cycle
--profile` does) by where the code lives, and lists the functions that cost most, so the report
says where our remaining time goes. The C library's time shows inside the pynvml calls that make
it. cProfile inflates small calls, so shares are approximate.
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

_EXPORTER_ROOT = str(Path(gpulens.exporter.__file__).resolve().parent)
_SIM_ROOT = str(Path(gpulens.sim.__file__).resolve().parent)
_RAWCALLS = str(Path(_EXPORTER_ROOT) / "backends" / "rawcalls.py")


@dataclass(frozen=True)
class Hotspot:
    """One function's own time per cycle under cProfile."""

    where: str  # file relative to its package root, with the line
    function: str
    part: str  # gpulens | nvml | sim | other
    share: float  # of the profiled cycles' CPU (cProfile's own time of this function / all)
    calls_per_cycle: float


@dataclass(frozen=True)
class CycleBreakdown:
    scenario: str
    cycles: int
    cycle_cpu_ms: float  # median process CPU of a full cycle (threads included), not profiled
    simulated_driver_share: float  # Python code of sim/** run inside the cycle
    nvml_binding_share: float  # pynvml.py wrappers, backends/rawcalls.py, ctypes, and the C library they call
    gpulens_share: float  # exporter/** (backend, sampler, collectors, render, attribution)
    other_share: float  # stdlib, prometheus_client, ...
    driver: str = "native"
    hotspots: tuple[Hotspot, ...] = ()

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
    # rawcalls.py makes the hot NVML calls through ctypes in pynvml's stead: its time (the C call
    # inside it included) is the binding's, as pynvml's wrappers' was
    if filename.endswith("pynvml.py") or filename == _RAWCALLS or "/ctypes/" in filename:
        return "nvml"
    if filename.startswith(_EXPORTER_ROOT):
        return "gpulens"
    return "other"


def _where(filename: str, line: int) -> str:
    for root, label in ((_EXPORTER_ROOT, "exporter"), (_SIM_ROOT, "gpulens/sim")):
        if filename.startswith(root):
            return f"{label}{filename[len(root) :]}:{line}"
    if filename == "~":
        return "(builtin)"
    return f"{Path(filename).name}:{line}"


def measure_breakdown(
    scenario: str, interval: float = 2.0, cycles: int = 5, driver: str = "native", top: int = 12
) -> CycleBreakdown:
    exporter, clock, simulated = _exporter(scenario, interval, None, "real", driver)
    try:
        simulated.before_cycle()
        for _ in range(3):
            exporter.refresh()
            _advance(clock, interval, simulated)
        cpu: list[float] = []
        for _ in range(cycles):
            started = time.process_time()
            exporter.refresh()
            cpu.append(time.process_time() - started)
            _advance(clock, interval, simulated)
        profiler = cProfile.Profile()
        for _ in range(cycles):
            profiler.enable()
            _sync_cycle(exporter)
            profiler.disable()
            _advance(clock, interval, simulated)
    finally:
        exporter.close()
        simulated.close()
    totals = {"sim": 0.0, "nvml": 0.0, "gpulens": 0.0, "other": 0.0}
    spots: list[tuple[float, str, str, str, float]] = []
    raw_stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]  # undocumented, stable since 2.x
    for (filename, line, name), (_cc, calls, tottime, _ct, _callers) in raw_stats.items():
        category = _category(filename, name)
        if category is None:
            continue
        totals[category] += tottime
        spots.append((tottime, _where(filename, line), name, category, calls / cycles))
    whole = sum(totals.values()) or 1.0
    cpu.sort()
    spots.sort(key=lambda spot: -spot[0])
    return CycleBreakdown(
        scenario=scenario,
        cycles=cycles,
        cycle_cpu_ms=cpu[len(cpu) // 2] * 1e3,
        simulated_driver_share=totals["sim"] / whole,
        nvml_binding_share=totals["nvml"] / whole,
        gpulens_share=totals["gpulens"] / whole,
        other_share=totals["other"] / whole,
        driver=driver,
        hotspots=tuple(
            Hotspot(where, name, part, tottime / whole, calls)
            for tottime, where, name, part, calls in spots[:top]
        ),
    )
