"""PCIe, NVLink and field values (each entry carrying its own nvmlReturn)."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from gpulens.sim.nvml import SimLib
from gpulens.sim.state import NvLinkState
from tests.sim.static_node import START, StaticNode, example_node, installed


@pytest.fixture(name="sim")
def _sim(nvml_driver: str) -> Iterator[tuple[StaticNode, SimLib]]:
    yield from installed(example_node(), nvml_driver)


def handle(i: int):
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def field(h, field_id: int, scope: int | None = None):
    (value,) = pynvml.nvmlDeviceGetFieldValues(h, [field_id if scope is None else (field_id, scope)])
    return value


def test_pcie_throughput_replays_and_link(sim) -> None:
    node, _ = sim
    node.update(2, pcie_tx_kbps=1234, pcie_rx_kbps=99, pcie_replay_count=3)
    h = handle(2)
    assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 1234
    assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES) == 99
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 3
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == 4
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h) == 16
    assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle(1)) == 5


def test_nvlink_state_version_and_errors(sim) -> None:
    node, _ = sim
    links = list(node.gpu_state(1).nvlinks)
    links[2] = NvLinkState(link=2, active=False, tx_kib_total=0, rx_kib_total=0, errors={2: 5})
    node.update(1, nvlinks=tuple(links))
    h = handle(1)
    assert pynvml.nvmlDeviceGetNvLinkState(h, 0) == pynvml.NVML_FEATURE_ENABLED
    assert pynvml.nvmlDeviceGetNvLinkState(h, 2) == pynvml.NVML_FEATURE_DISABLED
    assert pynvml.nvmlDeviceGetNvLinkVersion(h, 0) == 4  # Hopper: NVLink 4
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 2, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 5
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 2, pynvml.NVML_NVLINK_ERROR_DL_REPLAY) == 0


def test_nvlink_link_beyond_the_board_is_invalid_argument(sim) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(handle(1), 18)


def test_nvlink_is_not_supported_without_links(sim) -> None:
    node, _ = sim
    node.update(3, nvlinks=())
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(handle(3), 0)
    assert field(handle(3), pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF).nvmlReturn == (
        pynvml.NVML_ERROR_NOT_SUPPORTED
    )


def test_field_values_carry_type_timestamp_and_return_per_entry(sim) -> None:
    values = pynvml.nvmlDeviceGetFieldValues(
        handle(2), [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, 307]
    )
    temp, sbe, unsupported = values
    assert (temp.nvmlReturn, temp.valueType, temp.value.uiVal) == (0, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 35)
    assert temp.timestamp == int(START * 1_000_000)
    assert (sbe.nvmlReturn, sbe.valueType, sbe.value.ullVal) == (
        0,
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        17,
    )
    assert unsupported.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_ecc_fields(sim) -> None:
    got = [field(handle(2), f).value.ullVal for f in (3, 4, 5, 6)]
    assert got == [4, 0, 17, 1]


def test_ecc_fields_are_not_supported_with_ecc_off(sim) -> None:
    node, _ = sim
    node.update(2, ecc_enabled=False)
    assert (
        field(handle(2), pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL).nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    )


def test_memory_temperature_field_not_supported_when_absent(sim) -> None:
    node, _ = sim
    node.update(2, memory_temperature_c=None)
    assert field(handle(2), pynvml.NVML_FI_DEV_MEMORY_TEMP).nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_remap_fields(sim) -> None:
    node, _ = sim
    node.update(2, remapped_rows=(3, 1, True, False))
    got = [field(handle(2), f).value.uiVal for f in (142, 143, 144, 145)]
    assert got == [3, 1, 1, 0]


def test_retired_page_fields_only_where_pages_are_retired(sim) -> None:
    assert field(handle(2), pynvml.NVML_FI_DEV_RETIRED_SBE).nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    node, _ = sim
    node.update(
        2, retired_pages={0: ((0x1000, 1), (0x2000, 2)), 1: ((0x3000, 3),)}, retired_pages_pending=True
    )
    got = [field(handle(2), f).value.ullVal for f in (29, 30, 31)]
    assert got == [2, 1, 1]


def test_nvlink_throughput_by_link_and_summed(sim) -> None:
    h = handle(2)
    assert field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1).value.ullVal == 2000
    total = sum(1000 * (i + 1) for i in range(12))
    assert field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF).value.ullVal == total
    assert field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX, 0).value.ullVal > 2000
    assert field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 40).nvmlReturn == (
        pynvml.NVML_ERROR_INVALID_ARGUMENT
    )


def test_nvlink_error_totals_link_count_and_per_link(sim) -> None:
    node, _ = sim
    links = [
        NvLinkState(link=i, active=True, tx_kib_total=0, rx_kib_total=0, errors={0: i, 2: 1})
        for i in range(18)
    ]
    node.update(1, nvlinks=tuple(links))
    h = handle(1)
    assert field(h, pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT).value.uiVal == 18
    assert field(h, pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL).value.ullVal == sum(range(18))
    assert field(h, pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL).value.ullVal == 18
    assert field(h, pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6).value.ullVal == 6
    assert field(h, pynvml.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL).value.ullVal == 0


def test_pcie_byte_counters_and_power_fields(sim) -> None:
    node, _ = sim
    node.update(2, pcie_tx_bytes_total=10**12, pcie_rx_bytes_total=5)
    h = handle(2)
    assert field(h, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES).value.ullVal == 10**12
    assert field(h, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES).value.ullVal == 5
    assert field(h, pynvml.NVML_FI_DEV_POWER_AVERAGE).value.uiVal == 212_000
    assert field(h, pynvml.NVML_FI_DEV_POWER_INSTANT).value.uiVal == 212_000


def test_clock_event_reason_counters(sim) -> None:
    node, _ = sim
    node.update(2, clock_event_reason_ns={pynvml.nvmlClocksEventReasonSwPowerCap: 5_000_000_000})
    h = handle(2)
    assert field(h, pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP).value.ullVal == 5_000_000_000
    assert field(h, pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN).value.ullVal == 0


def test_field_values_on_a_mig_device_are_not_supported_per_entry(sim) -> None:
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)
    assert field(mig, pynvml.NVML_FI_DEV_MEMORY_TEMP).nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_unknown_field_id_is_invalid_argument_per_entry(sim) -> None:
    assert field(handle(2), pynvml.NVML_FI_MAX + 5).nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT
