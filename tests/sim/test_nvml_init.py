"""Init, shutdown and installation of the simulated NVML library under the real pynvml."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from gpulens.sim.install import install, simulated, uninstall
from gpulens.sim.nvml import SimLib
from tests.sim.static_node import StaticNode, example_node, installed


@pytest.fixture(name="sim")
def _sim(nvml_driver: str) -> Iterator[tuple[StaticNode, SimLib]]:
    yield from installed(example_node(), nvml_driver)


def test_calls_before_init_raise_uninitialized() -> None:
    with simulated(example_node()), pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_init_makes_the_simulated_gpus_visible() -> None:
    with simulated(example_node()):
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 4
        pynvml.nvmlShutdown()


def test_init_is_refcounted_and_the_last_shutdown_uninitializes(sim) -> None:
    _node, lib = sim
    pynvml.nvmlInit()  # second reference
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 4  # one reference left
    pynvml.nvmlShutdown()
    assert not lib.initialized
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_handles_from_before_shutdown_stop_working(sim) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetName(handle)


def test_init_fails_with_the_code_the_node_asks_for() -> None:
    node = example_node()
    node.init_code = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with simulated(node) as lib:
        with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
            pynvml.nvmlInit()
        assert not lib.initialized


def test_reinstalling_starts_from_a_clean_state() -> None:
    first = install(example_node())
    pynvml.nvmlInit()
    second = install(example_node())
    try:
        assert pynvml.nvmlLib is second and first is not second
        with pytest.raises(pynvml.NVMLError_Uninitialized):  # the new library was never initialised
            pynvml.nvmlDeviceGetCount()
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 4
        pynvml.nvmlShutdown()
    finally:
        uninstall()
    assert pynvml.nvmlLib is None


def test_error_strings_come_from_the_library() -> None:
    with simulated(example_node()):
        pynvml.NVMLError._errcode_to_string.pop(pynvml.NVML_ERROR_NO_DATA, None)
        assert str(pynvml.NVMLError(pynvml.NVML_ERROR_NO_DATA)) == "No data"


def test_absent_symbols_raise_function_not_found(sim) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetVgpuSchedulerLog(handle)


def test_excluded_symbols_play_an_older_driver() -> None:
    with simulated(example_node(), exclude=["nvmlDeviceGetMemoryInfo_v2"]) as lib:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(2)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        assert pynvml.nvmlDeviceGetMemoryInfo(handle).total == 40960 * 1024**2
        assert "nvmlDeviceGetMemoryInfo_v2" in lib.missing_symbols
        pynvml.nvmlShutdown()
