"""Immutable records of one sampling cycle.

The sampler fills these from the backend once per `--interval`; collectors only read them. Keeping
them frozen means a render (or a history writer in another thread) can never observe a half-updated
sample, and a scrape needs no lock beyond swapping one reference.

Units are base units (bytes, watts, joules, hertz, celsius, ratios 0..1). `None` means "the device
cannot report this" (NVML NOT_SUPPORTED and friends): collectors leave the series out rather than
inventing a zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

# one vocabulary with the attribution engine, whose input contract it is (re-exported here)
from gpulens.exporter.attribution.model import ProcessKind

if TYPE_CHECKING:
    from gpulens.exporter.attribution.mapping_dir import MappingStats
    from gpulens.exporter.attribution.model import DeviceHolder, JobUsage


class Area(StrEnum):
    """What the sampler reads (or derives) per GPU, named after the collector that renders it.

    One vocabulary for the backend (which reads fail), the sampler (per-area timing and success)
    and the collectors (`readable(snapshot, Area.MEMORY)`). Values are the collector names, so
    `gpulens_collector_success{collector}` and `--collector.<name>` read the same word.
    """

    DEVICE = "device"
    MEMORY = "memory"
    POWER_THERMAL = "power_thermal"
    CLOCKS = "clocks"
    PCIE_NVLINK = "pcie_nvlink"
    HEALTH = "health"
    MIG = "mig"
    MPS = "mps"
    PROCESSES = "processes"
    PROFILING = "profiling"
    XID = "xid"
    JOBS = "jobs"
    TOPOLOGY = "topology"


# Profiling metric keys, shared by the GPM backend and the profiling collector.
PROFILING_KEYS: tuple[str, ...] = (
    "graphics",
    "sm",
    "sm_occupancy",
    "tensor",
    "dram",
    "fp64",
    "fp32",
    "fp16",
)


class MigMode(StrEnum):
    """A MIG-capable GPU's current MIG mode (`nvmlDeviceGetMigMode`); None on a GPU without MIG."""

    ENABLED = "enabled"
    DISABLED = "disabled"


class ComputeMode(StrEnum):
    """NVML's compute modes (`nvmlComputeMode_t`: 0 .. 3, a closed set)."""

    DEFAULT = "default"
    EXCLUSIVE_THREAD = "exclusive_thread"
    PROHIBITED = "prohibited"
    EXCLUSIVE_PROCESS = "exclusive_process"


class ProfilingSource(StrEnum):
    """What fed a GPU's profiling figures (`--profiling`): DCGM, GPM, or neither (`nvml`: only the
    coarse utilization exists)."""

    GPM = "gpm"
    DCGM = "dcgm"
    NVML = "nvml"


class ClockEventReason(StrEnum):
    """The clock event (throttle) reasons NVML reports (`nvmlClocksEventReason*`)."""

    GPU_IDLE = "gpu_idle"
    APPLICATIONS_CLOCKS_SETTING = "applications_clocks_setting"
    SW_POWER_CAP = "sw_power_cap"
    HW_SLOWDOWN = "hw_slowdown"
    SYNC_BOOST = "sync_boost"
    SW_THERMAL_SLOWDOWN = "sw_thermal_slowdown"
    HW_THERMAL_SLOWDOWN = "hw_thermal_slowdown"
    HW_POWER_BRAKE_SLOWDOWN = "hw_power_brake_slowdown"
    DISPLAY_CLOCK_SETTING = "display_clock_setting"


class EccError(StrEnum):
    """An ECC error counter's type (`nvmlMemoryErrorType_t`): single-bit corrected, double-bit not."""

    CORRECTED = "corrected"
    UNCORRECTED = "uncorrected"


class EccScope(StrEnum):
    """An ECC error counter's scope (`nvmlEccCounterType_t`): since driver load, or the GPU's life."""

    VOLATILE = "volatile"
    AGGREGATE = "aggregate"


class RemappedRowKind(StrEnum):
    """The kind of error that made a row be remapped (`nvmlDeviceGetRemappedRows`: corr, unc)."""

    CORRECTABLE = "correctable"
    UNCORRECTABLE = "uncorrectable"


