"""Profile one exporter sampling cycle in-process: `python -m gpulens.devtools.bench.profile_cycle`.

Why in-process: `gpulens bench` measures the whole exporter from /proc, which says *how much* a cycle
costs but not *where*. This runs the same `Exporter` on the same simulated node (default `large`),
times full cycles (sample + render) by process CPU time, which counts the GPU reader thread
too, and, with `--profile`, runs the per-GPU reads synchronously on this thread under cProfile so
everything the reader thread does in the daemon shows up. The driver is the native simulated one by
default (its C time appears inside the pynvml calls that make it); `--driver python` profiles
the ctypes callbacks instead.

By default the simulated node runs on the real clock, so time passes between the NVML calls of a
cycle as it does in the daemon (per-instant caches in the simulator must cope with that); with
`--clock manual` it is advanced by `--interval` per cycle and every call of a cycle sees one instant.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pynvml

from gpulens.exporter.app import Exporter
from gpulens.exporter.collectors import DEFAULT_ENABLED
from gpulens.exporter.config import ExporterConfig
from gpulens.sim.clock import ManualClock, RealClock
from gpulens.sim.engine import build_node
from gpulens.sim.install import install, uninstall
from gpulens.sim.native import build
from gpulens.sim.native.publisher import ENV_SHM, Publisher
from gpulens.sim.scenariofile import load_scenario


class Driver:
    """The simulated NVML driver a profiled exporter runs on.

    native (default): the C library, loaded by pynvml as `libnvidia-ml.so.1`; the node is
    published before each cycle (`before_cycle`, outside the timed part), so a cycle's CPU is what
    the exporter spends with a driver in C, as on a GPU node. python: the ctypes callbacks, whose
    cost then sits inside the cycle.
    """

    def __init__(self, kind: str, node: Any) -> None:
        self.kind = kind
        self.publisher: Any = None
        if kind == "python":
            install(node)
            return
        build.load()  # by path first: pynvml's CDLL("libnvidia-ml.so.1") then finds this one
        self.publisher = Publisher(node, activity_quantum=0)
        os.environ[ENV_SHM] = str(self.publisher.path)
        with pynvml.libLoadLock:
            pynvml.nvmlLib = None
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml._nvmlLib_refcount = 0

    def before_cycle(self) -> None:
        if self.publisher is not None:
            self.publisher.publish()

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
        else:
            uninstall()


def _exporter(
    scenario: str, interval: float, collectors: frozenset[str] | None, clock_kind: str, driver: str = "native"
) -> tuple[Exporter, Any, Driver]:
    root = Path(tempfile.mkdtemp(prefix="gpulens-profile-"))
    for sub in ("proc", "pods", "job-mapping"):
        (root / sub).mkdir()
    clock: Any = ManualClock(start=1_750_000_000.0) if clock_kind == "manual" else RealClock()
    node = build_node(
        load_scenario(scenario),
        clock=clock,
        procfs_root=root / "proc",
        pods_root=root / "pods",
        job_mapping_dir=root / "job-mapping",
    )
    simulated = Driver(driver, node)
    config = ExporterConfig(
        interval=interval,
        pod_logs_dir=root / "pods",
        job_mapping_dir=root / "job-mapping",
        pod_resources_socket=None,
        collectors=collectors,
    )
    return Exporter(config, node=node), clock, simulated


def _advance(clock: Any, seconds: float, driver: Driver | None = None) -> None:
    """Move a manual clock on; on a real clock wait, so GPM windows and caches age as in the daemon.
    Then the driver publishes the node's new state (native), outside any timed part."""
    if isinstance(clock, ManualClock):
        clock.advance(seconds)
    else:
        time.sleep(seconds)
    if driver is not None:
        driver.before_cycle()


def _sync_cycle(exporter: Exporter) -> None:
    """One cycle with every GPU read on this thread (so cProfile sees the driver's work)."""
    sampler = exporter.sampler
    backend = sampler.backend
    sampler._ensure_init()
    for index in range(backend.device_count()):
        backend.read_gpu(index, sampler.settings.areas, sampler.settings.interval)
    exporter.refresh()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="large")
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--profile", action="store_true", help="cProfile synchronous cycles")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--clock",
        choices=("real", "manual"),
        default="real",
        help="real: time passes during a cycle, as in the daemon; manual: every call sees one instant",
    )
    parser.add_argument("--no-collector", action="append", default=[], help="disable a collector")
    parser.add_argument(
        "--driver",
        choices=("native", "python"),
        default="native",
        help="simulated NVML: native (C, as on a GPU node) or python (callbacks, counted in the cycle)",
    )
    args = parser.parse_args(argv)
    collectors = frozenset(DEFAULT_ENABLED) - set(args.no_collector) if args.no_collector else None
    exporter, clock, driver = _exporter(args.scenario, args.interval, collectors, args.clock, args.driver)
    try:
        for _ in range(3):  # warm-up: GPM needs a previous sample, caches fill
            exporter.refresh()
            _advance(clock, args.interval, driver)
        cpu: list[float] = []
        for _ in range(args.cycles):
            started = time.process_time()
            exporter.refresh()
            cpu.append(time.process_time() - started)
            _advance(clock, args.interval, driver)
        cpu.sort()
        print(
            f"{args.scenario}: cpu per cycle (sample + render, all threads) over {args.cycles} cycles: "
            f"median {cpu[len(cpu) // 2] * 1e3:.1f} ms, min {cpu[0] * 1e3:.1f} ms, max {cpu[-1] * 1e3:.1f} ms"
        )
        if args.profile:
            profiler = cProfile.Profile()
            for _ in range(args.cycles):
                profiler.enable()
                _sync_cycle(exporter)
                profiler.disable()
                _advance(clock, args.interval, driver)
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats(args.sort).print_stats(args.top)
            print(out.getvalue())
    finally:
        exporter.close()
        driver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
