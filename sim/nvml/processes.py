"""Running processes (compute, graphics, MPS clients), per-process utilization and accounting."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

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
    fill_array_handshake,
    in_struct,
    out_array,
    out_struct,
    out_uint,
)
from gpulens.sim.state import ProcessState

TABLE = SymbolTable()

NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE for unsigned long long
ACCOUNTING_BUFFER_SIZE = 4000  # pids the driver keeps accounting records for


def _compute(procs: tuple[ProcessState, ...]) -> list[ProcessState]:
    return [p for p in procs if p.kind in ("compute", "mps_server")]


def _graphics(procs: tuple[ProcessState, ...]) -> list[ProcessState]:
    return [p for p in procs if p.kind == "graphics"]


def _mps(procs: tuple[ProcessState, ...], clients: tuple[ProcessState, ...]) -> list[ProcessState]:
    return list(clients) + [p for p in procs if p.kind == "mps_client"]


def listed(target: Target, kind: str) -> list[tuple[ProcessState, bool]]:
    """(process, memory known) pairs a list call returns for this handle.

    A MIG device lists its own instance's processes. The parent of a MIG GPU lists every
    instance's processes (as a privileged caller sees them) with usedGpuMemory not available,
    as the real driver does.
    """
    if target.mig:
        sources = [(target.mig.processes, target.mig.mps_clients)]
        memory_known = True
    elif target.mig_enabled:
        sources = [(m.processes, m.mps_clients) for m in target.state.mig_instances]
        memory_known = False
    else:
        sources = [(target.state.processes, target.state.mps_clients)]
        memory_known = True
    out: list[tuple[ProcessState, bool]] = []
    for procs, clients in sources:
        if kind == "compute":
            chosen = _compute(procs)
        elif kind == "graphics":
            chosen = _graphics(procs)
        else:
            chosen = _mps(procs, clients)
        out += [(p, memory_known) for p in chosen]
    return out


def _running_processes(kind: str) -> Callable[[Context, int, int, int], None]:
    def impl(ctx: Context, handle: int, count_ptr: int, infos_ptr: int) -> None:
        target = ctx.device(handle)
        items = listed(target, kind)

        def write(i: int, item: tuple[ProcessState, bool]) -> None:
            proc, memory_known = item
            info = pynvml.c_nvmlProcessInfo_v3_t.from_address(
                infos_ptr + i * ctypes.sizeof(pynvml.c_nvmlProcessInfo_v3_t)
            )
            info.pid = proc.pid
            used = proc.used_memory_bytes
            info.usedGpuMemory = NOT_AVAILABLE if used is None or not memory_known else used
            info.gpuInstanceId = proc.gpu_instance_id
            info.computeInstanceId = proc.compute_instance_id

        fill_array_handshake(count_ptr, infos_ptr, items, write)

    return impl


for _kind, _base in (
    ("compute", "nvmlDeviceGetComputeRunningProcesses"),
    ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
    ("mps", "nvmlDeviceGetMPSComputeRunningProcesses"),
):
    # v2 and v3 share the four-field layout (pid, usedGpuMemory, gpuInstanceId, computeInstanceId)
    TABLE.define(f"{_base}_v3", DEV, PTR, PTR)(_running_processes(_kind))
    TABLE.alias(f"{_base}_v2", f"{_base}_v3")


def _all_processes(target: Target) -> list[ProcessState]:
    seen: dict[int, ProcessState] = {}
    for kind in ("compute", "graphics", "mps"):
        for proc, _ in listed(target, kind):
            seen.setdefault(proc.pid, proc)
    return list(seen.values())


def utilization_samples(ctx: Context, target: Target, last_seen_us: int) -> list[tuple[ProcessState, int]]:
    """(process, sample timestamp µs) for processes busy since `last_seen_us`.

    NOT_SUPPORTED on MIG devices and MIG-enabled GPUs; NOT_FOUND when nothing is newer than the
    caller's timestamp (the normal answer for an idle GPU).
    """
    if target.is_mig or target.mig_enabled:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    stamp = int(ctx.now() * 1_000_000)
    samples = [
        (p, stamp)
        for p in _all_processes(target)
        if (p.sm_util_percent or p.mem_util_percent) and stamp > last_seen_us
    ]
    if not samples:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)
    return samples


@TABLE.define("nvmlDeviceGetProcessUtilization", DEV, PTR, PTR, ULL)
def process_utilization(ctx: Context, handle: int, samples_ptr: int, count_ptr: int, last_seen: int) -> None:
    samples = utilization_samples(ctx, ctx.device(handle), last_seen)
    size = ctypes.sizeof(pynvml.c_nvmlProcessUtilizationSample_t)

    def write(i: int, item: tuple[ProcessState, int]) -> None:
        proc, stamp = item
        sample = pynvml.c_nvmlProcessUtilizationSample_t.from_address(samples_ptr + i * size)
        sample.pid, sample.timeStamp = proc.pid, stamp
        sample.smUtil, sample.memUtil, sample.encUtil, sample.decUtil = (
            proc.sm_util_percent,
            proc.mem_util_percent,
            0,
            0,
        )

    fill_array_handshake(count_ptr, samples_ptr, samples, write)


@TABLE.define("nvmlDeviceGetProcessesUtilizationInfo", DEV, PTR)
def processes_utilization_info(ctx: Context, handle: int, info_ptr: int) -> None:
    info = in_struct(info_ptr, pynvml.c_nvmlProcessesUtilizationInfo_v1_t)
    if info.version != pynvml.ProcessesUtilizationInfo_v1:
        raise NvmlFail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    samples = utilization_samples(ctx, ctx.device(handle), info.lastSeenTimeStamp)
    array = ctypes.cast(info.procUtilArray, ctypes.c_void_p).value
    if not array or info.processSamplesCount < len(samples):
        info.processSamplesCount = len(samples)
        raise NvmlFail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    entries = out_array(array, pynvml.c_nvmlProcessUtilizationInfo_v1_t, len(samples))
    for entry, (proc, stamp) in zip(entries, samples, strict=True):
        entry.timeStamp, entry.pid = stamp, proc.pid
        entry.smUtil, entry.memUtil = proc.sm_util_percent, proc.mem_util_percent
        entry.encUtil = entry.decUtil = entry.jpgUtil = entry.ofaUtil = 0
    info.processSamplesCount = len(samples)


def accounting_target(ctx: Context, handle: int) -> Target:
    target = ctx.device(handle)
    if target.is_mig:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return target


@TABLE.define("nvmlDeviceGetAccountingMode", DEV, PTR)
def accounting_mode(ctx: Context, handle: int, out: int) -> None:
    state = accounting_target(ctx, handle).state
    out_uint(out, pynvml.NVML_FEATURE_ENABLED if state.accounting_enabled else pynvml.NVML_FEATURE_DISABLED)


@TABLE.define("nvmlDeviceGetAccountingBufferSize", DEV, PTR)
def accounting_buffer_size(ctx: Context, handle: int, out: int) -> None:
    accounting_target(ctx, handle)
    out_uint(out, ACCOUNTING_BUFFER_SIZE)


def _accounted(ctx: Context, handle: int) -> list[ProcessState]:
    target = accounting_target(ctx, handle)
    if not target.state.accounting_enabled:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return _all_processes(target)


@TABLE.define("nvmlDeviceGetAccountingPids", DEV, PTR, PTR)
def accounting_pids(ctx: Context, handle: int, count_ptr: int, pids_ptr: int) -> None:
    procs = _accounted(ctx, handle)

    def write(i: int, proc: ProcessState) -> None:
        ctypes.c_uint.from_address(pids_ptr + i * ctypes.sizeof(ctypes.c_uint)).value = proc.pid

    fill_array_handshake(count_ptr, pids_ptr, procs, write)


@TABLE.define("nvmlDeviceGetAccountingStats", DEV, UINT, PTR)
def accounting_stats(ctx: Context, handle: int, pid: int, out: int) -> None:
    proc = next((p for p in _accounted(ctx, handle) if p.pid == pid), None)
    if proc is None:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)
    stats = out_struct(out, pynvml.c_nvmlAccountingStats_t)
    stats.gpuUtilization, stats.memoryUtilization = proc.sm_util_percent, proc.mem_util_percent
    stats.maxMemoryUsage = NOT_AVAILABLE if proc.used_memory_bytes is None else proc.used_memory_bytes
    stats.time = 0  # still running
    stats.startTime = int(proc.start_time * 1_000_000)
    stats.isRunning = 1
