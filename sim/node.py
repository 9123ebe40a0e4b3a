"""The simulator's one entry point for programs that serve a simulated node: `simulated_node`.

    with simulated_node("dgx-h100", seed=0, speed=1.0) as sim:
        ...  # pynvml now talks to the simulated driver; sim.paths has its fake /proc and job files
             # and the MPS control client to run for its daemons (sim.paths.mps_control)

It builds the scenario's node on a real (or scaled) clock, writes its fake procfs, pod-log and
job-mapping trees into a temporary directory, installs the simulated NVML library under pynvml
and, when asked, the simulated DCGM host engine; on exit it undoes all of that, on every path.
The exporter's CLI finds it for `--simulate` through the `gpulens.simulated_node` entry point
(pyproject.toml); nothing in `gpulens.exporter` imports the simulator.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpulens.sim.clock import RealClock, ScaledClock
from gpulens.sim.dcgm import BINDINGS_DIR, hostengine
from gpulens.sim.engine import ScenarioNode, build_node
from gpulens.sim.install import install, uninstall
from gpulens.sim.mpscontrol import client_argv
from gpulens.sim.scenariofile import load_scenario


@dataclass(frozen=True)
class SimulatedPaths:
    """Where the simulated node writes its fake /proc, /var/log/pods and job-mapping files, and
    the MPS control client that answers for its daemons (the exporter's `--mps-control`)."""

    root: Path
    procfs: Path
    pod_logs: Path
    job_mapping: Path
    mps_control: tuple[str, ...] = field(default_factory=client_argv)


@dataclass(frozen=True)
class SimulatedNode:
    """An installed simulated node: the engine, its files, and the DCGM bindings serving it."""

    node: ScenarioNode
    paths: SimulatedPaths
    dcgm_bindings: Path | None  # the fake DCGM Python bindings, when the host engine is installed


@contextmanager
def simulated_node(
    scenario: str, *, seed: int = 0, speed: float = 1.0, dcgm: bool = False
) -> Iterator[SimulatedNode]:
    """Build and install the node of `scenario` (a built-in name or a YAML file); remove it on exit.

    Raises OSError or ValueError (a ScenarioError, one line) when the scenario cannot be loaded;
    nothing is left behind then either.
    """
    root = Path(tempfile.mkdtemp(prefix="gpulens-sim-"))
    try:
        paths = SimulatedPaths(
            root=root, procfs=root / "proc", pod_logs=root / "pods", job_mapping=root / "job-mapping"
        )
        for path in (paths.procfs, paths.pod_logs, paths.job_mapping):
            path.mkdir()
        clock = RealClock() if speed == 1.0 else ScaledClock(speed)
        node = build_node(
            load_scenario(scenario),
            seed=seed,
            clock=clock,
            procfs_root=paths.procfs,
            pods_root=paths.pod_logs,
            job_mapping_dir=paths.job_mapping,
        )
        install(node)
        try:
            if dcgm:
                hostengine.install(node)
            yield SimulatedNode(node=node, paths=paths, dcgm_bindings=BINDINGS_DIR if dcgm else None)
        finally:
            uninstall()
            engine = hostengine.current()
            if engine is not None and engine.node is node:
                hostengine.uninstall()
    finally:
        shutil.rmtree(root, ignore_errors=True)
