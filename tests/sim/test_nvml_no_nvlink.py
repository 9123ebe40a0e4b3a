"""A GPU whose NVLink is not exposed (`nvlink: false`: a PCIe card, a VM with GPU passthrough)."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import ScenarioNode, build_node
from gpulens.sim.scenariofile import parse_scenario
from tests.sim.drivers import installed

SCENARIO = {"gpus": [{"model": "H200", "nvlink": False}, {"model": "H200"}]}

NVLINK_CALLS = {
    "state": lambda h: pynvml.nvmlDeviceGetNvLinkState(h, 0),
    "version": lambda h: pynvml.nvmlDeviceGetNvLinkVersion(h, 0),
    "error_counter": lambda h: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 0, 0),  # DL_REPLAY
}


@pytest.fixture(name="node")
def _node(nvml_driver: str) -> Iterator[ScenarioNode]:
    scenario = parse_scenario(SCENARIO, "<test>")
    node = build_node(scenario, seed=1, clock=ManualClock(1_750_000_000.0))
    for served, _lib in installed(node, nvml_driver):
        yield served


@pytest.mark.parametrize("call", NVLINK_CALLS.values(), ids=NVLINK_CALLS.keys())
def test_every_nvlink_call_is_not_supported_without_nvlink(node, call) -> None:
    """As on a real H200 passed through to a VM (driver 580)."""
    with pytest.raises(pynvml.NVMLError_NotSupported):
        call(pynvml.nvmlDeviceGetHandleByIndex(0))


@pytest.mark.parametrize("call", NVLINK_CALLS.values(), ids=NVLINK_CALLS.keys())
def test_the_same_model_with_nvlink_exposed_answers(node, call) -> None:
    assert isinstance(call(pynvml.nvmlDeviceGetHandleByIndex(1)), int)


def test_the_nvlink_link_count_field_reads_zero_without_nvlink(node) -> None:
    [value] = pynvml.nvmlDeviceGetFieldValues(
        pynvml.nvmlDeviceGetHandleByIndex(0), [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT]
    )
    assert (value.nvmlReturn, value.value.uiVal) == (pynvml.NVML_SUCCESS, 0)