class RetiredPageCause(StrEnum):
    """Why a framebuffer page was retired (`nvmlPageRetirementCause_t`)."""

    SINGLE_BIT_ECC = "single_bit_ecc"  # MULTIPLE_SINGLE_BIT_ECC_ERRORS
    DOUBLE_BIT_ECC = "double_bit_ecc"  # DOUBLE_BIT_ECC_ERROR


class NvLinkErrorKind(StrEnum):
    """An NVLink data-link error counter (`nvmlNvLinkErrorCounter_t`, in its order: 0 .. 4)."""

    REPLAY = "replay"
    RECOVERY = "recovery"
    CRC_FLIT = "crc_flit"
    CRC_DATA = "crc_data"
    ECC_DATA = "ecc_data"


class TemperatureThreshold(StrEnum):
    """The temperature thresholds read (`nvmlTemperatureThresholds_t`: SLOWDOWN, SHUTDOWN)."""

    SLOWDOWN = "slowdown"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class ProcessSample:
    """One process with a context on a GPU or MIG instance (from NVML's process lists)."""

    pid: int
    kind: ProcessKind
    used_memory_bytes: int | None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    sm_util_ratio: float | None = None
    name: str | None = None  # nvmlSystemGetProcessName; read only for --compat nvidia_gpu_exporter


@dataclass(frozen=True)
class NvLinkSample:
    link: int
    up: bool
    tx_bytes: int | None = None
    rx_bytes: int | None = None
    errors: tuple[tuple[NvLinkErrorKind, int], ...] = ()  # (kind, count)


class Link(StrEnum):
    """The fastest path between two GPUs, best first: NVLink, else the PCIe common ancestor
    (NVML `nvmlGpuTopologyLevel_t`: INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM; the
    `nvidia-smi topo -m` names NV#, PIX, PXB, PHB, NODE, SYS)."""

    NVLINK = "nvlink"
    BOARD = "board"  # both GPUs on one board (INTERNAL)
    PCIE_SWITCH = "pcie_switch"  # one PCIe switch between them (SINGLE)
    PCIE_SWITCHES = "pcie_switches"  # several switches, no host bridge (MULTIPLE)
    PCIE_HOST_BRIDGE = "pcie_host_bridge"  # through one host bridge (HOSTBRIDGE)
    NUMA = "numa"  # across host bridges of one NUMA node (NODE)
    SYSTEM = "system"  # across NUMA nodes (the CPUs' SMP interconnect)


@dataclass(frozen=True)
class PeerLink:
    """How this GPU reaches another GPU of the node (read once: it does not change while the
    driver runs)."""

    peer: int  # the peer's index
    peer_uuid: str
    link: Link


@dataclass(frozen=True)
class MigSample:
    """One MIG device (GPU instance + compute instance) of a parent GPU."""

    gpu_instance: int
    compute_instance: int
    profile: str
    uuid: str
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None  # excludes the instance's reserved memory
    memory_reserved_bytes: int | None = None
    multiprocessors: int | None = None
    processes: tuple[ProcessSample, ...] = ()
    mps_clients: tuple[ProcessSample, ...] = ()
    profiling: tuple[tuple[str, float], ...] = ()  # (PROFILING_KEYS item, ratio)


@dataclass(frozen=True)
class GpuIdentity:
    """What does not change while a GPU stays present; kept when the GPU later stops answering."""

    index: int
    uuid: str
    model: str = ""
    pci_bus_id: str = ""
    serial: str = ""
    minor_number: int | None = None  # /dev/nvidia<N>; not always the index (peers key on it)


# One frozen record per backend area (`Area`): what that area's reader returned this cycle. A GPU
# sample holds each as a field that is None when the area was not read (its collector is off) or its
# read failed (then the area is in `failed_areas`); inside a record, None still means "the device
# cannot report this value".


