"""Memory health: ECC mode and counters, retired pages (pre-Ampere), remapped rows (Ampere+)."""

from __future__ import annotations

import ctypes

import pynvml

from gpulens.sim.nvml._core import (
    DEV,
    PTR,
    UINT,
    Context,
    NvmlFail,
    SymbolTable,
    Target,
    fill_array_handshake,
    out_struct,
    out_uint,
    out_ull,
)

TABLE = SymbolTable()

ERROR_TYPES = (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
COUNTER_TYPES = (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC)
CAUSES = (
    pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
)


def _ecc_target(ctx: Context, handle: int) -> Target:
    target = ctx.device(handle)
    if target.state.ecc_enabled is None:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return target


@TABLE.define("nvmlDeviceGetEccMode", DEV, PTR, PTR)
def ecc_mode(ctx: Context, handle: int, current: int, pending: int) -> None:
    enabled = int(bool(_ecc_target(ctx, handle).state.ecc_enabled))
    out_uint(current, enabled)
    out_uint(pending, enabled)


@TABLE.define("nvmlDeviceGetDefaultEccMode", DEV, PTR)
def default_ecc_mode(ctx: Context, handle: int, out: int) -> None:
    target = _ecc_target(ctx, handle)
    out_uint(out, int(target.identity.model.ecc_default))


def _check_types(error_type: int, counter_type: int) -> None:
    if error_type not in ERROR_TYPES or counter_type not in COUNTER_TYPES:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)


@TABLE.define("nvmlDeviceGetTotalEccErrors", DEV, UINT, UINT, PTR)
def total_ecc_errors(ctx: Context, handle: int, error_type: int, counter_type: int, out: int) -> None:
    """Device-wide; NOT_SUPPORTED while ECC is off (no counters are kept then)."""
    target = _ecc_target(ctx, handle)
    target.require_physical()
    _check_types(error_type, counter_type)
    if not target.state.ecc_enabled:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    out_ull(out, target.state.ecc_totals.get((error_type, counter_type), 0))


@TABLE.define("nvmlDeviceGetMemoryErrorCounter", DEV, UINT, UINT, UINT, PTR)
def memory_error_counter(
    ctx: Context, handle: int, error_type: int, counter_type: int, location: int, out: int
) -> None:
    """On a MIG device only the instance-local kind (uncorrected, volatile, not DRAM) is served."""
    target = _ecc_target(ctx, handle)
    _check_types(error_type, counter_type)
    if location > pynvml.NVML_MEMORY_LOCATION_SRAM:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if not target.state.ecc_enabled:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if target.is_mig and (
        error_type != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        or counter_type != pynvml.NVML_VOLATILE_ECC
        or location == pynvml.NVML_MEMORY_LOCATION_DRAM
    ):
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    out_ull(out, target.state.memory_error_counters.get((error_type, counter_type, location), 0))


def _retired(ctx: Context, handle: int, cause: int) -> list[tuple[int, int]]:
    target = ctx.device(handle)
    target.require_physical()
    if target.state.retired_pages is None:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if cause not in CAUSES:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return list(target.state.retired_pages.get(cause, ()))


@TABLE.define("nvmlDeviceGetRetiredPages", DEV, UINT, PTR, PTR)
def retired_pages(ctx: Context, handle: int, cause: int, count_ptr: int, addresses: int) -> None:
    pages = _retired(ctx, handle, cause)

    def write(i: int, page: tuple[int, int]) -> None:
        ctypes.c_ulonglong.from_address(addresses + 8 * i).value = page[0]

    fill_array_handshake(count_ptr, addresses, pages, write)


@TABLE.define("nvmlDeviceGetRetiredPages_v2", DEV, UINT, PTR, PTR, PTR, optional_trailing=1)
def retired_pages_v2(
    ctx: Context, handle: int, cause: int, count_ptr: int, addresses: int, times: int
) -> None:
    pages = _retired(ctx, handle, cause)

    def write(i: int, page: tuple[int, int]) -> None:
        ctypes.c_ulonglong.from_address(addresses + 8 * i).value = page[0]
        if times:
            ctypes.c_ulonglong.from_address(times + 8 * i).value = page[1]

    fill_array_handshake(count_ptr, addresses, pages, write)


@TABLE.define("nvmlDeviceGetRetiredPagesPendingStatus", DEV, PTR)
def retired_pages_pending(ctx: Context, handle: int, out: int) -> None:
    target = ctx.device(handle)
    target.require_physical()
    if target.state.retired_pages is None:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    out_uint(out, int(bool(target.state.retired_pages_pending)))


def _remapped(ctx: Context, handle: int) -> tuple[int, int, bool, bool]:
    """NOT_SUPPORTED on boards without row remapping and, as on the real driver, once MIG
    instances exist on the GPU (even when asked through the parent)."""
    target = ctx.device(handle)
    target.require_physical()
    rows = target.state.remapped_rows
    if rows is None or (target.mig_enabled and target.state.mig_instances):
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return rows


@TABLE.define("nvmlDeviceGetRemappedRows", DEV, PTR, PTR, PTR, PTR)
def remapped_rows(ctx: Context, handle: int, corr: int, unc: int, pending: int, failure: int) -> None:
    rows = _remapped(ctx, handle)
    for ptr, value in zip((corr, unc, pending, failure), rows, strict=True):
        out_uint(ptr, int(value))


@TABLE.define("nvmlDeviceGetRemappedRows_v2", DEV, PTR)
def remapped_rows_v2(ctx: Context, handle: int, out: int) -> None:
    corr, unc, pending, failure = _remapped(ctx, handle)
    info = out_struct(out, pynvml.c_nvmlRemappedRowsInfo_v2_t)
    info.corrActiveRemaps, info.corrInactiveRemaps = corr, 0
    info.uncActiveRemaps, info.uncInactiveRemaps = unc, 0
    info.bPending, info.bfailureOccurred = int(pending), int(failure)
