"""ECC mode and counters, retired pages and remapped rows, with their shapes."""

from __future__ import annotations

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


CORRECTED, UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED


def test_ecc_mode_is_a_list_of_current_and_pending(sim) -> None:
    assert pynvml.nvmlDeviceGetEccMode(handle(2)) == [1, 1]


def test_ecc_mode_is_not_supported_on_boards_without_ecc(sim) -> None:
    node, _ = sim
    node.update(2, ecc_enabled=None)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetEccMode(handle(2))


def test_total_ecc_errors_volatile_and_aggregate(sim) -> None:
    h = handle(2)
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, CORRECTED, pynvml.NVML_VOLATILE_ECC) == 4
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, UNCORRECTED, pynvml.NVML_AGGREGATE_ECC) == 1


def test_total_ecc_errors_with_ecc_off_is_not_supported(sim) -> None:
    node, _ = sim
    node.update(2, ecc_enabled=False)
    assert pynvml.nvmlDeviceGetEccMode(handle(2)) == [0, 0]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTotalEccErrors(handle(2), CORRECTED, pynvml.NVML_VOLATILE_ECC)


def test_total_ecc_errors_rejects_bad_types(sim) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTotalEccErrors(handle(2), 5, pynvml.NVML_VOLATILE_ECC)


def test_memory_error_counter_by_location(sim) -> None:
    node, _ = sim
    dram = pynvml.NVML_MEMORY_LOCATION_DRAM
    node.update(2, memory_error_counters={(CORRECTED, pynvml.NVML_VOLATILE_ECC, dram): 9})
    assert pynvml.nvmlDeviceGetMemoryErrorCounter(handle(2), CORRECTED, pynvml.NVML_VOLATILE_ECC, dram) == 9
    l2 = pynvml.NVML_MEMORY_LOCATION_L2_CACHE
    assert pynvml.nvmlDeviceGetMemoryErrorCounter(handle(2), CORRECTED, pynvml.NVML_VOLATILE_ECC, l2) == 0


def test_memory_error_counter_on_mig_only_instance_local_kinds(sim) -> None:
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)
    l1 = pynvml.NVML_MEMORY_LOCATION_L1_CACHE
    assert pynvml.nvmlDeviceGetMemoryErrorCounter(mig, UNCORRECTED, pynvml.NVML_VOLATILE_ECC, l1) == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMemoryErrorCounter(
            mig, UNCORRECTED, pynvml.NVML_VOLATILE_ECC, pynvml.NVML_MEMORY_LOCATION_DRAM
        )


def test_retired_pages_are_not_supported_on_ampere_and_newer(sim) -> None:
    cause = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPages(handle(2), cause)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle(2))


def test_retired_pages_v1_v2_and_pending(sim) -> None:
    node, _ = sim
    sbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    dbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    node.update(3, retired_pages={sbe: ((0xA000, 11), (0xB000, 12))}, retired_pages_pending=True)
    assert pynvml.nvmlDeviceGetRetiredPages(handle(3), sbe) == [0xA000, 0xB000]
    assert pynvml.nvmlDeviceGetRetiredPages_v2(handle(3), sbe) == [
        {"address": 0xA000, "timestamp": 11},
        {"address": 0xB000, "timestamp": 12},
    ]
    assert pynvml.nvmlDeviceGetRetiredPages(handle(3), dbe) == []
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle(3)) == 1


def test_remapped_rows_is_a_four_tuple(sim) -> None:
    node, _ = sim
    node.update(2, remapped_rows=(2, 1, True, False))
    assert pynvml.nvmlDeviceGetRemappedRows(handle(2)) == (2, 1, 1, 0)


def test_remapped_rows_v2_struct(sim) -> None:
    node, _ = sim
    node.update(2, remapped_rows=(2, 1, False, True))
    info = pynvml.c_nvmlRemappedRowsInfo_v2_t()
    pynvml.nvmlDeviceGetRemappedRows_v2(handle(2), pynvml.byref(info))
    assert (info.corrActiveRemaps, info.uncActiveRemaps, info.bPending, info.bfailureOccurred) == (2, 1, 0, 1)


def test_remapped_rows_not_supported_once_mig_instances_exist(sim) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(handle(0))


def test_remapped_rows_not_supported_without_row_remapping(sim) -> None:
    node, _ = sim
    node.update(3, remapped_rows=None)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(handle(3))
