"""Reads GPUs through nvidia-ml-py (`pynvml`), one defensive call at a time.

Why so defensive: NVML support differs per board, driver and MIG state, and a single failing call
must cost one series, not the sample. Every call goes through `_Call`, which maps

- NOT_SUPPORTED / FUNCTION_NOT_FOUND / NOT_FOUND / NO_PERMISSION / NO_DATA (and pynvml's
  `NVMLLibraryMismatchError`) to `None`: the value is absent, nothing failed;
- GPU_IS_LOST / GPU_NOT_FOUND / RESET_REQUIRED to `GpuLostError`: the whole GPU is down;
- anything else to `AreaError`: the collector area being read failed on this GPU.

`read_gpu` is called from the sampler's GPU reader thread (`reader.py`); a GPU whose call hung is
not read again until that call returns, so per-GPU state kept here (the last process-utilization
timestamp, GPM samples) is only ever touched by one thread at a time.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from gpulens.exporter.backends.rawcalls import FieldRequest, RawProcess, process_lists
from gpulens.exporter.backends.utilsamples import interval_mean, sample_value
from gpulens.exporter.snapshot import (
    Area,
    ClockEventReason,
    ClocksReading,
    ComputeMode,
    DeviceReading,
    EccError,
    EccScope,
    GpuIdentity,
    GpuSample,
    HealthReading,
    Link,
    MemoryReading,
    MigMode,
    MigReading,
    MigSample,
    NvLinkErrorKind,
    NvLinkSample,
    PcieNvlinkReading,
    PeerLink,
    PowerThermalReading,
    ProcessesReading,
    ProcessKind,
    ProcessSample,
    ProfilingReading,
    ProfilingSource,
    RemappedRowKind,
    RetiredPageCause,
    TemperatureThreshold,
    TopologyReading,
)

MPS_SERVER_NAME = "nvidia-cuda-mps-server"

_ABSENT = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NOT_FOUND,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_NO_DATA,
}
_LOST = {
    pynvml.NVML_ERROR_GPU_IS_LOST,
    pynvml.NVML_ERROR_GPU_NOT_FOUND,
    pynvml.NVML_ERROR_RESET_REQUIRED,
}

# (reason label, nvmlClocksEventReason* bit), DESIGN §4 / docs/metrics.md
CLOCK_EVENT_REASONS: tuple[tuple[ClockEventReason, int], ...] = (
    (ClockEventReason.GPU_IDLE, 0x1),
    (ClockEventReason.APPLICATIONS_CLOCKS_SETTING, 0x2),
    (ClockEventReason.SW_POWER_CAP, 0x4),
    (ClockEventReason.HW_SLOWDOWN, 0x8),
    (ClockEventReason.SYNC_BOOST, 0x10),
    (ClockEventReason.SW_THERMAL_SLOWDOWN, 0x20),
    (ClockEventReason.HW_THERMAL_SLOWDOWN, 0x40),
    (ClockEventReason.HW_POWER_BRAKE_SLOWDOWN, 0x80),
    (ClockEventReason.DISPLAY_CLOCK_SETTING, 0x100),
)
# (kind, nvmlNvLinkErrorCounter_t)
NVLINK_ERROR_KINDS: tuple[tuple[NvLinkErrorKind, int], ...] = (
    (NvLinkErrorKind.REPLAY, 0),
    (NvLinkErrorKind.RECOVERY, 1),
    (NvLinkErrorKind.CRC_FLIT, 2),
    (NvLinkErrorKind.CRC_DATA, 3),
    (NvLinkErrorKind.ECC_DATA, 4),
)
# NVML_FI_DEV_CLOCKS_EVENT_REASON_* fields: cumulative nanoseconds clocks were held down, per reason
CLOCK_EVENT_FIELDS: tuple[tuple[ClockEventReason, int], ...] = (
    (ClockEventReason.SW_POWER_CAP, 74),
    (ClockEventReason.SYNC_BOOST, 76),
    (ClockEventReason.SW_THERMAL_SLOWDOWN, 269),
    (ClockEventReason.HW_THERMAL_SLOWDOWN, 270),
    (ClockEventReason.HW_POWER_BRAKE_SLOWDOWN, 271),
)
TEMPERATURE_THRESHOLDS: tuple[tuple[TemperatureThreshold, int], ...] = (
    (TemperatureThreshold.SLOWDOWN, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
    (TemperatureThreshold.SHUTDOWN, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
)
ECC_COUNTERS: tuple[tuple[EccError, int], ...] = (
    (EccError.CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
    (EccError.UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
)
ECC_SCOPES: tuple[tuple[EccScope, int], ...] = (
    (EccScope.VOLATILE, pynvml.NVML_VOLATILE_ECC),
    (EccScope.AGGREGATE, pynvml.NVML_AGGREGATE_ECC),
)
RETIREMENT_CAUSES: tuple[tuple[RetiredPageCause, int], ...] = (
    (RetiredPageCause.SINGLE_BIT_ECC, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
    (RetiredPageCause.DOUBLE_BIT_ECC, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
)
# per-link NVLink error count fields exist for links 0..11 (NVML_FI_DEV_NVLINK_<KIND>_ERROR_COUNT_L<n>,
# <KIND> the member's name: REPLAY, CRC_FLIT, ...)
NVLINK_ERROR_FIELDS: dict[tuple[NvLinkErrorKind, int], int] = {
    (kind, link): getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind.name}_ERROR_COUNT_L{link}")
    for kind in NvLinkErrorKind
    for link in range(64)
    if hasattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind.name}_ERROR_COUNT_L{link}")
}
# NVML common-ancestor levels (nvmlGpuTopologyLevel_t) -> the `link` a pair without NVLink gets
TOPOLOGY_LEVELS: dict[int, Link] = {
    pynvml.NVML_TOPOLOGY_INTERNAL: Link.BOARD,
    pynvml.NVML_TOPOLOGY_SINGLE: Link.PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_MULTIPLE: Link.PCIE_SWITCHES,
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: Link.PCIE_HOST_BRIDGE,
    pynvml.NVML_TOPOLOGY_NODE: Link.NUMA,
    pynvml.NVML_TOPOLOGY_SYSTEM: Link.SYSTEM,
}
COMPUTE_MODES: dict[int, ComputeMode] = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: ComputeMode.DEFAULT,
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: ComputeMode.EXCLUSIVE_THREAD,
    pynvml.NVML_COMPUTEMODE_PROHIBITED: ComputeMode.PROHIBITED,
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: ComputeMode.EXCLUSIVE_PROCESS,
}

# The fixed field-value requests of a sample (the NVLink ones depend on the GPU's links).
_MEMORY_TEMP_FIELDS = FieldRequest([pynvml.NVML_FI_DEV_MEMORY_TEMP])
_RECOVERY_ACTION_FIELDS = FieldRequest([pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
_CLOCK_EVENT_FIELD_REQUEST = FieldRequest([field for _, field in CLOCK_EVENT_FIELDS])
_PCIE_FIELDS = FieldRequest(
    [
        pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
        pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
    ]
)

# The slow tier: values that change only when an operator or the driver reconfigures the GPU,
# read on every `--nvml.slow-fields-every`th sample and repeated in between (`_GpuState.slow`).
# Fault fields (Xid events, volatile ECC, retired pages, remapped rows, clock event reasons, NVLink
# state and errors, PCIe replays) are never in it. docs/exporter.md lists the same.
SLOW_FIELDS: tuple[str, ...] = (
    "compute_mode",
    "persistence_mode",
    "power_limit",
    "temperature_thresholds",
    "sm_clock_max",
    "graphics_clock_max",  # these two only with `smi` (--compat nvidia_gpu_exporter)
    "memory_clock_max",
    "clock_events_supported",
    "pcie_link_generation",
    "pcie_link_width",
    "ecc_mode",
    "ecc_aggregate_corrected",
    "ecc_aggregate_uncorrected",
)

# Areas whose reads need the process lists.
PROCESS_AREAS = frozenset({Area.DEVICE, Area.MIG, Area.MPS, Area.JOBS, Area.PROCESSES})


class BackendUnavailable(Exception):
    """NVML cannot be initialised (no library, no driver, no permission); the message is one line."""


class GpuLostError(Exception):
    """The GPU answered GPU_IS_LOST (or an equivalent): every value of it is unknown."""


class AreaError(Exception):
    """A read failed for a reason other than "not supported"; the area is marked failed."""


def error_text(exc: BaseException) -> str:
    """One line naming an NVML error without calling into the (maybe missing) library."""
    if isinstance(exc, pynvml.NVMLError):
        return f"{type(exc).__name__} ({exc.value})"
    return f"{type(exc).__name__}: {exc}"


def _vanished(exc: AreaError) -> bool:
    """Whether a MIG-handle read failed because its instance was destroyed mid-sample: NVML then
    answers INVALID_ARGUMENT (or NOT_FOUND) for the stale handle."""
    cause = exc.__cause__
    return isinstance(cause, pynvml.NVMLError) and cause.value in (
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_ERROR_NOT_FOUND,
    )


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Run one NVML call with the error mapping described in the module docstring."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if exc.value in _ABSENT:
            return None
        if exc.value in _LOST:
            raise GpuLostError(error_text(exc)) from exc
        raise AreaError(f"{getattr(fn, '__name__', fn)}: {error_text(exc)}") from exc
    except pynvml.NVMLLibraryMismatchError:
        return None


# what one area's reader returns (`NvmlBackend._read_gpu`'s `run`)
_Reading = TypeVar("_Reading")

# (kind, nvmlNvLinkErrorCounter_t, field request or None where the link has no error field)
_ErrorKeys = tuple[tuple[NvLinkErrorKind, int, tuple[int, int] | None], ...]


@dataclass(frozen=True)
class _NvLinkPlan:
    """What a GPU's NVLink read asks for, built once per set of present links: the one field-value
    request (throughput and per-link error fields) and, per link, the answers to pick from it."""

    links: tuple[int, ...]
    request: FieldRequest
    per_link: tuple[tuple[int, tuple[int, int], tuple[int, int], _ErrorKeys], ...]

    @classmethod
    def of(cls, links: tuple[int, ...]) -> _NvLinkPlan:
        requests: list[tuple[int, int]] = []
        per_link = []
        for link in links:
            tx_key = (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link)
            rx_key = (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link)
            requests += [tx_key, rx_key]
            error_keys = []
            for kind, counter in NVLINK_ERROR_KINDS:
                field_id = NVLINK_ERROR_FIELDS.get((kind, link))
                key = None if field_id is None else (field_id, 0)
                if key is not None:
                    requests.append(key)
                error_keys.append((kind, counter, key))
            per_link.append((link, tx_key, rx_key, tuple(error_keys)))
        return cls(links=links, request=FieldRequest(requests), per_link=tuple(per_link))


@dataclass
class _GpuState:
    """Per-GPU state kept between samples (touched by one reader thread at a time)."""

    handle: Any
    identity: GpuIdentity | None = None
    last_util_timestamp_us: int = 0
    # the newest GPU utilization sample read (GetSamples' lastSeen), 0 before the first
    last_sample_us: int = 0
    mig_handles: dict[int, Any] = field(default_factory=dict)  # GPU instance id -> MIG device handle
    mps_server_pids: dict[int, bool] = field(default_factory=dict)  # pid -> is the MPS server
    process_names: dict[int, str] = field(default_factory=dict)  # pid -> name (`smi` only), while it runs
    # MIG device UUID -> (GPU instance, compute instance, profile, SMs): fixed for the device's life
    mig_static: dict[str, tuple[int, int | None, str, int | None]] = field(default_factory=dict)
    nvlink_plan: _NvLinkPlan | None = None  # rebuilt when the set of present links changes
    # the slow tier's last answers (`SLOW_FIELDS`), by key; refreshed when a read is `slow_due`
    slow: dict[str, Any] = field(default_factory=dict)
    slow_due: bool = True  # this read refreshes the slow tier (set per read by `read_gpu`)
    # NUMA node (read once) and the link to each peer index asked about so far (None: the driver
    # does not support the pair): the topology is fixed while the driver runs; dropped with the
    # state when the GPU is forgotten (lost, reset) or NVML is re-initialised (`_read_topology`)
    numa_node: int | None = None
    numa_read: bool = False
    links: dict[int, Link | None] = field(default_factory=dict)
    # read sequence numbers (`NvmlBackend._seq`): when this GPU's current and previous reads
    # started, and when its last read ended with an answer; `reading` stays True while a call of
    # it hangs
    started: int = 0
    previous_start: int = 0
    answered: int = 0
    reading: bool = False

    def slow_value(self, key: str, read: Callable[[], Any]) -> Any:
        """`read()` on a slow-tier read (or when never read), else its last answer."""
        if self.slow_due or key not in self.slow:
            self.slow[key] = read()
        return self.slow[key]


@dataclass(frozen=True)
class SystemInfo:
    driver_version: str
    cuda_version: str
    nvml_version: str


class NvmlBackend:
    """pynvml, initialised once and re-initialised by the sampler after failures."""

    name = "nvml"

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        procfs_root: Path = Path("/proc"),
        logger: logging.Logger | None = None,
        profiler_factory: Callable[[NvmlBackend], Any] | None = None,
        smi: bool = False,
    ) -> None:
        self.clock = clock
        # also read what only nvidia-smi's view needs (--compat nvidia_gpu_exporter): the graphics
        # and video clocks, their maxima, the recovery action, the fabric state, process names
        self.smi = smi
        self.procfs_root = procfs_root
        self.log = logger or logging.getLogger("gpulens.exporter.nvml")
        self._gpus: dict[int, _GpuState] = {}
        self._seq = 0  # counts read_gpu calls: orders reads across cycles for `_read_topology`
        self._initialised = False
        self._profiler_factory = profiler_factory
        self.profiler: Any = None
        # compute, graphics and MPS process lists, called through ctypes directly (rawcalls says why)
        self.process_lists = process_lists()

    # ---- lifecycle -------------------------------------------------------------------------
    def init(self) -> SystemInfo:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(f"nvmlInit failed: {error_text(exc)}") from exc
        except OSError as exc:  # pragma: no cover - pynvml maps this itself
            raise BackendUnavailable(f"nvmlInit failed: {exc}") from exc
        self._initialised = True
        self._gpus = {}
        if self._profiler_factory is not None:
            self.profiler = self._profiler_factory(self)
        return self.system_info()

    def shutdown(self) -> None:
        if self.profiler is not None:
            self.profiler.close()
            self.profiler = None
        if self._initialised:
            self._initialised = False
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
        self._gpus = {}

    @property
    def initialised(self) -> bool:
        return self._initialised

    def system_info(self) -> SystemInfo:
        driver = self._system(pynvml.nvmlSystemGetDriverVersion) or ""
        nvml_version = self._system(pynvml.nvmlSystemGetNVMLVersion) or ""
        cuda_raw = self._system(pynvml.nvmlSystemGetCudaDriverVersion)
        cuda = f"{cuda_raw // 1000}.{(cuda_raw % 1000) // 10}" if isinstance(cuda_raw, int) else ""
        return SystemInfo(driver_version=str(driver), cuda_version=cuda, nvml_version=str(nvml_version))

    @staticmethod
    def _system(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except pynvml.NVMLError:
            return None

    def device_count(self) -> int:
        """Number of GPUs; raises BackendUnavailable when NVML itself stopped working."""
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(f"nvmlDeviceGetCount failed: {error_text(exc)}") from exc
        for index in list(self._gpus):
            if index >= count:
                del self._gpus[index]
        return count

    def _state(self, index: int) -> _GpuState:
        state = self._gpus.get(index)
        if state is None:
            handle = _call(pynvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                raise AreaError(f"no handle for GPU {index}")
            state = _GpuState(handle=handle)
            self._gpus[index] = state
        return state

    def handles(self) -> list[tuple[int, Any]]:
        """(index, handle) of the GPUs read so far (for event registration)."""
        return [(i, s.handle) for i, s in sorted(self._gpus.items())]

    def identity(self, index: int) -> GpuIdentity | None:
        state = self._gpus.get(index)
        return state.identity if state else None

    def forget(self, index: int) -> None:
        """Drop cached handle/identity so the next read starts fresh (after a lost GPU)."""
        self._gpus.pop(index, None)
        for other in list(self._gpus.values()):
            other.links.pop(index, None)  # asked again once it answers
        if self.profiler is not None:
            self.profiler.forget(index)

    # ---- one GPU ---------------------------------------------------------------------------
    def read_gpu(
        self, index: int, areas: frozenset[Area], interval: float, slow: bool = True
    ) -> tuple[GpuSample, dict[Area, float]]:
        """Read the enabled `areas` of GPU `index`. Returns the sample and seconds spent per area.

        `slow`: read the slow tier too (`SLOW_FIELDS`); otherwise its fields repeat the last
        answers (a GPU never read, or forgotten after a loss, reads them anyway).
        Raises GpuLostError when the GPU is lost; the sampler turns that into `gpu_up 0`.
        """
        state = self._state(index)
        self._seq += 1
        state.previous_start, state.started, state.reading = state.started, self._seq, True
        try:
            sample, timings = self._read_gpu(state, index, areas, interval, slow)
        except BaseException:
            state.reading = False
            raise
        state.reading = False
        self._seq += 1
        state.answered = self._seq
        return sample, timings

    def _read_gpu(
        self, state: _GpuState, index: int, areas: frozenset[Area], interval: float, slow: bool
    ) -> tuple[GpuSample, dict[Area, float]]:
        state.slow_due = slow
        handle = state.handle
        if state.identity is None:
            state.identity = self._read_identity(index, handle)
        timings: dict[Area, float] = {}
        failed: set[Area] = set()
        errors: list[str] = []

        try:
            mig_current = _call(pynvml.nvmlDeviceGetMigMode, handle)
        except AreaError as exc:
            mig_current = None
            failed.add(Area.MIG)
            errors.append(f"mig: {exc}")
        mig_enabled = bool(mig_current and mig_current[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
        mig_mode = None if mig_current is None else (MigMode.ENABLED if mig_enabled else MigMode.DISABLED)

        def run(area: Area, reader: Callable[[], _Reading]) -> _Reading | None:
            """One area's reader, timed; None (and the area failed) when it raised AreaError."""
            start = time.perf_counter()
            try:
                return reader()
            except AreaError as exc:
                failed.add(area)
                errors.append(f"{area}: {exc}")
                return None
            finally:
                timings[area] = timings.get(area, 0.0) + time.perf_counter() - start

        # the areas in a fixed order (the order their NVML calls are made in)
        device = (
            run(Area.DEVICE, lambda: self._read_device(state, interval)) if Area.DEVICE in areas else None
        )
        memory = run(Area.MEMORY, lambda: self._read_memory(handle)) if Area.MEMORY in areas else None
        power_thermal = (
            run(Area.POWER_THERMAL, lambda: self._read_power_thermal(state))
            if Area.POWER_THERMAL in areas
            else None
        )
        clocks = run(Area.CLOCKS, lambda: self._read_clocks(state)) if Area.CLOCKS in areas else None
        pcie_nvlink = (
            run(Area.PCIE_NVLINK, lambda: self._read_pcie_nvlink(state))
            if Area.PCIE_NVLINK in areas
            else None
        )
        health = run(Area.HEALTH, lambda: self._read_health(state)) if Area.HEALTH in areas else None
        topology = (
            run(Area.TOPOLOGY, lambda: self._read_topology(index, state)) if Area.TOPOLOGY in areas else None
        )

        # MIG devices, then their processes and profiling figures: each later read returns the
        # instances again with its part filled in
        mig: MigReading | None = None
        if mig_enabled and areas & (PROCESS_AREAS | {Area.PROFILING}):
            mig = run(Area.MIG, lambda: MigReading(self._read_mig(state)))
        instances = () if mig is None else mig.instances
        processes: ProcessesReading | None = None
        if areas & PROCESS_AREAS:
            area = Area.PROCESSES if Area.PROCESSES in areas else Area.DEVICE
            read = run(area, lambda: self._read_processes(state, instances, mig_enabled, areas, interval))
            if read is not None:
                processes, instances = read
        profiling: ProfilingReading | None = None
        if Area.PROFILING in areas and self.profiler is not None:
            start = time.perf_counter()
            try:
                source, gpu_values, mig_values = self.profiler.read(index, handle, instances)
                profiling = ProfilingReading(source, gpu_values)
                if mig_values:
                    instances = tuple(
                        _with_profiling(m, mig_values.get(m.gpu_instance, ())) for m in instances
                    )
            except AreaError as exc:
                failed.add(Area.PROFILING)
                errors.append(f"profiling: {exc}")
            timings[Area.PROFILING] = time.perf_counter() - start
        elif Area.PROFILING in areas:
            profiling = ProfilingReading(ProfilingSource.NVML)
        if mig is not None and instances is not mig.instances:
            mig = MigReading(instances)

        sample = GpuSample(
            identity=state.identity,
            up=True,
            error="; ".join(errors),
            failed_areas=frozenset(failed),
            mig_mode=mig_mode,
            device=device,
            memory=memory,
            power_thermal=power_thermal,
            clocks=clocks,
            pcie_nvlink=pcie_nvlink,
            health=health,
            mig=mig,
            processes=processes,
            profiling=profiling,
            topology=topology,
        )
        return sample, timings

    def _read_identity(self, index: int, handle: Any) -> GpuIdentity:
        uuid = _call(pynvml.nvmlDeviceGetUUID, handle) or f"GPU-unknown-{index}"
        name = _call(pynvml.nvmlDeviceGetName, handle) or ""
        pci = _call(pynvml.nvmlDeviceGetPciInfo, handle)
        bus_id = pci.busId if pci is not None else ""
        if isinstance(bus_id, bytes):
            bus_id = bus_id.decode()
        serial = _call(pynvml.nvmlDeviceGetSerial, handle) or ""
        try:  # only the compatibility views use it: its failure must not cost the GPU's identity
            minor = _call(pynvml.nvmlDeviceGetMinorNumber, handle)
        except AreaError:
            minor = None
        return GpuIdentity(
            index=index,
            uuid=str(uuid),
            model=str(name),
            pci_bus_id=str(bus_id),
            serial=str(serial),
            minor_number=int(minor) if minor is not None else None,
        )

    def _read_device(self, state: _GpuState, interval: float) -> DeviceReading:
        handle, slow = state.handle, state.slow_value
        util = _call(pynvml.nvmlDeviceGetUtilizationRates, handle)
        last_period = None if util is None else util.gpu / 100.0
        mean = self._utilization_mean(state, interval) if util is not None else None
        performance_state = _call(pynvml.nvmlDeviceGetPerformanceState, handle)
        mode = slow("compute_mode", lambda: _call(pynvml.nvmlDeviceGetComputeMode, handle))
        fan = _call(pynvml.nvmlDeviceGetFanSpeed, handle)
        encoder = _call(pynvml.nvmlDeviceGetEncoderUtilization, handle)
        decoder = _call(pynvml.nvmlDeviceGetDecoderUtilization, handle)
        persistence = slow("persistence_mode", lambda: _call(pynvml.nvmlDeviceGetPersistenceMode, handle))
        return DeviceReading(
            utilization_ratio=last_period if mean is None else mean,
            utilization_last_period_ratio=last_period,
            memory_utilization_ratio=None if util is None else util.memory / 100.0,
            performance_state=performance_state,
            compute_mode=None if mode is None else COMPUTE_MODES.get(int(mode)),
            fan_speed_ratio=None if fan is None else fan / 100.0,
            encoder_utilization_ratio=None if encoder is None else encoder[0] / 100.0,
            decoder_utilization_ratio=None if decoder is None else decoder[0] / 100.0,
            persistence_mode=None if persistence is None else bool(persistence),
        )

    def _utilization_mean(self, state: _GpuState, interval: float) -> float | None:
        """The GPU's utilization over the samples since the last read (`nvmlDeviceGetSamples`),
        on the same window as the processes' figures (`_process_utilization`: the first read looks
        back one interval); None where there is none (NOT_SUPPORTED: MIG, older drivers;
        NOT_FOUND: no sample since): the caller keeps GetUtilizationRates' last period."""
        previous = state.last_sample_us or None
        since = previous or int(self.clock() * 1e6) - int(max(interval, 1.0) * 1e6)
        answer = _call(pynvml.nvmlDeviceGetSamples, state.handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since)
        if answer is None:
            return None
        kind, samples = answer
        points = [(int(s.timeStamp), sample_value(kind, s.sampleValue)) for s in samples]
        kept = sorted((t, v) for t, v in points if t > since and v is not None)
        if not kept:
            return None
        state.last_sample_us = kept[-1][0]
        return interval_mean(kept, previous)

    def _read_memory(self, handle: Any) -> MemoryReading:
        total = used = free = reserved = None
        mem = _call(pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
        if mem is not None:
            total, used, free, reserved = _memory_fields(mem.total, mem.free, mem.reserved)
        else:
            mem1 = _call(pynvml.nvmlDeviceGetMemoryInfo, handle)
            if mem1 is not None:
                total, used, free, reserved = _memory_fields(mem1.total, mem1.free, None)
        bar1 = _call(pynvml.nvmlDeviceGetBAR1MemoryInfo, handle)
        return MemoryReading(
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=free,
            memory_reserved_bytes=reserved,
            bar1_total_bytes=None if bar1 is None else int(bar1.bar1Total),
            bar1_used_bytes=None if bar1 is None else int(bar1.bar1Used),
        )

    def _read_power_thermal(self, state: _GpuState) -> PowerThermalReading:
        handle, slow = state.handle, state.slow_value
        power = _call(pynvml.nvmlDeviceGetPowerUsage, handle)
        limit = slow("power_limit", lambda: _call(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle))
        energy = _call(pynvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        temp = _call(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
        values = _field_values(handle, _MEMORY_TEMP_FIELDS)
        mem_temp = values.get((pynvml.NVML_FI_DEV_MEMORY_TEMP, 0))
        return PowerThermalReading(
            power_watts=None if power is None else power / 1000.0,
            power_limit_watts=None if limit is None else limit / 1000.0,
            energy_joules=None if energy is None else energy / 1000.0,
            temperature_celsius=None if temp is None else float(temp),
            memory_temperature_celsius=None if mem_temp is None else float(mem_temp),
            temperature_thresholds=slow("temperature_thresholds", lambda: _thresholds(handle)),
        )

    def _read_clocks(self, state: _GpuState) -> ClocksReading:
        handle, slow = state.handle, state.slow_value
        sm = _call(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
        mem = _call(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM)
        sm_max = slow(
            "sm_clock_max", lambda: _call(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM)
        )
        smi = _smi_clocks(state) if self.smi else _NO_SMI_CLOCKS
        current = _call(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
        supported = slow(
            "clock_events_supported", lambda: _call(pynvml.nvmlDeviceGetSupportedClocksEventReasons, handle)
        )
        events: tuple[tuple[ClockEventReason, bool], ...] = ()
        if current is not None:
            mask = 0xFFFFFFFFFFFFFFFF if supported is None else int(supported)
            events = tuple(
                (reason, bool(int(current) & bit)) for reason, bit in CLOCK_EVENT_REASONS if mask & bit
            )
        durations = _field_values(handle, _CLOCK_EVENT_FIELD_REQUEST)
        return ClocksReading(
            sm_clock_hertz=None if sm is None else sm * 1e6,
            memory_clock_hertz=None if mem is None else mem * 1e6,
            sm_clock_max_hertz=None if sm_max is None else sm_max * 1e6,
            graphics_clock_hertz=smi[0],
            video_clock_hertz=smi[1],
            graphics_clock_max_hertz=smi[2],
            memory_clock_max_hertz=smi[3],
            clock_events=events,
            clock_event_seconds=tuple(
                (reason, durations[(field, 0)] / 1e9)
                for reason, field in CLOCK_EVENT_FIELDS
                if (field, 0) in durations
            ),
        )

    def _read_pcie_nvlink(self, state: _GpuState) -> PcieNvlinkReading:
        handle, slow = state.handle, state.slow_value
        values = _field_values(handle, _PCIE_FIELDS)
        tx = values.get((pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0))
        rx = values.get((pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0))
        replays = _call(pynvml.nvmlDeviceGetPcieReplayCounter, handle)
        generation = slow(
            "pcie_link_generation", lambda: _call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle)
        )
        width = slow("pcie_link_width", lambda: _call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle))
        link_count = values.get((pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, 0))
        return PcieNvlinkReading(
            pcie_tx_bytes=None if tx is None else int(tx),
            pcie_rx_bytes=None if rx is None else int(rx),
            pcie_replays=replays,
            pcie_link_generation=generation,
            pcie_link_width=width,
            nvlinks=self._read_nvlinks(state, None if link_count is None else int(link_count)),
        )

    def _read_topology(self, index: int, state: _GpuState) -> TopologyReading:
        """NUMA node and one `PeerLink` per other GPU whose link is known.

        A pair is asked about once, from its higher-index GPU's read, and only when the lower-index
        peer answered its own read in this cycle (after this GPU's previous read began): a call
        about a hung or lost GPU may hang too, and must not cost a healthy GPU its deadline. The
        answer serves both GPUs, so a node's topology is whole from its second cycle. A pair the
        driver does not support is left out (no link invented); a failed call is asked again."""
        handle = state.handle
        if not state.numa_read:
            numa = _call(pynvml.nvmlDeviceGetNumaNodeId, handle)
            state.numa_node = int(numa) if numa is not None and int(numa) >= 0 else None  # -1: none
            state.numa_read = True
        for peer in range(index):
            known = self._gpus.get(peer)
            if peer in state.links or known is None or known.reading:
                continue
            if known.answered <= state.previous_start:
                continue  # it has not answered since this GPU was last read: it may be hung
            try:
                link = _peer_link(handle, known.handle)
            except (AreaError, GpuLostError):  # the peer may be the one failing, not this GPU
                continue
            state.links[peer] = known.links[index] = link
        peers = []
        for peer, link in sorted(state.links.items()):
            other = self._gpus.get(peer)
            if link is not None and other is not None and other.identity is not None:
                peers.append(PeerLink(peer=peer, peer_uuid=other.identity.uuid, link=link))
        return TopologyReading(numa_node=state.numa_node, peers=tuple(peers))

    def _read_nvlinks(self, gpu: _GpuState, link_count: int | None) -> tuple[NvLinkSample, ...]:
        handle = gpu.handle
        links: list[int] = []
        limit = pynvml.NVML_NVLINK_MAX_LINKS if link_count is None else min(link_count, 64)
        states: dict[int, bool] = {}
        for link in range(limit):
            try:
                state = pynvml.nvmlDeviceGetNvLinkState(handle, link)
            except pynvml.NVMLError as exc:
                if exc.value in _LOST:
                    raise GpuLostError(error_text(exc)) from exc
                if exc.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                    break  # no NVLink on this board
                continue  # INVALID_ARGUMENT: link not present
            links.append(link)
            states[link] = bool(state)
        if not links:
            return ()
        plan = gpu.nvlink_plan
        if plan is None or plan.links != tuple(links):
            plan = gpu.nvlink_plan = _NvLinkPlan.of(tuple(links))
        values = _field_values(handle, plan.request)  # one call instead of 7 per link
        out: list[NvLinkSample] = []
        for link, tx_key, rx_key, error_keys in plan.per_link:
            errors: list[tuple[NvLinkErrorKind, int]] = []
            for kind, counter, key in error_keys:
                count = values.get(key) if key is not None else None
                if count is None:  # links above 11 have no field; older drivers may lack them
                    count = _call(pynvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
                if count is not None:
                    errors.append((kind, int(count)))
            tx = values.get(tx_key)
            rx = values.get(rx_key)
            out.append(
                NvLinkSample(
                    link=link,
                    up=states[link],
                    tx_bytes=None if tx is None else int(tx) * 1024,
                    rx_bytes=None if rx is None else int(rx) * 1024,
                    errors=tuple(errors),
                )
            )
        return tuple(out)

    def _read_health(self, state: _GpuState) -> HealthReading:
        handle, slow = state.handle, state.slow_value
        ecc_mode = slow("ecc_mode", lambda: _call(pynvml.nvmlDeviceGetEccMode, handle))
        ecc_enabled = None if ecc_mode is None else bool(ecc_mode[0])
        errors: list[tuple[EccError, EccScope, int]] = []
        if ecc_enabled:
            for error, error_type in ECC_COUNTERS:
                for scope, counter in ECC_SCOPES:
                    read = functools.partial(
                        _call, pynvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter
                    )
                    # volatile counts are fault fields (every sample); aggregate ones are slow
                    count = read() if scope is EccScope.VOLATILE else slow(f"ecc_aggregate_{error}", read)
                    if count is not None:
                        errors.append((error, scope, int(count)))
        remapped_rows: tuple[tuple[RemappedRowKind, int], ...] = ()
        row_remap_pending = row_remap_failed = None
        remap = _call(pynvml.nvmlDeviceGetRemappedRows, handle)
        if remap is not None:
            corr, unc, pending, failure = remap
            remapped_rows = (
                (RemappedRowKind.CORRECTABLE, int(corr)),
                (RemappedRowKind.UNCORRECTABLE, int(unc)),
            )
            row_remap_pending, row_remap_failed = bool(pending), bool(failure)
        retired: list[tuple[RetiredPageCause, int]] = []
        for cause, code in RETIREMENT_CAUSES:
            pages = _call(pynvml.nvmlDeviceGetRetiredPages, handle, code)
            if pages is not None:
                retired.append((cause, len(pages)))
        retired_pages_pending = None
        if retired:
            pending_pages = _call(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
            retired_pages_pending = None if pending_pages is None else bool(int(pending_pages))
        recovery_action = fabric_state = None
        if self.smi:
            action = _field_values(handle, _RECOVERY_ACTION_FIELDS).get(
                (pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0)
            )
            recovery_action = None if action is None else int(action)
            fabric = pynvml.c_nvmlGpuFabricInfo_t()
            answered = _call(pynvml.nvmlDeviceGetGpuFabricInfo, handle, ctypes.byref(fabric))
            fabric_state = None if answered is None else int(fabric.state)
        return HealthReading(
            ecc_enabled=ecc_enabled,
            ecc_errors=tuple(errors),
            remapped_rows=remapped_rows,
            row_remap_pending=row_remap_pending,
            row_remap_failed=row_remap_failed,
            retired_pages=tuple(retired),
            retired_pages_pending=retired_pages_pending,
            recovery_action=recovery_action,
            fabric_state=fabric_state,
        )

    # ---- MIG -------------------------------------------------------------------------------
    def _read_mig(self, state: _GpuState) -> tuple[MigSample, ...]:
        handle = state.handle
        handles: dict[int, Any] = {}
        count = _call(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        out: list[MigSample] = []
        known, seen = state.mig_static, {}
        for slot in range(int(count)):
            mig = _call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
            if mig is None:
                continue  # empty slot: NOT_FOUND
            try:
                # A MIG device's UUID names one GPU/compute instance for its lifetime, so what never
                # changes for it is read once: a re-created instance has a new UUID and is read afresh.
                uuid = _call(pynvml.nvmlDeviceGetUUID, mig) or ""
                static = known.get(uuid) if uuid else None
                if static is None:
                    static = self._mig_static(mig)
                    if static is None:
                        continue
                    if uuid:
                        seen[uuid] = static
                else:
                    seen[uuid] = static
                gi, ci, profile, sms = static
                mem = _call(pynvml.nvmlDeviceGetMemoryInfo, mig, pynvml.nvmlMemory_v2)
                total = used = reserved = None
                if mem is not None:
                    total, used, _, reserved = _memory_fields(mem.total, mem.free, mem.reserved)
                out.append(
                    MigSample(
                        gpu_instance=int(gi),
                        compute_instance=int(ci) if ci is not None else 0,
                        profile=profile,
                        uuid=str(uuid),
                        memory_total_bytes=total,
                        memory_used_bytes=used,
                        memory_reserved_bytes=reserved,
                        multiprocessors=sms,
                    )
                )
                handles[int(gi)] = mig
            except AreaError as exc:
                if _vanished(exc):
                    continue  # the instance was destroyed during this sample: it is simply gone
                raise
        state.mig_handles = handles
        state.mig_static = seen  # destroyed instances are forgotten
        return tuple(out)

    @staticmethod
    def _mig_static(mig: Any) -> tuple[int, int | None, str, int | None] | None:
        """(GPU instance id, compute instance id, profile, SM count) of a MIG device; None when
        it has no GPU instance id (a slot being torn down)."""
        gi = _call(pynvml.nvmlDeviceGetGpuInstanceId, mig)
        ci = _call(pynvml.nvmlDeviceGetComputeInstanceId, mig)
        if gi is None:
            return None
        name = _call(pynvml.nvmlDeviceGetName, mig) or ""
        profile = _profile_from_name(str(name))
        attrs = _call(pynvml.nvmlDeviceGetAttributes, mig)
        sms = None if attrs is None else int(attrs.multiprocessorCount)
        if not profile and attrs is not None:
            profile = f"{attrs.gpuInstanceSliceCount}g.{round(attrs.memorySizeMB / 1024)}gb"
        return int(gi), None if ci is None else int(ci), profile, sms

    def mig_handle(self, index: int, gpu_instance: int) -> Any:
        state = self._gpus.get(index)
        return None if state is None else state.mig_handles.get(gpu_instance)

    # ---- processes -------------------------------------------------------------------------
    def _process_lists(
        self, handle: Any, known: dict[int, bool], seen: dict[int, bool]
    ) -> tuple[list[ProcessSample], list[ProcessSample]]:
        """(compute+graphics, mps clients) of one device or MIG handle.

        Whether a compute process is the MPS server is looked up once per pid (`known`, from the
        previous sample) and recorded in `seen`, so steady processes cost no name lookups.
        """
        procs: dict[int, ProcessSample] = {}
        compute, graphics, mps = self.process_lists
        for kind, fn in ((ProcessKind.COMPUTE, compute), (ProcessKind.GRAPHICS, graphics)):
            for p in _call(fn, handle) or ():
                if p[0] in procs:
                    continue
                procs[p[0]] = _process(p, kind)
        clients = [_process(p, ProcessKind.MPS_CLIENT) for p in _call(mps, handle) or ()]
        client_pids = {c.pid for c in clients}
        out: list[ProcessSample] = []
        for p in procs.values():
            if p.pid in client_pids:
                continue
            if p.kind is ProcessKind.COMPUTE:
                is_server = seen.get(p.pid)
                if is_server is None:
                    is_server = known[p.pid] if p.pid in known else self._is_mps_server(p.pid)
                    seen[p.pid] = is_server
                if is_server:
                    p = _replace_kind(p, ProcessKind.MPS_SERVER)
            out.append(p)
        return out, clients

    def _is_mps_server(self, pid: int) -> bool:
        return MPS_SERVER_NAME in self._process_name(pid)

    def _process_name(self, pid: int) -> str:
        """NVML's name of a process (what nvidia-smi shows), else its /proc comm, else ""."""
        name = None
        try:
            name = pynvml.nvmlSystemGetProcessName(pid)
        except (pynvml.NVMLError, UnicodeDecodeError):
            name = None
        if not name:
            try:
                name = (self.procfs_root / str(pid) / "comm").read_text().strip()
            except OSError:
                name = ""
        return str(name)

    def _read_processes(
        self,
        state: _GpuState,
        mig_instances: tuple[MigSample, ...],
        mig_enabled: bool,
        areas: frozenset[Area],
        interval: float,
    ) -> tuple[ProcessesReading, tuple[MigSample, ...]]:
        """The process lists, and the MIG devices again with each one's processes (unchanged
        without MIG)."""
        handle = state.handle
        known = state.mps_server_pids
        seen: dict[int, Any] = {}
        parent_procs, parent_clients = self._process_lists(handle, known, seen)
        procs: dict[int, ProcessSample] = {p.pid: p for p in parent_procs}
        clients: dict[int, ProcessSample] = {p.pid: p for p in parent_clients}
        new_migs: list[MigSample] = []
        if mig_enabled:
            cache = state.mig_handles
            for mig in mig_instances:
                mig_handle = cache.get(mig.gpu_instance)
                mig_procs: list[ProcessSample] = []
                mig_clients: list[ProcessSample] = []
                if mig_handle is not None:
                    try:
                        raw_procs, raw_clients = self._process_lists(mig_handle, known, seen)
                    except AreaError as exc:
                        if not _vanished(exc):
                            raise
                        continue  # destroyed since the instance was listed: gone, not an error
                    mig_procs = [_on_instance(p, mig) for p in raw_procs]
                    mig_clients = [_on_instance(p, mig) for p in raw_clients]
                for p in mig_procs:
                    procs[p.pid] = p
                for p in mig_clients:
                    clients[p.pid] = p
                new_migs.append(_with_processes(mig, tuple(mig_procs), tuple(mig_clients)))
        state.mps_server_pids = seen  # pids that left are forgotten (pid reuse stays correct)
        if not mig_enabled and areas & {Area.JOBS, Area.PROCESSES}:
            utils = self._process_utilization(state, interval)
            if utils is not None:
                procs = {pid: _with_util(p, utils.get(pid, 0.0)) for pid, p in procs.items()}
                clients = {pid: _with_util(p, utils.get(pid, 0.0)) for pid, p in clients.items()}
        if self.smi:  # each pid's name read once while it runs
            names = {
                pid: state.process_names.get(pid) or self._process_name(pid) for pid in (*procs, *clients)
            }
            state.process_names = names
            procs = {pid: _evolve(p, name=names[pid]) for pid, p in procs.items()}
            clients = {pid: _evolve(p, name=names[pid]) for pid, p in clients.items()}
        reading = ProcessesReading(
            processes=tuple(sorted(procs.values(), key=lambda p: p.pid)),
            mps_clients=tuple(sorted(clients.values(), key=lambda p: p.pid)),
        )
        return reading, tuple(new_migs) if mig_enabled else mig_instances

    def _process_utilization(self, state: _GpuState, interval: float) -> dict[int, float] | None:
        """SM utilization per pid over the last interval; None when unsupported."""
        now_us = int(self.clock() * 1e6)
        since = state.last_util_timestamp_us or now_us - int(max(interval, 1.0) * 1e6)
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(state.handle, since)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                state.last_util_timestamp_us = now_us
                return {}
            if exc.value in _LOST:
                raise GpuLostError(error_text(exc)) from exc
            return None
        # NVML keeps one sample per process and driver sampling period; the mean of those since the
        # last read is the process's SM utilization over the exporter's interval.
        sums: dict[int, list[float]] = {}
        newest = since
        for s in samples:
            newest = max(newest, int(s.timeStamp))
            acc = sums.setdefault(int(s.pid), [0.0, 0.0])
            acc[0] += min(100.0, max(0.0, float(s.smUtil)))
            acc[1] += 1
        state.last_util_timestamp_us = newest
        return {pid: total / count / 100.0 for pid, (total, count) in sums.items()}


# ---- helpers -------------------------------------------------------------------------------
def _peer_link(handle: Any, other: Any) -> Link | None:
    """NVLink when P2P over NVLink is OK between the two, else their PCIe common ancestor; None
    when the driver answers neither."""
    status = _call(pynvml.nvmlDeviceGetP2PStatus, handle, other, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
    if status == pynvml.NVML_P2P_STATUS_OK:
        return Link.NVLINK
    level = _call(pynvml.nvmlDeviceGetTopologyCommonAncestor, handle, other)
    return None if level is None else TOPOLOGY_LEVELS.get(int(level))


# (graphics, video, graphics max, memory max) clocks in hertz
_SmiClocks = tuple[float | None, float | None, float | None, float | None]
_NO_SMI_CLOCKS: _SmiClocks = (None, None, None, None)


def _smi_clocks(state: _GpuState) -> _SmiClocks:
    """The clock domains only nvidia-smi's view shows (graphics, video; graphics and memory maxima)."""
    handle, slow = state.handle, state.slow_value

    def mhz(value: Any) -> float | None:
        return None if value is None else float(value) * 1e6

    return (
        mhz(_call(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_GRAPHICS)),
        mhz(_call(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_VIDEO)),
        mhz(
            slow(
                "graphics_clock_max",
                lambda: _call(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_GRAPHICS),
            )
        ),
        mhz(
            slow(
                "memory_clock_max",
                lambda: _call(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM),
            )
        ),
    )


def _thresholds(handle: Any) -> tuple[tuple[TemperatureThreshold, float], ...]:
    thresholds: list[tuple[TemperatureThreshold, float]] = []
    for name, kind in TEMPERATURE_THRESHOLDS:
        celsius = _call(pynvml.nvmlDeviceGetTemperatureThreshold, handle, kind)
        if celsius is not None:
            thresholds.append((name, float(celsius)))
    return tuple(thresholds)


def _memory_fields(total: int, free: int, reserved: int | None) -> tuple[int, int, int, int | None]:
    """(total, used, free, reserved), normalised so that total = used + free + reserved ("used
    excludes reserved").

    Computing used from total/free/reserved does not depend on whether a driver's v2 `used`
    includes the reserved part, which the NVML docs leave ambiguous.
    """
    total, free = int(total), int(free)
    res = int(reserved) if reserved is not None else 0
    return total, max(0, total - free - res), free, None if reserved is None else res


def _field_values(handle: Any, request: FieldRequest) -> dict[tuple[int, int], float | int]:
    """nvmlDeviceGetFieldValues, keeping only entries whose own nvmlReturn is SUCCESS."""
    answers = _call(request, handle)
    if answers is None:
        return {}
    values: dict[tuple[int, int], float | int]
    values, failed = answers
    for key, ret in failed:
        if ret in _LOST:
            raise GpuLostError(f"field {key[0]}: GPU is lost")
    return values


def _profile_from_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3 MIG 1g.10gb' -> '1g.10gb' (works without root)."""
    marker = " MIG "
    return name.split(marker, 1)[1].strip() if marker in name else ""


def _process(p: RawProcess, kind: ProcessKind) -> ProcessSample:
    """A ProcessSample built without the frozen dataclass's __init__ (one `object.__setattr__` per
    field; ~400 records per `large` cycle): the same fields and values, as `_evolve` does."""
    record = object.__new__(ProcessSample)
    record.__dict__.update(
        pid=p[0],
        kind=kind,
        used_memory_bytes=p[1],
        gpu_instance=p[2],
        compute_instance=p[3],
        sm_util_ratio=None,
        name=None,
    )
    return record


_Record = TypeVar("_Record", ProcessSample, MigSample)


def _evolve(record: _Record, **changes: Any) -> _Record:
    """`dataclasses.replace` for the snapshot's frozen records (no slots, no __post_init__) at a
    fraction of its cost: it walks fields() and runs __init__ per copy, ~300 copies per cycle on the
    `large` node. The callers below pass field names only."""
    new = object.__new__(type(record))
    new.__dict__.update(record.__dict__)
    new.__dict__.update(changes)
    return new


def _replace_kind(p: ProcessSample, kind: ProcessKind) -> ProcessSample:
    return _evolve(p, kind=kind)


def _on_instance(p: ProcessSample, mig: MigSample) -> ProcessSample:
    return _evolve(p, gpu_instance=mig.gpu_instance)


def _with_util(p: ProcessSample, ratio: float) -> ProcessSample:
    return _evolve(p, sm_util_ratio=ratio)


def _with_processes(
    mig: MigSample, procs: tuple[ProcessSample, ...], clients: tuple[ProcessSample, ...]
) -> MigSample:
    return _evolve(mig, processes=procs, mps_clients=clients)


def _with_profiling(mig: MigSample, values: tuple[tuple[str, float], ...]) -> MigSample:
    return _evolve(mig, profiling=values)
