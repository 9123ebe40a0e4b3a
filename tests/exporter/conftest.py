"""Fixtures: an `Exporter` on the hand-built simulated node (`tests/sim/static_node.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpulens.exporter.app import Exporter
from gpulens.exporter.collectors import REGISTRY
from gpulens.exporter.config import ExporterConfig
from gpulens.sim.install import install, uninstall
from gpulens.sim.state import SimNode
from tests.sim.static_node import StaticNode, example_node

ALL_COLLECTORS = frozenset(REGISTRY)


def make_exporter(node: SimNode, **config: object) -> Exporter:
    settings: dict[str, object] = {
        "interval": 1.0,
        "nvml_timeout": 0.5,
        "collectors": ALL_COLLECTORS,
        "pod_resources_socket": None,
    }
    settings.update(config)
    return Exporter(ExporterConfig(**settings), node=node)  # type: ignore[arg-type]


@pytest.fixture
def node() -> Iterator[StaticNode]:
    n = example_node()
    install(n)
    try:
        yield n
    finally:
        uninstall()


@pytest.fixture
def exporter(node: StaticNode) -> Iterator[Exporter]:
    ex = make_exporter(node)
    try:
        yield ex
    finally:
        ex.close()
