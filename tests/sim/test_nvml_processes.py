"""Running processes, per-process utilization and accounting."""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Iterator

import pynvml
import pytest

from gpulens.catalog import GIB
from gpulens.sim.nvml import SimLib
from gpulens.sim.state import NO_INSTANCE, ProcessState
from tests.sim.static_node import START, StaticNode, example_node, installed


@pytest.fixture(name="sim")
def _sim(nvml_driver: str) -> Iterator[tuple[StaticNode, SimLib]]:
    yield from installed(example_node(), nvml_driver)


def handle(i: int):
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def test_compute_processes_are_friendly_objects_with_the_four_fields(sim) -> None:
    (proc,) = pynvml.nvmlDeviceGetComputeRunningProcesses(handle(2))
    assert isinstance(proc, pynvml.nvmlFriendlyObject)
    assert (proc.pid, proc.usedGpuMemory) == (40_000, 10 * GIB)
    assert (proc.gpuInstanceId, proc.computeInstanceId) == (NO_INSTANCE, NO_INSTANCE)


def test_no_processes_is_an_empty_list(sim) -> None:
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle(3)) == []
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle(3)) == []


def test_mps_server_is_the_compute_process_and_clients_are_listed_separately(sim) -> None:
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle(1))] == [30_001]
    clients = pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle(1))
    assert [(p.pid, p.usedGpuMemory) for p in clients] == [(30_010, 2 * GIB), (30_011, 3 * GIB)]


def test_unknown_memory_is_none(sim) -> None:
    node, _ = sim
    proc = ProcessState(pid=7, kind="graphics", used_memory_bytes=None)
    node.update(3, processes=(proc,))
    (listed,) = pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle(3))
    assert (listed.pid, listed.usedGpuMemory) == (7, None)


def test_mig_device_lists_its_instance_processes(sim) -> None:
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 3)
    (proc,) = pynvml.nvmlDeviceGetComputeRunningProcesses(mig)
    assert (proc.pid, proc.gpuInstanceId, proc.computeInstanceId, proc.usedGpuMemory) == (20_003, 4, 0, GIB)


def test_mig_parent_lists_all_instances_without_memory(sim) -> None:
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle(0))
    assert sorted((p.pid, p.gpuInstanceId) for p in procs) == [(20_000, 1), (20_001, 2), (20_003, 4)]
    assert {p.usedGpuMemory for p in procs} == {None}


def test_size_probe_returns_insufficient_size_and_the_count(sim) -> None:
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMPSComputeRunningProcesses_v3")
    count = ctypes.c_uint(0)
    assert fn(handle(1), ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2


def test_nvitop_style_direct_function_pointer_call_with_its_own_array(sim) -> None:
    """nvitop fetches the _v3 pointer and passes arrays of its own struct class."""

    class NvitopProcessInfo(ctypes.Structure):
        _fields_ = [
            ("pid", ctypes.c_uint),
            ("usedGpuMemory", ctypes.c_ulonglong),
            ("gpuInstanceId", ctypes.c_uint),
            ("computeInstanceId", ctypes.c_uint),
        ]

    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    count = ctypes.c_uint(0)
    assert fn(handle(0), ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    count.value = count.value * 2 + 5
    array = (NvitopProcessInfo * count.value)()
    assert fn(handle(0), ctypes.byref(count), array) == pynvml.NVML_SUCCESS
    assert count.value == 3
    assert sorted(array[i].pid for i in range(3)) == [20_000, 20_001, 20_003]
    assert array[0].usedGpuMemory == 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE on a MIG parent


def test_nvitop_own_process_listing_runs_unchanged(sim) -> None:
    from nvitop.api import libnvml

    procs = libnvml.nvmlDeviceGetComputeRunningProcesses(handle(2))
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(40_000, 10 * GIB)]


def test_v2_symbols_serve_the_same_layout(sim) -> None:
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle(2))
    assert [p.pid for p in procs] == [40_000]


def test_process_utilization_samples_busy_processes(sim) -> None:
    (sample,) = pynvml.nvmlDeviceGetProcessUtilization(handle(2), 0)
    assert (sample.pid, sample.smUtil, sample.memUtil) == (40_000, 37, 12)
    assert sample.timeStamp == int(START * 1_000_000)


def test_process_utilization_without_new_samples_is_not_found(sim) -> None:
    now_us = int(START * 1_000_000)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(handle(2), now_us)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(handle(3), 0)  # idle GPU: never any sample


def test_processes_utilization_info_v1(sim) -> None:
    (sample,) = pynvml.nvmlDeviceGetProcessesUtilizationInfo(handle(2), 0)
    assert isinstance(sample, pynvml.c_nvmlProcessUtilizationInfo_v1_t)
    assert (sample.pid, sample.smUtil, sample.memUtil, sample.jpgUtil) == (40_000, 37, 12, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessesUtilizationInfo(handle(3), 0)


@pytest.mark.parametrize(
    "api", [pynvml.nvmlDeviceGetProcessUtilization, pynvml.nvmlDeviceGetProcessesUtilizationInfo]
)
def test_process_utilization_is_not_supported_with_mig(sim, api) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        api(handle(0), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        api(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0), 0)


def test_mps_clients_have_utilization_samples(sim) -> None:
    samples = pynvml.nvmlDeviceGetProcessUtilization(handle(1), 0)
    assert sorted((s.pid, s.smUtil) for s in samples) == [(30_010, 20), (30_011, 21)]


def test_accounting_is_off_by_default(sim) -> None:
    assert pynvml.nvmlDeviceGetAccountingMode(handle(2)) == pynvml.NVML_FEATURE_DISABLED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetAccountingPids(handle(2))


def test_accounting_pids_and_stats_when_enabled(sim) -> None:
    node, _ = sim
    node.update(2, accounting_enabled=True)
    assert pynvml.nvmlDeviceGetAccountingMode(handle(2)) == pynvml.NVML_FEATURE_ENABLED
    assert pynvml.nvmlDeviceGetAccountingPids(handle(2)) == [40_000]
    stats = pynvml.nvmlDeviceGetAccountingStats(handle(2), 40_000)
    assert (stats.gpuUtilization, stats.memoryUtilization, stats.maxMemoryUsage) == (37, 12, 10 * GIB)
    assert (stats.isRunning, stats.time, stats.startTime) == (1, 0, int((START - 3600) * 1_000_000))
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetAccountingStats(handle(2), 1)


def test_accounting_is_not_supported_on_mig_devices(sim) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetAccountingMode(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0))


def test_process_lists_follow_state_changes(sim) -> None:
    node, _ = sim
    state = node.gpu_state(2)
    node.update(2, processes=(*state.processes, dataclasses.replace(state.processes[0], pid=40_001)))
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle(2))] == [40_000, 40_001]
