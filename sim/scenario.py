"""What a scenario is: the records a simulated node is made of and the fault kinds that hit it.

A scenario file (`scenariofile.py`) is parsed into this tree of frozen records (documented key by
key in `docs/simulator.md`); the engine (`engine.py`) turns it into driver state and the
timeline (`faults.py`) plays its faults. Nothing here reads files or depends on time.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Literal

from gpulens.catalog import GpuModel, MigProfile
from gpulens.sim.mpscontrol import DEFAULT_PIPE_DIRECTORY
from gpulens.sim.patterns import WorkloadSpec
from gpulens.sim.serving import ServingSpec
from gpulens.sim.state import DriverInfo
from gpulens.sim.topology import Topology

FOREVER = float("inf")
MAX_UID = 2**32 - 2  # Linux uid_t; (uid_t)-1 means "no change" and is never a user
# pids from here up are what restarted processes get (`restarts.py`): a scenario whose processes
# can restart keeps its own pids below
RESTART_PID_BASE = 3 * 2**20
RESTART_PID_SLOT = 4096  # pids per restarting process (reused after that many restarts, as pids wrap)
MAX_RESTARTING = (2**22 - RESTART_PID_BASE) // RESTART_PID_SLOT
THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PINNED_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
MAX_SEED = 2**64 - 1


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; the message is one line naming file, path and problem."""


# ---------------------------------------------------------------------------------------------
# records


@dataclass(frozen=True)
class MigInstanceSpec:
    """A GPU instance (with its full-size compute instance) in a layout."""

    profile: MigProfile
    start: int  # first memory slice
    gpu_instance_id: int
    slot: int  # nvmlDeviceGetMigDeviceHandleByIndex index


@dataclass(frozen=True)
class MpsSpec:
    """An MPS control daemon's server on one GPU."""

    server_pid: int
    restart_pid: int  # the server's pid after an odd number of restarts
    user: str
    uid: int
    memory_bytes: int
    start: float
    # the daemon's active thread percentage for this server (`set_default_active_thread_percentage`,
    # as the Kubernetes device plugin sets 100/replicas): every client's cap, which a client's own
    # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE can only lower. 100 (MPS's default): no cap
    active_thread_percentage: float = 100.0
    # the daemon's default pinned device memory limit for this server's clients, bytes
    # (`set_default_device_pinned_mem_limit`, as the device plugin sets total / replicas): a
    # client's own CUDA_MPS_PINNED_DEVICE_MEM_LIMIT can only lower it. None (MPS's default): no limit
    pinned_memory_limit: int | None = None
    # the daemon's pipe directory, which its clients get as CUDA_MPS_PIPE_DIRECTORY; servers of GPUs
    # with the same one belong to one daemon
    pipe_dir: str = DEFAULT_PIPE_DIRECTORY


@dataclass(frozen=True)
class GpuSpec:
    index: int
    model: GpuModel
    mig: tuple[MigInstanceSpec, ...] | None  # None: MIG disabled
    mps: MpsSpec | None
    power_limit_watts: int
    ecc: bool
    persistence_mode: int
    compute_mode: int
    serial: str | None
    uuid: str
    pci_bus_id: str
    accounting: bool
    ecc_aggregate: tuple[int, int]  # (corrected, uncorrected) before the simulation started
    remapped_rows: tuple[int, int]  # (correctable, uncorrectable) rows before the simulation
    ambient_c: float
    # False: the GPU exposes none of its model's NVLink links (PCIe boards of NVLink models, VMs with
    # GPU passthrough); every NvLink call then answers NOT_SUPPORTED, as on a real H200 in a VM
    nvlink: bool = True


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    user: str
    account: str
    step: str
    task: int
    cgroup: Literal["v1", "v2"]
    # `sbatch --job-name`: what a resubmitted job keeps when its id changes (SLURM_JOB_NAME)
    name: str = ""


