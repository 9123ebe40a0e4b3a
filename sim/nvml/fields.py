"""`nvmlDeviceGetFieldValues`: many readings in one call, each entry with its own nvmlReturn.

The call itself only fails for a bad handle (or a lost GPU); an unsupported field is reported in
that entry's `nvmlReturn`, which is why callers must check every entry.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable

import pynvml

from gpulens.sim.nvml._core import DEV, INT, PTR, Context, NvmlFail, SymbolTable, Target, out_array
from gpulens.sim.state import GpuState, NvLinkState

TABLE = SymbolTable()

UINT_T = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
ULL_T = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
ALL_LINKS = 0xFFFFFFFF  # scopeId meaning "sum over all links"

Reader = Callable[[Target, int], tuple[int, int]]  # (target, scopeId) -> (value type, value)


def _unsupported() -> NvmlFail:
    return NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)


def _ecc(error_type: int, counter_type: int) -> Reader:
    def read(target: Target, scope: int) -> tuple[int, int]:
        if not target.state.ecc_enabled:
            raise _unsupported()
        return ULL_T, target.state.ecc_totals.get((error_type, counter_type), 0)

    return read


def _retired(cause: int | None) -> Reader:
    def read(target: Target, scope: int) -> tuple[int, int]:
        state = target.state
        if state.retired_pages is None:
            raise _unsupported()
        if cause is None:
            return ULL_T, int(bool(state.retired_pages_pending))
        return ULL_T, len(state.retired_pages.get(cause, ()))

    return read


def _remap(position: int) -> Reader:
    def read(target: Target, scope: int) -> tuple[int, int]:
        rows = target.state.remapped_rows
        if rows is None:
            raise _unsupported()
        return UINT_T, int(rows[position])

    return read


def _links(state: GpuState, scope: int) -> list[NvLinkState]:
    if not state.nvlinks:
        raise _unsupported()
    if scope == ALL_LINKS:
        return list(state.nvlinks)
    chosen = [link for link in state.nvlinks if link.link == scope]
    if not chosen:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return chosen


def _nvlink_bytes(direction: str, raw: bool) -> Reader:
    def read(target: Target, scope: int) -> tuple[int, int]:
        kib = sum(getattr(link, f"{direction}_kib_total") for link in _links(target.state, scope))
        return ULL_T, kib + kib // 16 if raw else kib  # raw adds the protocol overhead

    return read


def _nvlink_errors(counter: int, link: int | None) -> Reader:
    def read(target: Target, scope: int) -> tuple[int, int]:
        links = _links(target.state, ALL_LINKS if link is None else link)
        return ULL_T, sum(state.errors.get(counter, 0) for state in links)

    return read


def _state_value(attribute: str, value_type: int) -> Reader:
    def read(target: Target, scope: int) -> tuple[int, int]:
        value = getattr(target.state, attribute)
        if value is None:
            raise _unsupported()
        return value_type, int(value)

    return read


def _clock_reason_ns(bit: int) -> Reader:
    def read(target: Target, scope: int) -> tuple[int, int]:
        if not target.state.supported_clock_event_reasons & bit:
            raise _unsupported()
        return ULL_T, target.state.clock_event_reason_ns.get(bit, 0)

    return read


def _link_count(target: Target, scope: int) -> tuple[int, int]:
    return UINT_T, len(target.state.nvlinks)


def _power_limit(attribute: str) -> Reader:
    def read(target: Target, scope: int) -> tuple[int, int]:
        state = target.state
        model_max = target.identity.model.power_limit_watts * 1000
        values = {
            "current": state.power_limit_mw,
            "default": state.default_power_limit_mw or state.power_limit_mw,
            "max": model_max,
            "min": model_max // 2,
        }
        return UINT_T, values[attribute]

    return read


_N = pynvml
_COUNTER_OF = {
    "CRC_FLIT": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "CRC_DATA": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
    "REPLAY": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "RECOVERY": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "ECC_DATA": pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA,
}


def _build_readers() -> dict[int, Reader]:
    readers: dict[int, Reader] = {
        _N.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: _ecc(_N.NVML_MEMORY_ERROR_TYPE_CORRECTED, _N.NVML_VOLATILE_ECC),
        _N.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: _ecc(_N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _N.NVML_VOLATILE_ECC),
        _N.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: _ecc(_N.NVML_MEMORY_ERROR_TYPE_CORRECTED, _N.NVML_AGGREGATE_ECC),
        _N.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: _ecc(_N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _N.NVML_AGGREGATE_ECC),
        _N.NVML_FI_DEV_RETIRED_SBE: _retired(_N.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        _N.NVML_FI_DEV_RETIRED_DBE: _retired(_N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        _N.NVML_FI_DEV_RETIRED_PENDING: _retired(None),
        _N.NVML_FI_DEV_REMAPPED_COR: _remap(0),
        _N.NVML_FI_DEV_REMAPPED_UNC: _remap(1),
        _N.NVML_FI_DEV_REMAPPED_PENDING: _remap(2),
        _N.NVML_FI_DEV_REMAPPED_FAILURE: _remap(3),
        _N.NVML_FI_DEV_MEMORY_TEMP: _state_value("memory_temperature_c", UINT_T),
        # a simulated GPU that answers needs no recovery: the driver recommends none
        _N.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: lambda target, scope: (
            UINT_T,
            _N.NVML_GPU_RECOVERY_ACTION_NONE,
        ),
        _N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: _state_value("energy_mj", ULL_T),
        _N.NVML_FI_DEV_ENERGY: _state_value("energy_mj", ULL_T),
        _N.NVML_FI_DEV_POWER_AVERAGE: _state_value("power_mw", UINT_T),
        _N.NVML_FI_DEV_POWER_INSTANT: _state_value("power_mw", UINT_T),
        _N.NVML_FI_DEV_POWER_CURRENT_LIMIT: _power_limit("current"),
        _N.NVML_FI_DEV_POWER_DEFAULT_LIMIT: _power_limit("default"),
        _N.NVML_FI_DEV_POWER_MAX_LIMIT: _power_limit("max"),
        _N.NVML_FI_DEV_POWER_MIN_LIMIT: _power_limit("min"),
        _N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: _state_value("pcie_tx_bytes_total", ULL_T),
        _N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: _state_value("pcie_rx_bytes_total", ULL_T),
        _N.NVML_FI_DEV_PCIE_REPLAY_COUNTER: _state_value("pcie_replay_count", ULL_T),
        _N.NVML_FI_DEV_NVLINK_LINK_COUNT: _link_count,
        _N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: _nvlink_bytes("tx", raw=False),
        _N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: _nvlink_bytes("rx", raw=False),
        _N.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: _nvlink_bytes("tx", raw=True),
        _N.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: _nvlink_bytes("rx", raw=True),
        _N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: _clock_reason_ns(_N.nvmlClocksEventReasonSwPowerCap),
        _N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: _clock_reason_ns(_N.nvmlClocksEventReasonSyncBoost),
        _N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: _clock_reason_ns(
            _N.nvmlClocksEventReasonSwThermalSlowdown
        ),
        _N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: _clock_reason_ns(
            _N.nvmlClocksEventReasonHwThermalSlowdown
        ),
        _N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: _clock_reason_ns(
            _N.nvmlClocksEventReasonHwPowerBrakeSlowdown
        ),
    }
    # NVLink error counters, per link (..._L<n>) and summed (..._TOTAL), from pynvml's own names
    pattern = re.compile(
        r"NVML_FI_DEV_NVLINK_(CRC_FLIT|CRC_DATA|REPLAY|RECOVERY|ECC_DATA)_ERROR_COUNT_(L\d+|TOTAL)$"
    )
    for name in dir(pynvml):
        match = pattern.match(name)
        if match:
            kind, where = match.groups()
            link = None if where == "TOTAL" else int(where[1:])
            readers[getattr(pynvml, name)] = _nvlink_errors(_COUNTER_OF[kind], link)
    return readers


READERS = _build_readers()


def read_field(target: Target, field_id: int, scope: int) -> tuple[int, int, int]:
    """(nvmlReturn, value type, value) of one field."""
    if field_id >= pynvml.NVML_FI_MAX or field_id == 0:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT, 0, 0
    reader = READERS.get(field_id)
    if reader is None or target.is_mig:  # device-wide fields only; unlisted ones: this board lacks them
        return pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0
    try:
        value_type, value = reader(target, scope)
    except NvmlFail as fail:
        return fail.code, 0, 0
    return pynvml.NVML_SUCCESS, value_type, value


class _FieldValue(ctypes.Structure):
    """`c_nvmlFieldValue_t`'s layout as a plain ctypes struct (pynvml's `_PrintableStructure`
    intercepts every attribute access; a 100-field request paid for it ~700 times)."""

    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", pynvml.c_nvmlValue_t),  # a plain ctypes Union
    ]


assert ctypes.sizeof(_FieldValue) == ctypes.sizeof(pynvml.c_nvmlFieldValue_t)
assert _FieldValue.value.offset == pynvml.c_nvmlFieldValue_t.value.offset


@TABLE.define("nvmlDeviceGetFieldValues", DEV, INT, PTR)
def field_values(ctx: Context, handle: int, count: int, values_ptr: int) -> None:
    if count <= 0:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    target = ctx.device(handle)
    stamp = int(ctx.now() * 1_000_000)
    for entry in out_array(values_ptr, _FieldValue, count):
        code, value_type, value = read_field(target, entry.fieldId, entry.scopeId)
        entry.timestamp, entry.latencyUsec = stamp, 0
        entry.nvmlReturn, entry.valueType = code, value_type
        union = entry.value
        union.ullVal = 0 if value_type == UINT_T else value & 0xFFFFFFFFFFFFFFFF  # zeroes the union
        if value_type == UINT_T:
            union.uiVal = value & 0xFFFFFFFF
