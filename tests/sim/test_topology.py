"""The simulated topology: defaults per model family, the `topology:` key, and the NVML answers."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.install import simulated
from gpulens.sim.scenario import ScenarioError
from gpulens.sim.scenariofile import list_builtin, load_scenario, parse_scenario


def scenario(gpus: list[dict[str, Any]], topology: Any = None) -> dict[str, Any]:
    data: dict[str, Any] = {"gpus": gpus}
    if topology is not None:
        data["topology"] = topology
    return data


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, "t.yaml")
    return str(info.value)


def test_an_nvswitch_model_defaults_to_nvlink_all_to_all() -> None:
    topo = parse_scenario(scenario([{"model": "H100-80GB", "count": 8}]), "t.yaml").topology
    assert topo is not None and topo.nvlink_domains == (tuple(range(8)),)


def test_a_pcie_model_defaults_to_two_switches_on_two_numa_nodes_without_nvlink() -> None:
    topo = parse_scenario(scenario([{"model": "L40S-48GB", "count": 8}]), "t.yaml").topology
    assert topo is not None and topo.nvlink_domains == ()
    assert topo.pcie_switches == ((0, 1, 2, 3), (4, 5, 6, 7)) == topo.numa_nodes


def test_bridged_cards_default_to_nvlink_pairs() -> None:
    topo = parse_scenario(scenario([{"model": "H100-94GB-NVL", "count": 4}]), "t.yaml").topology
    assert topo is not None and topo.nvlink_domains == ((0, 1), (2, 3))


def test_gpus_that_hide_nvlink_are_left_out_of_the_default_domain() -> None:
    gpus = [{"model": "H100-80GB", "count": 2}, {"model": "H100-80GB", "nvlink": False}]
    topo = parse_scenario(scenario(gpus), "t.yaml").topology
    assert topo is not None and topo.nvlink_domains == ((0, 1),)


@pytest.mark.parametrize("name", list_builtin())
def test_every_shipped_scenario_has_a_topology(name: str) -> None:
    assert load_scenario(name).topology is not None


@pytest.mark.parametrize(
    ("topology", "message"),
    [
        (
            [],
            "t.yaml: topology: expected a mapping with keys nvlink, pcie_switches, numa_nodes, found a list",
        ),
        ({"switches": []}, "t.yaml: topology.switches: expected one of the keys"),
        (
            {"pcie_switches": [[0, 1]]},
            "t.yaml: topology.pcie_switches: expected every GPU in one group, found GPU 2",
        ),
        (
            {"numa_nodes": [[0, 1], [1, 2, 3]]},
            "t.yaml: topology.numa_nodes[1]: expected each GPU once, found GPU 1",
        ),
        ({"nvlink": [[0, 9]]}, "t.yaml: topology.nvlink[0]: expected GPU indexes 0..3, found 9"),
        ({"nvlink": "some"}, "t.yaml: topology.nvlink: expected a list of GPU-index lists"),
        ({"nvlink": [[0, 1]]}, "t.yaml: topology.nvlink: expected GPUs that expose NVLink, found GPU 0"),
        (
            {"pcie_switches": [[0, 1, 2], [3]], "numa_nodes": [[0, 1], [2, 3]]},
            "t.yaml: topology.pcie_switches: expected the GPUs of one switch on one NUMA node",
        ),
    ],
)
def test_a_bad_topology_is_one_line_naming_the_field(topology: Any, message: str) -> None:
    error = error_of(scenario([{"model": "L4-24GB", "count": 4}], topology))
    assert error.startswith(message) and "\n" not in error


def test_the_driver_answers_common_ancestor_p2p_and_numa() -> None:
    node = build_node(load_scenario("pcie-split"), seed=0, clock=ManualClock(1.0e9))
    with simulated(node):
        pynvml.nvmlInit()
        try:
            h = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1, 4)]
            same, split = (pynvml.nvmlDeviceGetTopologyCommonAncestor(h[0], o) for o in (h[1], h[2]))
            nvlink = pynvml.nvmlDeviceGetP2PStatus(h[0], h[1], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
            numa = [pynvml.nvmlDeviceGetNumaNodeId(x) for x in h]
        finally:
            pynvml.nvmlShutdown()
    assert (same, split) == (pynvml.NVML_TOPOLOGY_SINGLE, pynvml.NVML_TOPOLOGY_SYSTEM)
    assert nvlink == pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
    assert numa == [0, 0, 1]


def test_nvlink_pairs_answer_p2p_ok_over_nvlink() -> None:
    node = build_node(load_scenario("dgx-h100"), seed=0, clock=ManualClock(1.0e9))
    with simulated(node):
        pynvml.nvmlInit()
        try:
            a, b = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 7))
            status = pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
        finally:
            pynvml.nvmlShutdown()
    assert status == pynvml.NVML_P2P_STATUS_OK