@dataclass(frozen=True)
class KubernetesJob:
    namespace: str
    pod: str
    pod_uid: str
    container: str
    container_id: str
    qos: Literal["guaranteed", "burstable", "besteffort"]
    driver: Literal["systemd", "cgroupfs"]
    runtime: Literal["containerd", "cri-o"]
    cgroup: Literal["v1", "v2"]


@dataclass(frozen=True)
class MappingJob:
    """A job known only through the job-mapping directory (LSF, PBS, a custom scheduler)."""

    job_id: str


Job = SlurmJob | KubernetesJob | MappingJob


@dataclass(frozen=True)
class ProcessSpec:
    pid: int
    gpu: int
    instance: int | None  # GPU instance id on a MIG GPU
    kind: Literal["compute", "graphics", "mps_client", "mps_server"]
    name: str
    cmdline: tuple[str, ...]
    user: str
    uid: int
    job: Job | None
    start: float  # seconds relative to the node's start (negative: already running)
    end: float  # FOREVER when it never ends
    workload: WorkloadSpec
    environ: tuple[tuple[str, str], ...] = ()
    # an MPS client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE as a fraction: the most of the GPU's SMs
    # its kernels may keep busy (None: no cap)
    sm_cap: float | None = None
    # device memory the process may hold: an MPS client's pinned limit (the lower of its own
    # CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and its daemon's default) or the `memory_limit` its
    # framework sets, the lower one where both hold; growing past it fails the process (OOM) and
    # its container restarts (`restarts.py`). None: only the device's memory bounds it
    memory_limit_bytes: int | None = None
    # an inference server (vLLM, SGLang) whose own metrics the scrape of its pod records
    # (`serving.py`); its workload's memory is what the server pre-allocates
    serving: ServingSpec | None = None


class FaultKind(StrEnum):
    """The scenario key that names a timeline entry's kind (docs/simulator.md, "faults")."""

    XID = "xid"
    ECC = "ecc"
    ECC_STORM = "ecc_storm"
    ROW_REMAP = "row_remap"
    LOST = "lost"
    THROTTLE = "throttle"
    HANG = "hang"
    INIT_ERROR = "init_error"
    MIG_CREATE = "mig_create"
    MIG_DESTROY = "mig_destroy"
    MPS_RESTART = "mps_restart"
    PCIE_REPLAY = "pcie_replay"
    NVLINK_ERROR = "nvlink_error"
    DIAG_FAIL = "diag_fail"


@dataclass(frozen=True, kw_only=True)
class Fault:
    """One entry of the fault timeline: when, on which GPU (None: the node), for how long.

    Each kind is its own subclass carrying only its own fields; `duration` is how long one
    occurrence lasts (0: an instant, FOREVER: until the end).
    """

    kind: ClassVar[FaultKind]
    at: float
    gpu: int | None = None
    duration: float = 0.0


@dataclass(frozen=True, kw_only=True)
class XidFault(Fault):
    kind = FaultKind.XID
    code: int
    instance: int | None = None  # a GPU instance id on a MIG GPU


@dataclass(frozen=True, kw_only=True)
class EccFault(Fault):
    kind = FaultKind.ECC
    corrected: int = 0
    uncorrected: int = 0
    location: int = 2  # NVML_MEMORY_LOCATION_DRAM


@dataclass(frozen=True, kw_only=True)
class EccStormFault(Fault):
    """`corrected` errors spread evenly over `duration`."""

    kind = FaultKind.ECC_STORM
    corrected: int
    location: int = 2


@dataclass(frozen=True, kw_only=True)
class RowRemapFault(Fault):
    kind = FaultKind.ROW_REMAP
    state: Literal["pending", "failed"]
    rows: int = 1


@dataclass(frozen=True, kw_only=True)
class LostFault(Fault):
    kind = FaultKind.LOST


@dataclass(frozen=True, kw_only=True)
class HangFault(Fault):
    kind = FaultKind.HANG


