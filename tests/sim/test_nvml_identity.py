"""Device enumeration and identity through pynvml's own wrappers."""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from gpulens.sim.nvml import SimLib
from tests.sim.static_node import StaticNode, example_node, installed


@pytest.fixture(name="sim")
def _sim(nvml_driver: str) -> Iterator[tuple[StaticNode, SimLib]]:
    yield from installed(example_node(), nvml_driver)


def address(handle: Any) -> int:  # a pynvml device handle (a ctypes pointer)
    value = ctypes.cast(handle, ctypes.c_void_p).value
    assert value is not None, "a NULL handle"
    return value


def test_handles_by_index_are_distinct_non_null_pointers(sim) -> None:
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    assert all(handles)
    assert len({address(h) for h in handles}) == 4


def test_handle_by_index_out_of_range_is_invalid_argument(sim) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(4)


def test_handle_by_uuid_finds_the_gpu(sim) -> None:
    handle = pynvml.nvmlDeviceGetHandleByUUID(b"GPU-00000002-1111-2222-3333-000000000002")
    assert pynvml.nvmlDeviceGetIndex(handle) == 2


def test_handle_by_mig_uuid_gives_the_mig_device(sim) -> None:
    handle = pynvml.nvmlDeviceGetHandleByUUID(b"MIG-00000000-aaaa-bbbb-cccc-000000000003")
    assert bool(pynvml.nvmlDeviceIsMigDeviceHandle(handle))
    assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"


def test_unknown_uuid_is_not_found(sim) -> None:
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID(b"GPU-deadbeef-0000-0000-0000-000000000000")


@pytest.mark.parametrize("bus_id", [b"00000000:28:00.0", b"0000:28:00.0", b"00000000:28:00.0".lower()])
def test_handle_by_pci_bus_id_accepts_both_domain_widths(sim, bus_id: bytes) -> None:
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)) == 1


def test_name_uuid_serial_and_pci_info(sim) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    assert pynvml.nvmlDeviceGetUUID(handle) == "GPU-00000001-1111-2222-3333-000000000001"
    assert pynvml.nvmlDeviceGetSerial(handle) == "1654320000001"
    pci = pynvml.nvmlDeviceGetPciInfo(handle)
    assert (pci.busId, pci.busIdLegacy) == ("00000000:28:00.0", "0000:28:00.0")
    assert (pci.domain, pci.bus, pci.device, pci.pciDeviceId) == (0, 0x28, 0, 0x233010DE)


def test_serial_is_not_supported_when_the_board_has_none(sim) -> None:
    node, _ = sim
    node.identities = (*node.identities[:3], dataclasses.replace(node.identities[3], serial=None))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetSerial(pynvml.nvmlDeviceGetHandleByIndex(3))


def test_name_that_does_not_fit_the_buffer_is_insufficient_size(sim) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    buffer = ctypes.create_string_buffer(8)
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetName")
    assert fn(handle, buffer, ctypes.c_uint(8)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE


def test_system_versions(sim) -> None:
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12040
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040


def test_architecture_and_compute_capability_follow_the_model(sim) -> None:
    hopper, ampere = pynvml.nvmlDeviceGetHandleByIndex(1), pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetArchitecture(hopper) == pynvml.NVML_DEVICE_ARCH_HOPPER
    assert pynvml.nvmlDeviceGetArchitecture(ampere) == pynvml.NVML_DEVICE_ARCH_AMPERE
    assert pynvml.nvmlDeviceGetCudaComputeCapability(hopper) == (9, 0)
    assert pynvml.nvmlDeviceGetCudaComputeCapability(ampere) == (8, 0)


def test_process_name_of_a_simulated_pid(sim) -> None:
    assert pynvml.nvmlSystemGetProcessName(30_001) == "nvidia-cuda-mps-server"
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlSystemGetProcessName(1)
