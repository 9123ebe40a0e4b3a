"""The library serving the scenario engine's node (dgx-h100) rather than a hand-built one."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import ScenarioNode, build_node
from gpulens.sim.scenariofile import load_scenario
from tests.sim.drivers import installed

XID = pynvml.nvmlEventTypeXidCriticalError


@pytest.fixture(name="node")
def _node(nvml_driver: str) -> Iterator[ScenarioNode]:
    node = build_node(load_scenario("dgx-h100"), seed=1, clock=ManualClock(1_750_000_000.0))
    for served, _lib in installed(node, nvml_driver):
        yield served


def test_dgx_h100_has_eight_gpus_two_in_mig(node) -> None:
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    assert len(handles) == 8
    assert [pynvml.nvmlDeviceGetMigMode(h)[0] for h in handles] == [1, 1, 0, 0, 0, 0, 0, 0]


def test_every_mig_device_has_a_process_and_no_utilization(node) -> None:
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
        except pynvml.NVMLError_NotFound:
            continue
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(mig)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetUtilizationRates(mig)


def test_mps_clients_are_listed_on_the_mps_gpu(node) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    assert len(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle)) == 3
    assert len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle)) == 1  # the MPS server


def test_idle_event_set_times_out_then_delivers_the_injected_xid(node) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(4)
    event_set = pynvml.nvmlEventSetCreate()
    try:
        pynvml.nvmlDeviceRegisterEvents(handle, XID, event_set)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait(event_set, 50)
        node.clock.advance(1)
        node.inject_xid(4, 79)
        data = pynvml.nvmlEventSetWait(event_set, 1000)
        assert (data.eventType, data.eventData) == (XID, 79)
    finally:
        pynvml.nvmlEventSetFree(event_set)


def test_a_lost_gpu_raises_gpu_is_lost(node) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(5)
    node.set_lost(5, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(handle)


def test_gpm_over_a_simulated_interval(node) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(3)
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(handle, first)
    node.clock.advance(10)
    pynvml.nvmlGpmSampleGet(handle, second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    pynvml.nvmlGpmMetricsGet(request)
    assert request.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS
    assert 0.0 < request.metrics[0].value <= 100.0
    pynvml.nvmlGpmSampleFree(first)
    pynvml.nvmlGpmSampleFree(second)
