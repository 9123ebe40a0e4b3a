"""Faults that apply to every call: a lost GPU, a hanging GPU."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pynvml
import pytest

from gpulens.sim.install import simulated
from gpulens.sim.nvml import SimLib
from tests.sim.static_node import StaticNode, example_node, installed


@pytest.fixture(name="sim")
def _sim(nvml_driver: str) -> Iterator[tuple[StaticNode, SimLib]]:
    yield from installed(example_node(), nvml_driver)


def handle(i: int):
    return pynvml.nvmlDeviceGetHandleByIndex(i)


PER_DEVICE_CALLS = [
    pynvml.nvmlDeviceGetName,
    pynvml.nvmlDeviceGetUUID,
    pynvml.nvmlDeviceGetPciInfo,
    pynvml.nvmlDeviceGetMemoryInfo,
    pynvml.nvmlDeviceGetComputeRunningProcesses,
    pynvml.nvmlDeviceGetMigMode,
    pynvml.nvmlDeviceIsMigDeviceHandle,
    pynvml.nvmlDeviceGetPowerUsage,
    pynvml.nvmlDeviceGetEccMode,
    pynvml.nvmlDeviceGetRemappedRows,
    lambda h: pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP]),
    pynvml.nvmlGpmQueryDeviceSupport,
]


@pytest.mark.parametrize("call", PER_DEVICE_CALLS)
def test_every_call_on_a_lost_gpu_is_gpu_is_lost(sim, call) -> None:
    node, _ = sim
    h = handle(1)
    node.update(1, lost=True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        call(h)


def test_a_lost_gpu_cannot_be_opened_but_still_counts(sim) -> None:
    node, _ = sim
    node.update(2, lost=True)
    assert pynvml.nvmlDeviceGetCount() == 4
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByUUID(b"GPU-00000002-1111-2222-3333-000000000002")
    assert pynvml.nvmlDeviceGetName(handle(3)) == "NVIDIA A100-SXM4-40GB"  # the others are fine


def test_mig_devices_of_a_lost_gpu_are_lost_too(sim) -> None:
    node, _ = sim
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)
    node.update(0, lost=True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(mig)


def test_a_recovered_gpu_answers_again(sim) -> None:
    node, _ = sim
    h = handle(1)
    node.update(1, lost=True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetName(h)
    node.update(1, lost=False)
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"


def test_a_hanging_gpu_blocks_the_call_for_its_hang_then_answers() -> None:
    waits: list[float] = []  # the real seconds each call blocked for, recorded instead of slept
    node = example_node()
    with simulated(node, block=waits.append):
        pynvml.nvmlInit()
        h = handle(3)
        node.update(3, hang_seconds=0.3)
        assert pynvml.nvmlDeviceGetPowerUsage(h) == 55_000
        pynvml.nvmlShutdown()
    assert waits == [0.3]


def test_a_hang_releases_the_gil_so_other_gpus_keep_answering(sim) -> None:
    node, _ = sim
    node.update(3, hang_seconds=2.0)
    hung, other = handle(3), handle(2)
    calling = threading.Event()

    def call_the_hung_gpu() -> None:
        calling.set()
        pynvml.nvmlDeviceGetPowerUsage(hung)

    thread = threading.Thread(target=call_the_hung_gpu)
    thread.start()
    calling.wait(timeout=30)
    time.sleep(0.05)  # let the call reach its hang (there is nothing to wait on inside the driver)
    assert pynvml.nvmlDeviceGetPowerUsage(other) == 212_000
    assert thread.is_alive()  # answered while the hung call still blocks: it did not hold the GIL
    thread.join()


# a callback of the Python driver; the native one only reads what the publisher wrote
@pytest.mark.parametrize("nvml_driver", ["python"])
def test_a_bug_in_the_simulator_becomes_unknown_not_a_crash(sim) -> None:
    node, _ = sim

    def broken(index: int):
        raise RuntimeError("scenario engine bug")

    node.gpu_state = broken
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetHandleByIndex(0)


def test_a_hang_lasts_simulated_seconds_on_a_sped_up_clock() -> None:
    from gpulens.sim.clock import ScaledClock

    waits: list[float] = []
    node = example_node(clock=ScaledClock(speed=10))
    with simulated(node, block=waits.append):
        pynvml.nvmlInit()
        h = handle(3)
        node.update(3, hang_seconds=2.0)  # two simulated seconds: 0.2 s of real time
        pynvml.nvmlDeviceGetPowerUsage(h)
        pynvml.nvmlShutdown()
    assert waits == [pytest.approx(0.2)]