@dataclass(frozen=True)
class DeviceReading:
    """`Area.DEVICE`: whole-GPU utilization and state."""

    # the GPU's utilization over the exporter's interval: the time-weighted mean of the driver's
    # samples since the last read (GetSamples), else its last sample period (GetUtilizationRates)
    utilization_ratio: float | None = None
    # GetUtilizationRates alone: the driver's last sample period (1/6 s to 1 s), None when unread
    utilization_last_period_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    performance_state: int | None = None
    compute_mode: ComputeMode | None = None
    fan_speed_ratio: float | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    persistence_mode: bool | None = None


@dataclass(frozen=True)
class MemoryReading:
    """`Area.MEMORY`: framebuffer (total = used + free + reserved) and BAR1 memory."""

    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None  # excludes reserved
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    bar1_total_bytes: int | None = None
    bar1_used_bytes: int | None = None


@dataclass(frozen=True)
class PowerThermalReading:
    """`Area.POWER_THERMAL`: power, energy and temperatures."""

    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    temperature_thresholds: tuple[tuple[TemperatureThreshold, float], ...] = ()  # (threshold, celsius)


@dataclass(frozen=True)
class ClocksReading:
    """`Area.CLOCKS`: clocks and clock event (throttle) reasons."""

    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    sm_clock_max_hertz: float | None = None
    # nvidia-smi's other clock domains: read only for --compat nvidia_gpu_exporter (NvmlBackend.smi)
    graphics_clock_hertz: float | None = None
    video_clock_hertz: float | None = None
    graphics_clock_max_hertz: float | None = None
    memory_clock_max_hertz: float | None = None
    clock_events: tuple[tuple[ClockEventReason, bool], ...] = ()  # (reason, active), supported reasons
    clock_event_seconds: tuple[tuple[ClockEventReason, float], ...] = ()  # (reason, cumulative seconds)


@dataclass(frozen=True)
class PcieNvlinkReading:
    """`Area.PCIE_NVLINK`: PCIe counters and link, NVLink links."""

    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None
    pcie_replays: int | None = None
    pcie_link_generation: int | None = None
    pcie_link_width: int | None = None
    nvlinks: tuple[NvLinkSample, ...] = ()


@dataclass(frozen=True)
class HealthReading:
    """`Area.HEALTH`: ECC, remapped rows, retired pages."""

    ecc_enabled: bool | None = None
    ecc_errors: tuple[tuple[EccError, EccScope, int], ...] = ()  # (error, scope, count)
    remapped_rows: tuple[tuple[RemappedRowKind, int], ...] = ()  # (kind, rows)
    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    retired_pages: tuple[tuple[RetiredPageCause, int], ...] = ()  # (cause, pages)
    retired_pages_pending: bool | None = None
    # NVML enums nvidia-smi reports (nvmlGpuRecoveryAction_t, nvmlGpuFabricState_t); read only for
    # --compat nvidia_gpu_exporter
    recovery_action: int | None = None
    fabric_state: int | None = None


@dataclass(frozen=True)
class MigReading:
    """`Area.MIG`: the MIG devices of a MIG-enabled GPU, with their processes and profiling figures
    once those areas were read too."""

    instances: tuple[MigSample, ...] = ()


@dataclass(frozen=True)
class ProcessesReading:
    """The process lists (read for `PROCESS_AREAS`, timed and failed as `Area.PROCESSES` when that
    collector is on, else as `Area.DEVICE`)."""

    processes: tuple[ProcessSample, ...] = ()  # compute + graphics (the MPS server is compute)
    mps_clients: tuple[ProcessSample, ...] = ()


@dataclass(frozen=True)
class ProfilingReading:
    """`Area.PROFILING`: which source answered and its whole-GPU ratios (instances hold their own)."""

    source: ProfilingSource
    values: tuple[tuple[str, float], ...] = ()  # (PROFILING_KEYS item or a --compat rate, value)


# What a profiling source (GPM, DCGM) answers for one GPU: its source, the whole-GPU values and
# each MIG GPU instance's values (`ProfilingSource.NVML` and nothing when it does not serve the GPU)
ProfileValues = tuple[tuple[str, float], ...]  # (PROFILING_KEYS item or a --compat rate, value)
ProfilerAnswer = tuple[ProfilingSource, ProfileValues, dict[int, ProfileValues]]