@dataclass(frozen=True, kw_only=True)
class MpsRestartFault(Fault):
    kind = FaultKind.MPS_RESTART


@dataclass(frozen=True, kw_only=True)
class ThrottleFault(Fault):
    kind = FaultKind.THROTTLE
    reasons: int  # clock event reason bitmask (THROTTLE_BITS)


@dataclass(frozen=True, kw_only=True)
class InitErrorFault(Fault):
    kind = FaultKind.INIT_ERROR
    code: int  # the NVML error nvmlInit returns


@dataclass(frozen=True, kw_only=True)
class MigCreateFault(Fault):
    kind = FaultKind.MIG_CREATE
    mig: MigInstanceSpec  # start/id/slot -1 until the timeline is resolved


@dataclass(frozen=True, kw_only=True)
class MigDestroyFault(Fault):
    kind = FaultKind.MIG_DESTROY
    instance: int


@dataclass(frozen=True, kw_only=True)
class PcieReplayFault(Fault):
    kind = FaultKind.PCIE_REPLAY
    count: int


@dataclass(frozen=True, kw_only=True)
class NvlinkErrorFault(Fault):
    kind = FaultKind.NVLINK_ERROR
    link: int
    counter: int  # NVLINK_COUNTERS value
    count: int = 1


# the tests of `dcgmi diag` (DCGM 4) a diag_fail fault can name, with the lowest level running each
DIAG_TESTS: dict[str, int] = {
    "software": 1,
    "pcie": 2,
    "memory": 2,
    "diagnostic": 3,
    "targeted_stress": 3,
    "targeted_power": 3,
    "memory_bandwidth": 3,
    "memtest": 4,
    "pulse_test": 4,
}


@dataclass(frozen=True, kw_only=True)
class DiagFailFault(Fault):
    """From `at` (for `duration`) the GPU fails DCGM's diagnostic `test` at its level and above;
    NVML shows nothing (the fault only a diagnostic finds)."""

    kind = FaultKind.DIAG_FAIL
    test: str


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    description: str
    seed: int
    hostname: str
    driver: DriverInfo
    gpus: tuple[GpuSpec, ...]
    processes: tuple[ProcessSpec, ...]
    faults: tuple[Fault, ...]
    repeat: float | None  # the fault timeline repeats with this period
    users: tuple[tuple[str, int], ...]
    kubernetes_defaults: tuple[tuple[str, str], ...] = ()
    topology: Topology | None = None  # None: the model family's layout (`topology.default_topology`)


# ---------------------------------------------------------------------------------------------
# constants the file format names

THROTTLE_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clock": 0x100,
}
INIT_ERRORS = {
    "no_permission": 4,
    "driver_not_loaded": 9,
    "library_not_found": 12,
    "lib_rm_version_mismatch": 18,
    "unknown": 999,
}
MEMORY_LOCATIONS = {
    "l1": 0,
    "l2": 1,
    "dram": 2,
    "register_file": 3,
    "texture": 4,
    "texture_shm": 5,
    "cbu": 6,
    "sram": 7,
}
NVLINK_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3, "ecc_data": 4}
COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}
FAULT_KINDS = tuple(FaultKind)


def instance_profiles(gpu: GpuSpec, faults: tuple[Fault, ...] | list[Fault]) -> dict[int, MigProfile]:
    """GPU instance id -> profile for every instance that ever exists on `gpu` (its layout and the
    timeline's mig_create entries); when an id is created with several profiles, the smallest."""
    out = {inst.gpu_instance_id: inst.profile for inst in gpu.mig or ()}
    for fault in faults:
        if isinstance(fault, MigCreateFault) and fault.gpu == gpu.index:
            gid, profile = fault.mig.gpu_instance_id, fault.mig.profile
            if gid not in out or profile.memory_bytes < out[gid].memory_bytes:
                out[gid] = profile
    return out
