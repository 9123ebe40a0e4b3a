"""What the simulated driver reports at one instant.

This is the contract between the scenario engine (`engine.py`, which turns a scenario, a seed and
a clock into these records) and the simulated NVML library (`nvml/`, which serves them through the
NVML C API underneath the real nvidia-ml-py). Both sides only exchange these frozen records, so
either can be tested alone: the library with hand-built states, the engine without ctypes.

Units are NVML's native ones (bytes, mW, mJ, MHz, percent, KB/s) so the library writes them
through unchanged; `None` means "this board does not have it" and becomes NVML_ERROR_NOT_SUPPORTED.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gpulens.catalog import GpuModel, MigProfile
from gpulens.sim.topology import Topology

NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId when MIG is off or not attributable

ProcessKind = Literal["compute", "graphics", "mps_server", "mps_client"]


def _stored_at_once(cls: type) -> None:
    """Give a frozen dataclass an `__init__` that stores all its fields in one dict update.

    The `__init__` dataclasses writes for a frozen class stores each field through
    `object.__setattr__`, about three times slower than this; the engine builds ~500 of these
    records per 100 ms state quantum on `large` (8 GPUs, 56 MIG instances, ~200 processes) in the
    `sim run` launcher, ten times a second. Same signature, defaults and default factories as the
    generated one; the instances are the same frozen, comparable, hashable records.
    """
    params: list[str] = []
    stores: list[str] = []
    namespace: dict[str, Any] = {"_MISSING": object()}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
            stores.append(f"{f.name!r}: {f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_MISSING")
            stores.append(f"{f.name!r}: _factory_{f.name}() if {f.name} is _MISSING else {f.name}")
        else:
            params.append(f.name)
            stores.append(f"{f.name!r}: {f.name}")
    source = f"def __init__(self, {', '.join(params)}):\n    self.__dict__.update({{{', '.join(stores)}}})\n"
    exec(source, namespace)  # as dataclasses itself builds __init__
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[misc]


@dataclass(frozen=True)
class ProcessState:
    """One process with a context on a GPU (or on a MIG instance)."""

    pid: int
    kind: ProcessKind
    used_memory_bytes: int | None  # None -> NVML_VALUE_NOT_AVAILABLE
    sm_util_percent: int = 0  # for process-utilization samples; 0 and 0 -> no sample
    mem_util_percent: int = 0
    gpu_instance_id: int = NO_INSTANCE
    compute_instance_id: int = NO_INSTANCE
    start_time: float = 0.0  # seconds since epoch (simulated clock)
    name: str = "python"


@dataclass(frozen=True)
class ActivityState:
    """Profiling-level activity (what GPM / DCGM PROF fields report), fractions 0..1.

    Rates are bytes per second. The NVML library turns two GPM samples into the average of
    `SimNode.activity_between` over the samples' interval.
    """

    graphics: float = 0.0
    sm: float = 0.0
    sm_occupancy: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    fp64: float = 0.0
    fp32: float = 0.0
    fp16: float = 0.0
    integer: float = 0.0
    pcie_tx_bytes_per_second: float = 0.0
    pcie_rx_bytes_per_second: float = 0.0
    nvlink_tx_bytes_per_second: float = 0.0
    nvlink_rx_bytes_per_second: float = 0.0


@dataclass(frozen=True)
class NvLinkState:
    link: int
    active: bool
    tx_kib_total: int  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (KiB, cumulative)
    rx_kib_total: int
    # NVML_NVLINK_ERROR_DL_{REPLAY=0, RECOVERY=1, CRC_FLIT=2, CRC_DATA=3, ECC_DATA=4} -> count
    errors: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MigInstanceState:
    """One MIG device (a GPU instance with its full-size compute instance)."""

    slot: int  # index for nvmlDeviceGetMigDeviceHandleByIndex
    gpu_instance_id: int
    compute_instance_id: int
    profile: MigProfile
    placement_start: int
    uuid: str  # "MIG-..."
    memory_total_bytes: int
    memory_used_bytes: int
    memory_reserved_bytes: int
    activity: ActivityState
    processes: tuple[ProcessState, ...] = ()
    mps_clients: tuple[ProcessState, ...] = ()


@dataclass(frozen=True)
class GpuIdentity:
    """What does not change while the node runs."""

    index: int
    model: GpuModel
    uuid: str  # "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    serial: str | None  # None -> NOT_SUPPORTED
    pci_bus_id: str  # "00000000:18:00.0"
    minor_number: int
    board_part_number: str = ""
    vbios_version: str = ""


@dataclass(frozen=True)
class GpuState:
    """Everything NVML can report about one physical GPU at one instant."""

    index: int
    lost: bool = False  # every call on this GPU returns NVML_ERROR_GPU_IS_LOST
    hang_seconds: float = 0.0  # a call on this GPU right now blocks this long before answering
    utilization_gpu_percent: int = 0
    utilization_memory_percent: int = 0
    memory_total_bytes: int = 0
    memory_reserved_bytes: int = 0
    memory_used_bytes: int = 0  # v2 semantics: includes reserved
    bar1_total_bytes: int = 256 * 1024**2
    bar1_used_bytes: int = 0
    temperature_c: int = 30
    memory_temperature_c: int | None = 35
    power_mw: int = 0
    power_limit_mw: int = 0
    default_power_limit_mw: int = 0
    energy_mj: int = 0  # cumulative since "driver load"
    graphics_clock_mhz: int = 0
    sm_clock_mhz: int = 0
    memory_clock_mhz: int = 0
    video_clock_mhz: int = 0
    clock_event_reasons: int = 0  # bitmask of nvmlClocksEventReason*
    supported_clock_event_reasons: int = 0x1FF
    # nvmlClocksEventReason* bit -> cumulative ns spent with that reason active (the
    # NVML_FI_DEV_CLOCKS_EVENT_REASON_* field values); missing bits read as 0
    clock_event_reason_ns: dict[int, int] = field(default_factory=dict)
    fan_percent: int | None = None
    performance_state: int = 0
    compute_mode: int = 0  # NVML_COMPUTEMODE_*
    persistence_mode: int = 1
    pcie_tx_kbps: int = 0
    pcie_rx_kbps: int = 0
    pcie_tx_bytes_total: int = 0
    pcie_rx_bytes_total: int = 0
    pcie_replay_count: int = 0
    pcie_link_generation: int = 4
    pcie_link_width: int = 16
    nvlinks: tuple[NvLinkState, ...] = ()
    ecc_enabled: bool | None = True  # None -> ECC not supported
    # (NVML_MEMORY_ERROR_TYPE_*, NVML_*_ECC counter type) -> total
    ecc_totals: dict[tuple[int, int], int] = field(default_factory=dict)
    # (error type, counter type, NVML_MEMORY_LOCATION_*) -> count
    memory_error_counters: dict[tuple[int, int, int], int] = field(default_factory=dict)
    # (correctable rows, uncorrectable rows, pending, failure occurred); None -> NOT_SUPPORTED
    remapped_rows: tuple[int, int, bool, bool] | None = (0, 0, False, False)
    # NVML_PAGE_RETIREMENT_CAUSE_* -> [(address, timestamp_us)]; None -> NOT_SUPPORTED (Ampere+)
    retired_pages: dict[int, tuple[tuple[int, int], ...]] | None = None
    retired_pages_pending: bool | None = None
    mig_mode_current: int | None = None  # None -> MIG not supported
    mig_mode_pending: int | None = None
    mig_instances: tuple[MigInstanceState, ...] = ()
    processes: tuple[ProcessState, ...] = ()  # compute + graphics (the MPS server is a compute one)
    mps_clients: tuple[ProcessState, ...] = ()
    activity: ActivityState = field(default_factory=ActivityState)
    accounting_enabled: bool = False


# called here rather than as decorators: mypy's dataclass checks (arguments, frozen) still see them
_stored_at_once(ProcessState)
_stored_at_once(ActivityState)
_stored_at_once(NvLinkState)
_stored_at_once(MigInstanceState)
_stored_at_once(GpuState)


@dataclass(frozen=True)
class SimEvent:
    """A driver event (Xid and friends) that an NVML event set would deliver."""

    time: float  # simulated seconds since epoch
    gpu_index: int
    event_type: int  # nvmlEventType* bit
    data: int = 0  # Xid number for XidCriticalError
    gpu_instance_id: int = NO_INSTANCE
    compute_instance_id: int = NO_INSTANCE


@dataclass(frozen=True)
class DriverInfo:
    driver_version: str = "550.54.15"
    nvml_version: str = "12.550.54.15"
    cuda_driver_version: int = 12040


class SimClock(Protocol):
    """Simulated wall clock (seconds since epoch) with a speed factor and explicit advance."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None:
        """Block for `seconds` of simulated time (less real time when sped up)."""
        ...


class SimNode(Protocol):
    """The node the simulated library serves; implemented by `engine.ScenarioNode`."""

    driver: DriverInfo
    identities: tuple[GpuIdentity, ...]
    clock: SimClock
    topology: Topology | None  # None: the topology calls answer NOT_SUPPORTED

    def init_error(self) -> int | None:
        """An NVML_ERROR_* code nvmlInit must fail with right now (fault timeline), or None."""
        ...

    def gpu_state(self, index: int) -> GpuState:
        """State of GPU `index` at `clock.now()` (cached per instant; cheap to call often)."""
        ...

    def events_between(self, start: float, end: float) -> list[SimEvent]:
        """Events with start < time <= end, in time order."""
        ...

    def activity_between(
        self, index: int, gpu_instance_id: int | None, start: float, end: float
    ) -> ActivityState:
        """Average activity of a GPU (or one of its GPU instances) over [start, end]."""
        ...

    def utilization_samples(self, index: int, end: float) -> tuple[tuple[float, int], ...]:
        """The GPU utilization samples the driver keeps at `end` (`nvmlDeviceGetSamples`), oldest
        first: (simulated time the sample period ended, percent busy in it)."""
        ...