@dataclass(frozen=True)
class TopologyReading:
    """`Area.TOPOLOGY`: read once per driver start or GPU reset, repeated every sample."""

    numa_node: int | None = None
    peers: tuple[PeerLink, ...] = ()


NO_PROCESSES = ProcessesReading()


@dataclass(frozen=True)
class GpuSample:
    """Everything read about one physical GPU in one cycle: one record per area.

    `up` is False when the GPU is lost, its reads failed, or its worker missed the deadline; then
    only identity fields are meaningful and `failed_areas` names the collectors that lost data.
    """

    identity: GpuIdentity
    up: bool
    error: str = ""
    failed_areas: frozenset[Area] = frozenset()
    mig_mode: MigMode | None = None  # read before every area; None: not MIG-capable
    device: DeviceReading | None = None
    memory: MemoryReading | None = None
    power_thermal: PowerThermalReading | None = None
    clocks: ClocksReading | None = None
    pcie_nvlink: PcieNvlinkReading | None = None
    health: HealthReading | None = None
    mig: MigReading | None = None
    processes: ProcessesReading | None = None
    profiling: ProfilingReading | None = None
    topology: TopologyReading | None = None

    @property
    def mig_instances(self) -> tuple[MigSample, ...]:
        """The MIG devices read this cycle; () without MIG or when their read failed."""
        return () if self.mig is None else self.mig.instances

    @property
    def mps_server_active(self) -> bool:
        procs = self.processes or NO_PROCESSES
        return any(p.kind is ProcessKind.MPS_SERVER for p in procs.processes) or any(
            p.kind is ProcessKind.MPS_SERVER for m in self.mig_instances for p in m.processes
        )


@dataclass(frozen=True)
class XidCount:
    """A cumulative Xid count (since the exporter started) for one GPU and code.

    `gpu_instance` is None for the per-GPU total (which includes MIG-attributed events) and set for
    the per-instance counts.
    """

    gpu: int
    uuid: str
    xid: int
    count: int
    last_timestamp: float
    gpu_instance: int | None = None


@dataclass(frozen=True)
class AreaTiming:
    """How long one collector's NVML reads took in a cycle, and whether they all succeeded."""

    seconds: float
    success: bool


@dataclass(frozen=True)
class AttributionHealth:
    """How the attribution engine keeps up (the `gpulens_attribution_*` and `gpulens_job_mapping_*`
    series): samples it missed its deadline in, and the mapping directory as of its last refresh."""

    deadline_misses: int = 0  # since start, counting samples skipped while a late one still ran
    mapping: MappingStats | None = None  # None when no mapping directory is read


@dataclass(frozen=True)
class NodeSnapshot:
    """One complete sampling cycle of the node."""

    timestamp: float  # seconds since epoch (simulated time when simulating)
    duration_seconds: float
    nvml_up: bool
    nvml_error: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    nvml_library_version: str = ""
    gpus: tuple[GpuSample, ...] = ()
    xids: tuple[XidCount, ...] = ()
    jobs: tuple[JobUsage, ...] = ()
    jobs_error: str = ""
    # who holds each device (pod-resources, mapping files, running processes); filled only when a
    # compatibility view needs it (--compat), since the peers label device series with it
    holders: tuple[DeviceHolder, ...] = ()
    areas: dict[str, AreaTiming] = field(default_factory=dict)  # collector name (an Area or not)
    attribution: AttributionHealth | None = None  # None when the jobs collector is off

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)


def sm_figure(sample: GpuSample | MigSample) -> float | None:
    """The device figure per-job SM shares divide: a GPU's SM activity (`gpu_sm_active_ratio`, from
    GPM or DCGM), else its NVML utilization (`gpu_utilization_ratio`); a MIG instance's SM activity
    (`gpu_mig_sm_active_ratio`). None when the device reports neither."""
    if isinstance(sample, MigSample):
        return dict(sample.profiling).get("sm")
    value = None if sample.profiling is None else dict(sample.profiling.values).get("sm")
    if value is None and sample.device is not None:
        value = sample.device.utilization_ratio
    return value
