"""The topology collector: GPU pair links and NUMA nodes from NVML, read once, absent when unsupported."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.exporter.backends.nvml import NvmlBackend
from gpulens.exporter.collectors import topology
from gpulens.exporter.collectors.base import CollectorOptions
from gpulens.exporter.snapshot import Area, GpuSample, Link, NodeSnapshot, TopologyReading
from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import ScenarioNode, build_node
from gpulens.sim.install import simulated
from gpulens.sim.scenariofile import load_scenario
from tests.exporter.expo import samples, value
from tests.exporter.scenario_run import START, scenario_exposition

TOPOLOGY_SYMBOLS = (
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetNumaNodeId",
)


def _links(text: str, gpu: str) -> dict[str, str]:
    return {
        s.labels["peer"]: s.labels["link"]
        for s in samples(text, "gpu_topology_info")
        if s.labels["gpu"] == gpu
    }


def test_a_pcie_box_publishes_switch_and_cross_socket_links(tmp_path: Path) -> None:
    text = scenario_exposition("pcie-split", tmp_path)
    links = _links(text, "2")
    assert links == {"0": "pcie_switch", "1": "pcie_switch", "3": "pcie_switch"} | {
        str(peer): "system" for peer in range(4, 8)
    }


def test_each_gpu_reports_its_numa_node(tmp_path: Path) -> None:
    text = scenario_exposition("pcie-split", tmp_path)
    assert [value(text, "gpu_numa_node", gpu=str(i)) for i in range(8)] == [0.0] * 4 + [1.0] * 4


def test_an_nvswitch_node_links_every_pair_over_nvlink_in_n_squared_minus_n_series(tmp_path: Path) -> None:
    text = scenario_exposition("dgx-h100", tmp_path)
    series = samples(text, "gpu_topology_info")
    assert len(series) == 8 * 7  # bounded by the node's GPUs: 56 on an 8-GPU node
    assert {s.labels["link"] for s in series} == {"nvlink"}


@pytest.fixture
def node() -> Iterator[ScenarioNode]:
    yield build_node(load_scenario("pcie-split"), seed=0, clock=ManualClock(START))


def topology_of(gpu: GpuSample) -> TopologyReading:
    """The GPU's topology reading (read in every test here)."""
    assert gpu.topology is not None
    return gpu.topology


def _read(node: ScenarioNode, exclude: tuple[str, ...] = ()) -> NodeSnapshot:
    with simulated(node, exclude=exclude):
        backend = NvmlBackend()
        backend.init()
        try:
            gpus = tuple(backend.read_gpu(i, frozenset({Area.TOPOLOGY}), 5.0)[0] for i in range(2))
        finally:
            backend.shutdown()
    return NodeSnapshot(timestamp=START, duration_seconds=0.0, nvml_up=True, gpus=gpus)


def test_the_family_is_absent_and_the_gpus_up_when_the_driver_lacks_the_topology_calls(node) -> None:
    snapshot = _read(node, exclude=TOPOLOGY_SYMBOLS)
    assert all(gpu.up and not gpu.failed_areas for gpu in snapshot.gpus)
    assert list(topology.collect(snapshot, CollectorOptions())) == []


def test_a_node_without_topology_answers_not_supported_and_the_family_is_absent(node) -> None:
    node.topology = None
    snapshot = _read(node)
    assert all(gpu.up and topology_of(gpu) == TopologyReading() for gpu in snapshot.gpus)


def test_the_topology_is_read_once_and_repeated_while_the_driver_runs(node) -> None:
    with simulated(node):
        backend = NvmlBackend()
        backend.init()
        try:
            for _cycle in range(2):  # pcie-split's 8 GPUs, read as the sampler reads them
                for gpu in range(8):
                    backend.read_gpu(gpu, frozenset({Area.TOPOLOGY}), 5.0)
            first, _ = backend.read_gpu(0, frozenset({Area.TOPOLOGY}), 5.0)
            node.topology = None  # a change the exporter must not see until a reset
            second, _ = backend.read_gpu(0, frozenset({Area.TOPOLOGY}), 5.0)
            backend.forget(0)  # a GPU reset (or loss) drops what was read
            third, _ = backend.read_gpu(0, frozenset({Area.TOPOLOGY}), 5.0)
        finally:
            backend.shutdown()
    assert topology_of(first).peers == topology_of(second).peers
    assert topology_of(first).peers[0].link == Link.PCIE_SWITCH
    assert topology_of(third).peers == ()


def test_a_pair_is_asked_about_only_once_the_peer_has_answered_its_own_read(node) -> None:
    """A call about a hung or lost peer may hang too: a pair is asked from its higher-index GPU's
    read, once the lower one has answered in this cycle, and serves both."""
    with simulated(node):
        backend = NvmlBackend()
        backend.init()
        try:
            before, _ = backend.read_gpu(0, frozenset({Area.TOPOLOGY}), 5.0)
            backend.read_gpu(1, frozenset({Area.TOPOLOGY}), 5.0)
            after, _ = backend.read_gpu(0, frozenset({Area.TOPOLOGY}), 5.0)
        finally:
            backend.shutdown()
    assert before.up and topology_of(before).peers == ()
    assert [p.peer for p in topology_of(after).peers] == [1]
