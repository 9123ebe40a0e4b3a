"""Records exchanged between the exporter's sampler and the attribution engine.

The exporter builds one :class:`ProcessRef` per NVML process entry each sample and hands the list to
:class:`gpulens.exporter.attribution.Attributor`, which returns one :class:`JobUsage` per
(GPU, GPU instance, job).  These records are plain frozen dataclasses so that both sides can be
tested without NVML, procfs or a kubelet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from gpulens.exporter.attribution.mps_control import DEFAULT_COMMAND, DEFAULT_TIMEOUT_S
from gpulens.exporter.attribution.resourceslices import KubeApi


class ProcessKind(StrEnum):
    """Which NVML process list a process came from; the MPS server is a compute process by name.
    Defined here, at the bottom of the exporter's layers, so the snapshot and the attribution
    engine share one vocabulary."""

    COMPUTE = "compute"
    GRAPHICS = "graphics"
    MPS_SERVER = "mps_server"
    MPS_CLIENT = "mps_client"


class SharingMode(StrEnum):
    """How a GPU / GPU instance is shared, derived from what runs on it (the `sharing` label)."""

    EXCLUSIVE = "exclusive"
    MIG = "mig"
    MPS = "mps"
    TIME_SLICING = "time_slicing"


@dataclass(frozen=True)
class ProcessRef:
    """One GPU process as seen by NVML in one sample.

    ``gpu_instance`` / ``mig_uuid`` are set when the process runs on a MIG instance.
    ``used_memory_bytes`` is None when NVML does not report it (e.g. Windows WDDM, some MIG
    configurations without privileges); ``sm_util_ratio`` is None when per-process utilization
    is unsupported.
    """

    pid: int
    gpu: int
    uuid: str
    gpu_instance: int | None
    mig_uuid: str | None
    kind: ProcessKind
    used_memory_bytes: int | None
    sm_util_ratio: float | None


@dataclass(frozen=True)
class JobIdentity:
    """Who owns a process: a job id plus the source that told us (and optional k8s/Slurm details)."""

    job_id: str
    source: str
    user: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""
    # the job's name (Slurm's SLURM_JOB_NAME): what a resubmitted job keeps when its id changes, so
    # the analyzer follows it by (user, name); empty when no source says it
    name: str = ""
    # the owner's numeric uid where a source says it (Slurm cgroup / env, jobstats mapping files);
    # not part of the identity's equality: the same job is the same job whoever reports its uid
    uid: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class JobUsage:
    """Usage of one job on one GPU (or one MIG instance of it) in one sample."""

    gpu: int
    uuid: str
    gpu_instance: int | None
    identity: JobIdentity
    sharing: SharingMode
    memory_used_bytes: int
    sm_utilization_ratio: float | None
    processes: int
    # an MPS client job's active-thread limit: the lower of its processes' own
    # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / 100 and what their control daemon runs their server under
    # (mps_control.py), where either is known; None elsewhere
    mps_thread_ratio: float | None = None
    # the job's duty cycle: the fraction of the interval a kernel of its processes ran (their NVML
    # per-process utilization, summed, at most 1; None without a per-process figure). Under an MPS
    # thread cap, SM share / (duty cycle x cap) says how full of its cap the job ran while it ran
    duty_cycle_ratio: float | None = None


@dataclass(frozen=True)
class DeviceRef:
    """One GPU, or one MIG instance of it, that the attribution engine is asked about."""

    gpu: int
    uuid: str
    gpu_instance: int | None = None
    mig_uuid: str | None = None


#: Where a device's holder was found (DeviceHolder.source).
HOLDER_SOURCES = ("pod_resources", "mapping", "process")


@dataclass(frozen=True)
class DeviceHolder:
    """A job or pod holding a GPU / MIG instance in one sample, and which source said so: the
    kubelet's allocation (`pod_resources`), the device's mapping file (`mapping`), or the job's
    processes running there (`process`). A device allocated to a job that runs nothing yet has a
    holder but no JobUsage."""

    gpu: int
    gpu_instance: int | None
    identity: JobIdentity
    source: str


@dataclass(frozen=True)
class AttributionConfig:
    """Where the attribution engine looks for identity, and which sources are enabled."""

    procfs_root: Path = Path("/proc")
    job_mapping_dir: Path | None = None
    mapping_max_files: int = 10_000  # entries of the mapping directory listed (mapping_dir.py)
    mapping_budget_seconds: float = 0.5  # stats and reads of mapping files per refresh
    pod_resources_socket: Path | None = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    pod_logs_dir: Path = Path("/var/log/pods")
    enable_procfs: bool = True
    enable_mapping: bool = True
    enable_pod_resources: bool = True
    # where DRA devices the kubelet names only by (driver, pool, device) are looked up (the node's
    # ResourceSlices, resourceslices.py); None or no node name: not looked up
    kube_api: KubeApi | None = None
    node_name: str = ""
    # the MPS control client program asked for MPS clients' caps (mps_control.py; needs procfs);
    # empty: not asked. Its runs in one sample share one timeout.
    mps_control: tuple[str, ...] = DEFAULT_COMMAND
    mps_control_timeout_seconds: float = DEFAULT_TIMEOUT_S
    # the node's MPS control daemon's pipe directory as the exporter sees it (`--mps-pipe-dir`),
    # asked for clients whose own view cannot be reached; None: their caps stay unknown
    mps_pipe_dir: str | None = None
