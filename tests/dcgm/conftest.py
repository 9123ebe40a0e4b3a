"""Fixtures: a built-in scenario under the simulated NVML, a manual clock, and the simulated DCGM.

`SimNode` here is the scenario engine (`ScenarioNode`), so DCGM values can be compared with the
scenario's own activity (`node.activity_between`) over the same window.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest
from prometheus_client.core import Metric

from gpulens.exporter.app import Exporter
from gpulens.exporter.collectors import REGISTRY
from gpulens.exporter.config import ExporterConfig
from gpulens.sim.clock import ManualClock
from gpulens.sim.dcgm import BINDINGS_DIR, hostengine
from gpulens.sim.engine import ScenarioNode, build_node
from gpulens.sim.install import install, uninstall
from gpulens.sim.scenariofile import load_scenario

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
STEP = 5.0


@dataclass
class Sim:
    node: ScenarioNode
    clock: ManualClock
    dirs: dict[str, Path]

    def handle(self, index: int) -> Any:
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def activity(self, index: int, gpu_instance: int | None = None, window: float = STEP) -> Any:
        now = self.clock.now()
        return self.node.activity_between(index, gpu_instance, now - window, now)

    def exporter(self, **config: Any) -> Exporter:
        settings: dict[str, Any] = {
            "interval": STEP,
            "collectors": frozenset(REGISTRY),
            "procfs": self.dirs["proc"],
            "pod_logs_dir": self.dirs["pods"],
            "job_mapping_dir": self.dirs["mapping"],
            "pod_resources_socket": None,
        }
        settings.update(config)
        profiling = settings.get("profiling", "auto")
        if profiling == "dcgm" or (profiling == "auto" and settings.get("dcgm_bindings")):
            # what the CLI's --simulate branch does: the simulated host engine serves this node
            engine = hostengine.current()
            if engine is None or engine.node is not self.node:
                hostengine.install(self.node)
            settings.setdefault("dcgm_bindings", BINDINGS_DIR)
            settings["dcgm_bindings"] = settings["dcgm_bindings"] or BINDINGS_DIR
        return Exporter(ExporterConfig(**settings), node=self.node)


@pytest.fixture
def simulate(tmp_path: Path) -> Iterator[Callable[[str], Sim]]:
    """`simulate("k8s-a100-mixed")`: build, install (NVML initialised) and later remove a node."""
    started: list[Sim] = []

    def make(scenario: str) -> Sim:
        dirs = {key: tmp_path / key for key in ("proc", "pods", "mapping")}
        for path in dirs.values():
            path.mkdir(exist_ok=True)
        clock = ManualClock(START)
        node = build_node(
            load_scenario(scenario),
            seed=0,
            clock=clock,
            procfs_root=dirs["proc"],
            pods_root=dirs["pods"],
            job_mapping_dir=dirs["mapping"],
        )
        install(node)
        pynvml.nvmlInit()
        sim = Sim(node, clock, dirs)
        started.append(sim)
        return sim

    try:
        yield make
    finally:
        for _ in started:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
        hostengine.uninstall()
        uninstall()


def family(families: list[Metric], name: str) -> Metric | None:
    """The family of `name` (a counter family is named without `_total`, its samples with)."""
    return next((f for f in families if name in (f.name, f.name + "_total")), None)


def series(families: list[Metric], name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    f = family(families, name)
    if f is None:
        return []
    return [
        (s.labels, s.value)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def one(families: list[Metric], name: str, **labels: str) -> float | None:
    matches = series(families, name, **labels)
    assert len(matches) <= 1, matches
    return matches[0][1] if matches else None


def two_samples(exporter: Exporter, sim: Sim) -> list[Metric]:
    """Families of the second sample, STEP seconds after the first (profiling needs a window)."""
    try:
        exporter.sample_once()
        sim.clock.advance(STEP)
        return exporter.families(exporter.sample_once())
    finally:
        exporter.close()
