"""Memory info (v1 and v2), BAR1 and utilization, including the MIG quirks."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pynvml
import pytest

from gpulens.catalog import GIB
from gpulens.sim.nvml import SimLib
from tests.sim.static_node import StaticNode, example_node, installed


@pytest.fixture(name="sim")
def _sim(nvml_driver: str) -> Iterator[tuple[StaticNode, SimLib]]:
    yield from installed(example_node(), nvml_driver)


def test_memory_info_v1_reports_total_used_and_free(sim) -> None:
    info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(2))
    assert isinstance(info, pynvml.c_nvmlMemory_t)
    assert info.total == 40960 * 1024**2
    assert info.used == 10 * GIB + 512 * 1024**2
    assert info.free == info.total - info.used


def test_memory_info_v2_reports_reserved_apart_from_used(sim) -> None:
    """As a real H200 (driver 580): v2 `used` = v1 `used` - `reserved`, `free` is the same."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(3)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert isinstance(info, pynvml.c_nvmlMemory_v2_t)
    assert info.reserved == 512 * 1024**2
    assert info.used == v1.used - info.reserved == 0  # an idle GPU
    assert info.free == v1.free
    assert info.total == info.used + info.reserved + info.free


def test_memory_info_v2_with_a_wrong_struct_version_is_a_version_mismatch(sim) -> None:
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(3), version=0x01000028)


def test_mig_device_reports_its_own_instance_memory(sim) -> None:
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(0), 1)
    info = pynvml.nvmlDeviceGetMemoryInfo(mig, version=pynvml.nvmlMemory_v2)
    assert info.total == 20096 * 1024**2  # 2g.20gb on H100
    assert info.used == GIB + 12 * 1024**2


def test_bar1_memory(sim) -> None:
    bar1 = pynvml.nvmlDeviceGetBAR1MemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(2))
    assert bar1.bar1Total == 256 * 1024**2
    assert bar1.bar1Free + bar1.bar1Used == bar1.bar1Total


def test_utilization_rates_in_percent(sim) -> None:
    util = pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(2))
    assert (util.gpu, util.memory) == (41, 18)


def test_utilization_is_not_supported_on_a_mig_enabled_gpu(sim) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_utilization_is_not_supported_on_a_mig_device(sim) -> None:
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(mig)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetEncoderUtilization(mig)


def test_encoder_and_decoder_are_idle_with_a_sampling_period(sim) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetEncoderUtilization(handle) == [0, 167_000]
    assert pynvml.nvmlDeviceGetDecoderUtilization(handle) == [0, 167_000]


def test_null_output_pointer_is_invalid_argument(sim) -> None:
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo")
    assert fn(pynvml.nvmlDeviceGetHandleByIndex(0), None) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_a_handle_that_is_not_ours_is_invalid_argument(sim) -> None:
    bogus = ctypes.cast(ctypes.c_void_p(0x1000), pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMemoryInfo(bogus)
