"""MIG mode, MIG device handles, ids, attributes and GPU-instance profiles."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pynvml
import pytest

from gpulens.sim.nvml import SimLib
from tests.sim.static_node import StaticNode, example_node, installed


@pytest.fixture(name="sim")
def _sim(nvml_driver: str) -> Iterator[tuple[StaticNode, SimLib]]:
    yield from installed(example_node(), nvml_driver)


def handle(i: int):
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def mig(slot: int):
    return pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), slot)


def test_mig_mode_is_a_two_element_list(sim) -> None:
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [1, 1]
    assert pynvml.nvmlDeviceGetMigMode(handle(1)) == [0, 0]


def test_mig_mode_pending_change_is_reported(sim) -> None:
    node, _ = sim
    node.update(1, mig_mode_pending=1)
    assert pynvml.nvmlDeviceGetMigMode(handle(1)) == [0, 1]


def test_mig_mode_is_not_supported_without_mig(sim) -> None:
    node, _ = sim
    node.update(3, mig_mode_current=None, mig_mode_pending=None)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(handle(3))


def test_max_mig_device_count_is_zero_when_mig_is_off(sim) -> None:
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(0)) == 7
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(1)) == 0


def test_empty_slots_are_not_found(sim) -> None:
    found, missing = [], []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(0))):
        try:
            found.append(pynvml.nvmlDeviceGetName(mig(slot)))
        except pynvml.NVMLError_NotFound:
            missing.append(slot)
    assert found == [
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
    ]
    assert missing == [2, 4, 5, 6]


def test_slot_beyond_the_maximum_is_invalid_argument(sim) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        mig(7)


def test_mig_device_handle_with_mig_off_is_not_found(sim) -> None:
    """Every slot of a MIG-capable GPU with MIG off is empty (real H200, driver 580)."""
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(1), 0)


def test_mig_device_handle_on_a_gpu_without_mig_is_not_supported(sim) -> None:
    node, _ = sim
    node.update(3, mig_mode_current=None, mig_mode_pending=None)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(3), 0)


def test_is_mig_device_handle_returns_a_c_uint(sim) -> None:
    result = pynvml.nvmlDeviceIsMigDeviceHandle(mig(0))
    assert isinstance(result, ctypes.c_uint)
    assert result != 1  # the classic trap: compare with bool(), not ==
    assert bool(result) and result.value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(handle(0)).value == 0


def test_parent_handle_points_at_the_physical_gpu(sim) -> None:
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig(3))
    assert ctypes.cast(parent, ctypes.c_void_p).value == ctypes.cast(handle(0), ctypes.c_void_p).value


def test_gpu_and_compute_instance_ids(sim) -> None:
    assert pynvml.nvmlDeviceGetGpuInstanceId(mig(3)) == 4
    assert pynvml.nvmlDeviceGetComputeInstanceId(mig(3)) == 0


@pytest.mark.parametrize(
    "api", [pynvml.nvmlDeviceGetAttributes, pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle]
)
def test_mig_only_calls_are_not_supported_on_physical_handles(sim, api) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        api(handle(0))


INSTANCE_ID_CALLS = [pynvml.nvmlDeviceGetGpuInstanceId, pynvml.nvmlDeviceGetComputeInstanceId]


@pytest.mark.parametrize("api", INSTANCE_ID_CALLS)
@pytest.mark.parametrize("gpu", [0, 1], ids=["mig-on", "mig-off"])
def test_instance_ids_of_a_full_gpu_handle_are_an_invalid_argument(sim, api, gpu) -> None:
    """A real H200 (MIG off, driver 580) raises INVALID_ARGUMENT for a MIG-capable GPU's handle."""
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        api(handle(gpu))


@pytest.mark.parametrize("api", INSTANCE_ID_CALLS)
def test_instance_ids_on_a_gpu_without_mig_are_not_supported(sim, api) -> None:
    node, _ = sim
    node.update(3, mig_mode_current=None, mig_mode_pending=None)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        api(handle(3))


def test_mig_uuid_and_attributes(sim) -> None:
    device = mig(0)
    assert pynvml.nvmlDeviceGetUUID(device) == "MIG-00000000-aaaa-bbbb-cccc-000000000000"
    attrs = pynvml.nvmlDeviceGetAttributes(device)
    assert (attrs.multiprocessorCount, attrs.gpuInstanceSliceCount, attrs.memorySizeMB) == (60, 3, 40448)
    assert attrs.sharedCopyEngineCount == 3


def test_gpu_instance_profile_info_v2_names_the_profile(sim) -> None:
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(0), pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert info.version == 0  # cleared on the way out, as a real H200 (driver 580) does
    assert (info.name, info.sliceCount, info.instanceCount, info.memorySizeMB) == ("MIG 1g.10gb", 1, 7, 9984)
    assert info.multiprocessorCount == 16


def test_gpu_instance_profile_info_v1(sim) -> None:
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
        handle(0), pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, version=1
    )
    assert (info.id, info.sliceCount, info.multiprocessorCount, info.memorySizeMB) == (0, 7, 132, 81152)


def test_gpu_instance_profile_id_is_the_one_nvidia_smi_lists(sim) -> None:
    """`id` is the device's profile id (`nvidia-smi mig -lgip`), not the NVML_GPU_INSTANCE_PROFILE_*
    argument: a real H200 answers 19 for 1_SLICE."""
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(0), pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert info.id == 19


def test_hopper_1g_profile_has_one_decoder_and_one_jpeg_engine(sim) -> None:
    """As a real H200 reports its 1g.18gb: Hopper's NVDECs and NVJPGs go one per compute slice."""
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(0), pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    engines = (info.copyEngineCount, info.decoderCount, info.encoderCount, info.jpegCount, info.ofaCount)
    assert engines == (1, 1, 0, 1, 0)


def test_gpu_instance_profile_info_is_served_with_mig_off(sim) -> None:
    """A real H200 with MIG disabled describes its profiles (tools size instances before enabling)."""
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(1), pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert (info.name, info.sliceCount, info.instanceCount) == ("MIG 1g.10gb", 1, 7)


def test_gpu_instance_profile_info_needs_mig_support_and_a_known_profile(sim) -> None:
    node, _ = sim
    node.update(3, mig_mode_current=None, mig_mode_pending=None)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(3), pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(0), pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)


def test_a_mig_handle_goes_stale_when_the_instance_disappears(sim) -> None:
    node, _ = sim
    device = mig(3)
    state = node.gpu_state(0)
    node.update(0, mig_instances=state.mig_instances[:2])
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(device)
    with pytest.raises(pynvml.NVMLError_NotFound):
        mig(3)
