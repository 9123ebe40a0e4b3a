"""GPM on Hopper and newer: support query, samples, metrics with per-metric returns."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pynvml
import pytest

from gpulens.sim.nvml import SimLib
from gpulens.sim.state import ActivityState
from tests.sim.static_node import StaticNode, example_node, installed


@pytest.fixture(name="sim")
def _sim(nvml_driver: str) -> Iterator[tuple[StaticNode, SimLib]]:
    yield from installed(example_node(), nvml_driver)


def handle(i: int):
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def metrics(node: StaticNode, take, ids: list[int], seconds: float = 1.0):
    """Take two samples `seconds` of simulated time apart and ask for `ids`."""
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    try:
        take(first)
        node.clock.advance(seconds)
        take(second)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(ids)
        request.sample1, request.sample2 = first, second
        for i, metric_id in enumerate(ids):
            request.metrics[i].metricId = metric_id
        pynvml.nvmlGpmMetricsGet(request)
        return [request.metrics[i] for i in range(len(ids))]
    finally:
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)


def test_gpm_is_supported_on_hopper_only(sim) -> None:
    assert pynvml.nvmlGpmQueryDeviceSupport(handle(1)).isSupportedDevice == 1
    assert pynvml.nvmlGpmQueryDeviceSupport(handle(2)).isSupportedDevice == 0


def test_gpm_sample_on_pre_hopper_is_not_supported(sim) -> None:
    sample = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(handle(2), sample)
    pynvml.nvmlGpmSampleFree(sample)


def test_percent_metrics_are_0_to_100_and_rates_are_mib_per_second(sim) -> None:
    node, _ = sim
    node.update(1, activity=ActivityState(sm=0.5, dram=0.25, tensor=0.1, pcie_tx_bytes_per_second=3 * 2**20))
    ids = [
        pynvml.NVML_GPM_METRIC_SM_UTIL,
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    ]
    got = metrics(node, lambda s: pynvml.nvmlGpmSampleGet(handle(1), s), ids)
    assert [m.nvmlReturn for m in got] == [0, 0, 0, 0]
    assert [m.value for m in got] == pytest.approx([50.0, 25.0, 10.0, 3.0])
    assert got[0].metricInfo.unit == b"%"
    assert got[3].metricInfo.unit == b"MiB/sec"


# the Python driver asks the node for the samples' exact interval; the native one integrates what
# was published (tests/sim/test_native_driver.py checks that)
@pytest.mark.parametrize("nvml_driver", ["python"])
def test_metrics_average_the_activity_between_the_samples(sim) -> None:
    node, _ = sim
    seen = []

    def spy(index, gpu_instance_id, start, end):
        seen.append((index, gpu_instance_id, end - start))
        return ActivityState(sm=0.3)

    node.activity_between = spy
    (sm,) = metrics(node, lambda s: pynvml.nvmlGpmSampleGet(handle(1), s), [2], seconds=5)
    assert sm.value == pytest.approx(30.0)
    assert seen == [(1, None, 5.0)]


def test_unknown_metric_gets_its_own_error(sim) -> None:
    node, _ = sim
    sm, bogus = metrics(node, lambda s: pynvml.nvmlGpmSampleGet(handle(1), s), [2, 199])
    assert sm.nvmlReturn == pynvml.NVML_SUCCESS
    assert bogus.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert math.isnan(bogus.value)


def test_per_link_nvlink_metric_beyond_the_links_is_not_supported(sim) -> None:
    node, _ = sim
    node.update(1, nvlinks=node.gpu_state(1).nvlinks[:2])
    l0, l5 = metrics(
        node,
        lambda s: pynvml.nvmlGpmSampleGet(handle(1), s),
        [pynvml.NVML_GPM_METRIC_NVLINK_L0_TX_PER_SEC, pynvml.NVML_GPM_METRIC_NVLINK_L5_TX_PER_SEC],
    )
    assert (l0.nvmlReturn, l5.nvmlReturn) == (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED)


def test_mig_instance_sample_through_the_mig_handle_and_through_the_parent(sim) -> None:
    node, _ = sim
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 1)  # gpu instance 2, sm = 0.5
    (via_handle,) = metrics(node, lambda s: pynvml.nvmlGpmSampleGet(mig, s), [2])
    (via_parent,) = metrics(node, lambda s: pynvml.nvmlGpmMigSampleGet(handle(0), 2, s), [2])
    assert via_handle.value == pytest.approx(50.0)
    assert via_parent.value == pytest.approx(50.0)


def test_mig_sample_of_a_missing_instance_is_not_found(sim) -> None:
    sample = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlGpmMigSampleGet(handle(0), 3, sample)
    pynvml.nvmlGpmSampleFree(sample)


def test_samples_from_different_devices_are_rejected(sim) -> None:
    node, _ = sim
    calls = iter([handle(0), handle(1)])
    node.update(0, mig_mode_current=0, mig_instances=())
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        metrics(node, lambda s: pynvml.nvmlGpmSampleGet(next(calls), s), [2])


def test_wrong_request_version_is_a_version_mismatch(sim) -> None:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = 7
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlGpmMetricsGet(request)


def test_streaming_can_be_switched_on_hopper_only(sim) -> None:
    assert pynvml.nvmlGpmQueryIfStreamingEnabled(handle(1)) == 0
    pynvml.nvmlGpmSetStreamingEnabled(handle(1), 1)
    assert pynvml.nvmlGpmQueryIfStreamingEnabled(handle(1)) == 1
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSetStreamingEnabled(handle(2), 1)
