"""Framebuffer and BAR1 memory, and the utilization counters (which MIG makes unavailable)."""

from __future__ import annotations

import ctypes

import pynvml

from gpulens.sim.nvml._core import (
    DEV,
    PTR,
    UINT,
    ULL,
    Context,
    NvmlFail,
    SymbolTable,
    Target,
    in_struct,
    out_struct,
    out_uint,
)

TABLE = SymbolTable()


def _memory(target: Target) -> tuple[int, int, int]:
    """(total, reserved, used) in bytes; a MIG device reports its own instance's memory."""
    if target.mig:
        m = target.mig
        return m.memory_total_bytes, m.memory_reserved_bytes, m.memory_used_bytes
    s = target.state
    return s.memory_total_bytes, s.memory_reserved_bytes, s.memory_used_bytes


@TABLE.define("nvmlDeviceGetMemoryInfo", DEV, PTR)
def memory_info(ctx: Context, handle: int, out: int) -> None:
    total, _reserved, used = _memory(ctx.device(handle))
    info = out_struct(out, pynvml.c_nvmlMemory_t)
    info.total, info.used, info.free = total, used, max(0, total - used)


@TABLE.define("nvmlDeviceGetMemoryInfo_v2", DEV, PTR)
def memory_info_v2(ctx: Context, handle: int, out: int) -> None:
    if in_struct(out, pynvml.c_nvmlMemory_v2_t).version != pynvml.nvmlMemory_v2:
        raise NvmlFail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    target = ctx.device(handle)
    total, reserved, used = _memory(target)
    info = out_struct(out, pynvml.c_nvmlMemory_v2_t)
    # v1 `used` includes the driver's reserved memory, v2 `used` does not (free is the same in
    # both): a real H200, driver 580. MIG devices keep v1's `used` (no real record of them yet).
    used_v2 = used if target.is_mig else max(0, used - reserved)
    info.total, info.reserved, info.used = total, reserved, used_v2
    info.free = max(0, total - used)


@TABLE.define("nvmlDeviceGetBAR1MemoryInfo", DEV, PTR)
def bar1_memory_info(ctx: Context, handle: int, out: int) -> None:
    state = ctx.device(handle).state
    info = out_struct(out, pynvml.c_nvmlBAR1Memory_t)
    info.bar1Total, info.bar1Used = state.bar1_total_bytes, state.bar1_used_bytes
    info.bar1Free = max(0, state.bar1_total_bytes - state.bar1_used_bytes)


def require_utilization(target: Target) -> None:
    """Utilization counters do not exist on MIG devices, nor on a GPU with MIG mode on."""
    if target.is_mig or target.mig_enabled:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)


@TABLE.define("nvmlDeviceGetUtilizationRates", DEV, PTR)
def utilization_rates(ctx: Context, handle: int, out: int) -> None:
    target = ctx.device(handle)
    require_utilization(target)
    util = out_struct(out, pynvml.c_nvmlUtilization_t)
    util.gpu = target.state.utilization_gpu_percent
    util.memory = target.state.utilization_memory_percent


@TABLE.define("nvmlDeviceGetSamples", DEV, UINT, ULL, PTR, PTR, PTR)
def samples(
    ctx: Context, handle: int, kind: int, last_seen_us: int, type_out: int, count_ptr: int, out: int
) -> None:
    """The driver's GPU utilization samples newer than `last_seen_us` (0: all it keeps), oldest
    first, as `nvmlSample_t` (timeStamp µs, sampleValue.uiVal percent). NULL `samples`: the count
    that can be queried; else at most `*count`, the oldest first, so that the caller's next
    lastSeen (the newest it got) picks up the rest. NOT_FOUND when none is newer; NOT_SUPPORTED on
    MIG and for the sampling types the simulated node does not keep."""
    if not count_ptr or not type_out:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    target = ctx.device(handle)
    require_utilization(target)
    if kind != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    kept = ctx.node.utilization_samples(target.index, ctx.now())
    newer = [(round(t * 1_000_000), pct) for t, pct in kept if round(t * 1_000_000) > last_seen_us]
    if not newer:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)
    out_uint(type_out, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)
    if not out:
        out_uint(count_ptr, len(newer))
        return
    capacity = ctypes.c_uint.from_address(count_ptr).value
    if capacity == 0:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    chosen = newer[:capacity]
    entries = (pynvml.c_nvmlSample_t * len(chosen)).from_address(out)
    for entry, (stamp, pct) in zip(entries, chosen, strict=True):
        entry.timeStamp = stamp
        entry.sampleValue.uiVal = pct
    out_uint(count_ptr, len(chosen))


def _codec(ctx: Context, handle: int, util_out: int, period_out: int) -> None:
    """Encoder/decoder engines: idle on the simulated node (datacenter training and inference)."""
    require_utilization(ctx.device(handle))
    out_uint(util_out, 0)
    out_uint(period_out, 167_000)


TABLE.define("nvmlDeviceGetEncoderUtilization", DEV, PTR, PTR)(_codec)
TABLE.define("nvmlDeviceGetDecoderUtilization", DEV, PTR, PTR)(_codec)
