"""Scenario files: what a simulated node contains and what happens to it.

A scenario is YAML (documented key by key in `docs/simulator.md`). Loading is strict: unknown keys,
wrong types, unknown models or profiles, impossible MIG layouts, duplicate pids and dangling
references are all errors, reported as ONE line

    <file>: <dotted.path[index].field>: expected <what>, found <what>

so a typo never silently changes a simulation. The result is a tree of frozen records that the
engine (`engine.py`) turns into driver state; nothing here depends on time.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from gpulens.catalog import CatalogError, GpuModel, MigProfile, get_model, place_mig_layout
from gpulens.safeload import InputError, NestingError, load_yaml_file
from gpulens.sim.patterns import (
    COMMON_KEYS,
    DEFAULT_SM,
    PATTERN_KEYS,
    PATTERNS,
    WorkloadSpec,
    hash_unit,
    splitmix64,
)
from gpulens.sim.serving import NON_KV_BYTES, Server, ServingSpec
from gpulens.sim.state import DriverInfo
from gpulens.sim.topology import Topology, default_topology, parse_topology

BUILTIN_DIR = Path(__file__).resolve().parent / "scenarios"
FOREVER = float("inf")
MAX_UID = 2**32 - 2  # Linux uid_t; (uid_t)-1 means "no change" and is never a user
# pids from here up are what restarted processes get (`restarts.py`): a scenario whose processes
# can restart keeps its own pids below
RESTART_PID_BASE = 3 * 2**20
RESTART_PID_SLOT = 4096  # pids per restarting process (reused after that many restarts, as pids wrap)
MAX_RESTARTING = (2**22 - RESTART_PID_BASE) // RESTART_PID_SLOT
THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PINNED_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
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
    # device memory the process may hold: an MPS client's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT or the
    # `memory_limit` its framework sets; growing past it fails the process (OOM) and its container
    # restarts (`restarts.py`). None: only the device's memory bounds it
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
# PCI bus numbers of the eight GPUs of a DGX H100 / A100 (nvidia-smi on those systems)
_DGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)$")
# one device's entry of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=1G,1=512M"); units are binary, as the
# MPS control daemon prints them and gpulens' apply scripts write them (`<MiB>M`)
_PINNED = re.compile(r"^(\d+)=(\d+)([KMGT]?)B?$")
_PINNED_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_MAX_DURATION = 10 * 365 * 86400.0
_SIZES = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}


# ---------------------------------------------------------------------------------------------
# deterministic identifiers


def _hex(*keys: int | str, digits: int) -> str:
    out = ""
    counter = 0
    base = [k if isinstance(k, int) else zlib.crc32(k.encode()) for k in keys]
    while len(out) < digits:
        h = 0x9E3779B9
        for k in (*base, counter):
            h = splitmix64(h ^ k)
        out += f"{h:016x}"
        counter += 1
    return out[:digits]


def make_uuid(*keys: int | str) -> str:
    """A stable UUID-shaped string from keys (hostname, index, ...)."""
    h = _hex(*keys, digits=32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def make_container_id(namespace: str, pod: str, container: str, restart: int = 0) -> str:
    """A container's stable 64-hex id; each restart of the container gets another."""
    if restart:
        return _hex("ctr", namespace, pod, container, restart, digits=64)
    return _hex("ctr", namespace, pod, container, digits=64)


def gpu_reserved_bytes(model: GpuModel) -> int:
    """Memory the driver keeps for itself on a whole GPU (NVML v2 `reserved`): the catalog's figure
    where a real GPU showed it, else 0.65 % of the framebuffer in whole MiB."""
    if model.memory_reserved_bytes is not None:
        return model.memory_reserved_bytes
    return int(model.memory_bytes * 0.0065) // (1024**2) * 1024**2


def instance_reserved_bytes(profile: MigProfile) -> int:
    """Memory an empty MIG instance already shows as used."""
    return (11 + 2 * profile.placement_size) * 1024**2


def default_uid(user: str) -> int:
    """A stable uid for a user name the scenario did not map (root is 0)."""
    if user == "root":
        return 0
    return 2000 + zlib.crc32(user.encode()) % 60000


def default_gpu_instance_id(model: GpuModel, profile: MigProfile, start: int) -> int:
    """The GPU instance id the driver gives an instance at this placement.

    Follows `nvidia-smi mig -lgi` on 7-slice GPUs: 7g is 0, 3g/4g at start 0 are 1, 3g at 4 is 2,
    2-slice instances at 0/2/4/6 are 3/4/5/6 and 1-slice instances at s are 7+s. A30: 4g is 0, 2g at
    0/2 are 1/2, 1g at s is 3+s.
    """
    size = profile.placement_size
    if model.memory_slices == 4:
        return {4: 0, 2: 1 + start // 2, 1: 3 + start}[size]
    if size == 8:
        return 0
    if size == 4:
        return 1 + start // 4
    if size == 2:
        return 3 + start // 2
    return 7 + start


# ---------------------------------------------------------------------------------------------
# primitive validators


def _found(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


class _Check:
    """Raises one-line ScenarioErrors for one file."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, path: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.file}: {path or '(top level)'}: {message}")

    def expected(self, path: str, what: str, value: Any) -> ScenarioError:
        return self.fail(path, f"expected {what}, found {_found(value)}")

    def mapping(
        self, path: str, value: Any, required: tuple[str, ...], optional: tuple[str, ...]
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.expected(path, "a mapping", value)
        allowed = (*required, *optional)
        for key in value:
            if key not in allowed:
                raise self.fail(
                    _join(path, str(key)), f"expected one of the keys {', '.join(allowed)}, found {key!r}"
                )
        for key in required:
            if key not in value:
                raise self.fail(_join(path, key), "expected this required key, found nothing")
        return value

    def any_mapping(self, path: str, value: Any) -> dict[str, Any]:
        """A mapping with free-form keys (user names, environment variables)."""
        if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
            raise self.expected(path, "a mapping of names", value)
        return value

    def integer(self, path: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.expected(path, _range("an integer", lo, hi), value)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.expected(path, _range("an integer", lo, hi), value)
        return value

    def number(self, path: str, value: Any, lo: float | None = None, hi: float | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.expected(path, _range("a number", lo, hi), value)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.expected(path, _range("a number", lo, hi), value)
        return float(value)

    def fraction(self, path: str, value: Any) -> float:
        if isinstance(value, str) and value.endswith("%"):
            try:
                value = float(value[:-1]) / 100
            except ValueError:
                raise self.expected(path, "a fraction 0..1 or a percentage like '25%'", value) from None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise self.expected(path, "a fraction 0..1 or a percentage like '25%'", value)
        return float(value)

    def string(self, path: str, value: Any, pattern: str | None = None, what: str = "a string") -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value:
            raise self.expected(path, what, value)
        if pattern is not None and not re.fullmatch(pattern, value):
            raise self.expected(path, what, value)
        return value

    def boolean(self, path: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.expected(path, "true or false", value)
        return value

    def choice(self, path: str, value: Any, choices: tuple[str, ...] | list[str]) -> str:
        if not isinstance(value, str) or value not in choices:
            raise self.expected(path, "one of " + ", ".join(choices), value)
        return value

    def duration(self, path: str, value: Any, *, negative: bool = False, forever: bool = False) -> float:
        what = "a duration like 30s, 5m, 2h, 1d (or seconds)"
        if forever:
            what += " or 'forever'"
        if forever and value == "forever":
            return FOREVER
        seconds: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        elif isinstance(value, str):
            match = _DURATION.match(value.strip())
            if match:
                seconds = float(match.group(1)) * _UNITS[match.group(2)]
        if seconds is not None and not (math.isfinite(seconds) and abs(seconds) <= _MAX_DURATION):
            what = "a duration of at most 10 years" + (" or 'forever'" if forever else "")
            raise self.expected(path, what, value)
        if seconds is None or (seconds < 0 and not negative):
            if seconds is not None:
                what = "a duration that is not negative"
            raise self.expected(path, what, value)
        return seconds

    def size(self, path: str, value: Any) -> int:
        what = "a size like 512MiB, 10GiB or a number of bytes"
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if isinstance(value, str):
            match = _SIZE.match(value.strip())
            if match:
                return int(float(match.group(1)) * _SIZES[match.group(2)])
        raise self.expected(path, what, value)

    def list_(self, path: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise self.expected(path, "a list", value)
        return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _range(what: str, lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"{what} from {lo} to {hi}"
    if lo is not None:
        return f"{what} >= {lo}"
    if hi is not None:
        return f"{what} <= {hi}"
    return what


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


# ---------------------------------------------------------------------------------------------
# sections


def _parse_driver(c: _Check, raw: dict[str, Any]) -> tuple[str, DriverInfo]:
    node = c.mapping(
        "node", raw, (), ("hostname", "driver_version", "nvml_version", "cuda_driver_version", "kubernetes")
    )
    hostname = c.string("node.hostname", node.get("hostname", "gpu-node-01"))
    default = DriverInfo()
    driver_version = c.string("node.driver_version", node.get("driver_version", default.driver_version))
    nvml_version = node.get("nvml_version")
    nvml_version = (
        c.string("node.nvml_version", nvml_version)
        if nvml_version is not None
        else (default.nvml_version if "driver_version" not in node else f"12.{driver_version}")
    )
    cuda = c.integer(
        "node.cuda_driver_version", node.get("cuda_driver_version", default.cuda_driver_version), 1000
    )
    return hostname, DriverInfo(
        driver_version=driver_version, nvml_version=nvml_version, cuda_driver_version=cuda
    )


def _mps_memory(c: _Check, path: str, raw: Any) -> int:
    size = c.size(path, raw)
    if size > 4 * 1024**3:
        raise c.expected(path, "at most 4GiB (the server's own context)", raw)
    return size


def _parse_mig(c: _Check, path: str, model: GpuModel, raw: Any) -> tuple[MigInstanceSpec, ...]:
    entries = c.list_(path, raw)
    requests: list[tuple[str, int | None]] = []
    ids: list[int | None] = []
    for i, entry in enumerate(entries):
        p = f"{path}[{i}]"
        if isinstance(entry, str):
            entry = {"profile": entry}
        m = c.mapping(p, entry, ("profile",), ("start", "id"))
        name = c.string(f"{p}.profile", m["profile"])
        try:
            model.mig_profile(name)
        except CatalogError:
            valid = ", ".join(pr.name for pr in model.mig_profiles)
            raise c.expected(f"{p}.profile", f"a MIG profile of {model.key} ({valid})", name) from None
        start = c.integer(f"{p}.start", m["start"], 0, model.memory_slices - 1) if "start" in m else None
        requests.append((name, start))
        ids.append(c.integer(f"{p}.id", m["id"], 0, 14) if "id" in m else None)
    try:
        placed = place_mig_layout(model, requests)
    except CatalogError as e:
        raise c.fail(path, f"expected a MIG layout that fits, found: {e}") from None
    out: list[MigInstanceSpec] = []
    seen: dict[int, int] = {}
    for i, (placement, gi) in enumerate(zip(placed, ids, strict=True)):
        gid = gi if gi is not None else default_gpu_instance_id(model, placement.profile, placement.start)
        if gid in seen:
            raise c.expected(f"{path}[{i}].id", f"a GPU instance id not used by {path}[{seen[gid]}]", gid)
        seen[gid] = i
        out.append(MigInstanceSpec(placement.profile, placement.start, gid, i))
    return tuple(out)


def _parse_gpus(c: _Check, raw: Any, hostname: str, users: dict[str, int]) -> tuple[GpuSpec, ...]:
    entries = c.list_("gpus", raw)
    if not entries:
        raise c.expected("gpus", "at least one GPU", raw)
    gpus: list[GpuSpec] = []
    for i, entry in enumerate(entries):
        p = f"gpus[{i}]"
        m = c.mapping(p, entry, ("model",), ("count", "mig", "mps", "nvlink", "overrides"))
        try:
            model = get_model(c.string(f"{p}.model", m["model"]))
        except CatalogError as e:
            raise c.fail(f"{p}.model", f"expected a catalog model, found {m['model']!r} ({e})") from None
        count = c.integer(f"{p}.count", m.get("count", 1), 1, 64)
        nvlink = c.boolean(f"{p}.nvlink", m.get("nvlink", True))
        mig = None
        if "mig" in m:
            if not model.mig_capable:
                raise c.expected(f"{p}.mig", f"no MIG layout ({model.key} has no MIG)", m["mig"])
            mig = _parse_mig(c, f"{p}.mig", model, m["mig"])
        mps = None
        if m.get("mps") is not None:
            if mig is not None:
                raise c.expected(f"{p}.mps", "no MPS server on a GPU in MIG mode", m["mps"])
            if count != 1:
                raise c.expected(f"{p}.count", "1 on an entry with an MPS server (pids are per GPU)", count)
            mm = c.mapping(f"{p}.mps", m["mps"], ("server_pid",), ("restart_pid", "user", "memory", "start"))
            server_pid = c.integer(f"{p}.mps.server_pid", mm["server_pid"], 2, 4194304)
            restart_pid = c.integer(f"{p}.mps.restart_pid", mm.get("restart_pid", server_pid + 1), 2, 4194304)
            if restart_pid == server_pid:
                raise c.expected(f"{p}.mps.restart_pid", "a pid other than server_pid", restart_pid)
            user = c.string(f"{p}.mps.user", mm.get("user", "root"))
            mps = MpsSpec(
                server_pid,
                restart_pid,
                user,
                users.get(user, default_uid(user)),
                _mps_memory(c, f"{p}.mps.memory", mm.get("memory", "32MiB")),
                c.duration(f"{p}.mps.start", mm.get("start", "-1h"), negative=True),
            )
        ov = c.mapping(
            f"{p}.overrides",
            m.get("overrides", {}),
            (),
            (
                "power_limit_watts",
                "ecc",
                "persistence_mode",
                "compute_mode",
                "serial",
                "uuid",
                "pci_bus_id",
                "accounting",
                "ecc_aggregate",
                "remapped_rows",
                "ambient_c",
            ),
        )
        for key in ("uuid", "pci_bus_id", "serial"):
            if key in ov and ov[key] is not None and count != 1:
                raise c.expected(f"{p}.count", f"1 on an entry that overrides {key}", count)
        power = c.integer(
            f"{p}.overrides.power_limit_watts",
            ov.get("power_limit_watts", model.power_limit_watts),
            model.idle_power_watts + 1,
            model.power_limit_watts,
        )
        mode_name = ov.get("compute_mode", "exclusive_process" if mps else "default")
        compute_mode = COMPUTE_MODES[c.choice(f"{p}.overrides.compute_mode", mode_name, list(COMPUTE_MODES))]
        if mps is not None and compute_mode != 3:
            raise c.expected(f"{p}.overrides.compute_mode", "exclusive_process on an MPS GPU", mode_name)
        agg = c.mapping(
            f"{p}.overrides.ecc_aggregate", ov.get("ecc_aggregate", {}), (), ("corrected", "uncorrected")
        )
        rows = c.mapping(
            f"{p}.overrides.remapped_rows", ov.get("remapped_rows", {}), (), ("correctable", "uncorrectable")
        )
        if len(gpus) + count > 64:
            raise c.expected(f"{p}.count", "at most 64 GPUs on the node", count)
        for _ in range(count):
            index = len(gpus)
            bus = _DGX_BUSES[index] if index < len(_DGX_BUSES) else 0x100 - len(gpus) * 4
            serial: str | None = str(
                1650000000000 + int(hash_unit(zlib.crc32(hostname.encode()), index) * 1e9)
            )
            if "serial" in ov:
                serial = None if ov["serial"] is None else c.string(f"{p}.overrides.serial", ov["serial"])
            uuid = "GPU-" + make_uuid(hostname, index)
            if ov.get("uuid") is not None:
                uuid = c.string(
                    f"{p}.overrides.uuid",
                    ov["uuid"],
                    r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                    "a UUID like GPU-0fd3b7c2-1b7e-4a84-9f1e-2c1a5d6e7f80",
                )
            bus_id = f"00000000:{bus:02X}:00.0"
            if ov.get("pci_bus_id") is not None:
                bus_id = c.string(
                    f"{p}.overrides.pci_bus_id",
                    ov["pci_bus_id"],
                    r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]",
                    "a bus id like 00000000:18:00.0",
                )
            gpus.append(
                GpuSpec(
                    index=index,
                    model=model,
                    mig=mig,
                    mps=mps,
                    power_limit_watts=power,
                    ecc=c.boolean(f"{p}.overrides.ecc", ov.get("ecc", model.ecc_default)),
                    persistence_mode=c.integer(
                        f"{p}.overrides.persistence_mode", ov.get("persistence_mode", 1), 0, 1
                    ),
                    compute_mode=compute_mode,
                    serial=serial,
                    uuid=uuid,
                    pci_bus_id=bus_id,
                    accounting=c.boolean(f"{p}.overrides.accounting", ov.get("accounting", False)),
                    ecc_aggregate=(
                        c.integer(f"{p}.overrides.ecc_aggregate.corrected", agg.get("corrected", 0), 0),
                        c.integer(f"{p}.overrides.ecc_aggregate.uncorrected", agg.get("uncorrected", 0), 0),
                    ),
                    remapped_rows=(
                        c.integer(f"{p}.overrides.remapped_rows.correctable", rows.get("correctable", 0), 0),
                        c.integer(
                            f"{p}.overrides.remapped_rows.uncorrectable", rows.get("uncorrectable", 0), 0
                        ),
                    ),
                    ambient_c=c.number(f"{p}.overrides.ambient_c", ov.get("ambient_c", 28), 0, 60),
                    nvlink=nvlink,
                )
            )
    return tuple(gpus)


# a job name as people give `sbatch --job-name` in scripts: no blanks or quotes, which a label value
# and a shell line would have to escape; at most the exporter's label length
SLURM_JOB_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.+:@=-]{0,127}"
SLURM_JOB_NAME_WHAT = "a Slurm job name: 1-128 letters, digits or _.+:@=- (not starting with one of .+:@=-)"


def _parse_job(c: _Check, path: str, raw: Any, k8s_defaults: dict[str, str]) -> Job:
    m = c.mapping(path, raw, (), ("slurm", "kubernetes", "mapping"))
    if len(m) != 1:
        found = " and ".join(m) or "none"
        raise c.fail(path, f"expected exactly one of slurm, kubernetes, mapping, found {found}")
    if "slurm" in m:
        p = f"{path}.slurm"
        s = c.mapping(p, m["slurm"], ("id",), ("user", "account", "step", "task", "cgroup", "name"))
        return SlurmJob(
            job_id=c.string(f"{p}.id", s["id"], r"\d+(_\d+)?", "a Slurm job id like 4711 or 4711_3"),
            user=c.string(f"{p}.user", s.get("user", "root")),
            account=c.string(f"{p}.account", s.get("account", "default")),
            step=c.string(f"{p}.step", s.get("step", 0), r"\d+|batch|extern|interactive", "a step id"),
            task=c.integer(f"{p}.task", s.get("task", 0), 0),
            cgroup=c.choice(f"{p}.cgroup", s.get("cgroup", "v2"), ("v1", "v2")),  # type: ignore[arg-type]
            name=c.string(f"{p}.name", s["name"], SLURM_JOB_NAME, SLURM_JOB_NAME_WHAT) if "name" in s else "",
        )
    if "kubernetes" in m:
        p = f"{path}.kubernetes"
        k = c.mapping(
            p,
            m["kubernetes"],
            ("namespace", "pod"),
            ("uid", "container", "container_id", "qos", "driver", "runtime", "cgroup"),
        )
        ns = c.string(f"{p}.namespace", k["namespace"], r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", "a namespace name")
        pod = c.string(f"{p}.pod", k["pod"], r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?", "a pod name")
        container = c.string(f"{p}.container", k.get("container", "main"))
        pod_uid = c.string(
            f"{p}.uid",
            k.get("uid", make_uuid("pod", ns, pod)),
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "a pod UID like 3f1c2a9e-5b7d-4e21-9a0c-1d2e3f405162",
        )
        cid = c.string(
            f"{p}.container_id",
            k.get("container_id", make_container_id(ns, pod, container)),
            r"[0-9a-f]{64}",
            "a 64-hex-digit container id",
        )
        return KubernetesJob(
            namespace=ns,
            pod=pod,
            pod_uid=pod_uid,
            container=container,
            container_id=cid,
            qos=c.choice(f"{p}.qos", k.get("qos", "burstable"), ("guaranteed", "burstable", "besteffort")),  # type: ignore[arg-type]
            driver=c.choice(
                f"{p}.driver", k.get("driver", k8s_defaults.get("driver", "systemd")), ("systemd", "cgroupfs")
            ),  # type: ignore[arg-type]
            runtime=c.choice(
                f"{p}.runtime",
                k.get("runtime", k8s_defaults.get("runtime", "containerd")),
                ("containerd", "cri-o"),
            ),  # type: ignore[arg-type]
            cgroup=c.choice(f"{p}.cgroup", k.get("cgroup", k8s_defaults.get("cgroup", "v2")), ("v1", "v2")),  # type: ignore[arg-type]
        )
    p = f"{path}.mapping"
    mm = c.mapping(p, m["mapping"], ("id",), ())
    return MappingJob(job_id=c.string(f"{p}.id", mm["id"], r"[A-Za-z0-9_.\-]+", "a job id"))


def parse_workload(c: _Check, path: str, raw: Any, limit_bytes: int, limit_what: str) -> WorkloadSpec:
    if not isinstance(raw, dict):
        raise c.expected(path, "a mapping", raw)
    pattern = c.choice(f"{path}.pattern", raw.get("pattern"), PATTERNS)
    m = c.mapping(
        path,
        raw,
        ("pattern", "memory"),
        tuple(k for k in (*COMMON_KEYS, *PATTERN_KEYS[pattern]) if k not in ("pattern", "memory")),
    )
    memory = c.size(f"{path}.memory", m["memory"])
    if memory > limit_bytes:
        raise c.expected(f"{path}.memory", f"at most {_gib(limit_bytes)} ({limit_what})", m["memory"])
    sm = c.fraction(f"{path}.sm", m.get("sm", DEFAULT_SM[pattern]))
    kwargs: dict[str, Any] = {"pattern": pattern, "memory_bytes": memory, "sm": sm}
    for key in ("tensor", "occupancy"):
        if key in m:
            value = c.fraction(f"{path}.{key}", m[key])
            if value > sm:
                raise c.expected(f"{path}.{key}", f"at most sm ({sm})", m[key])
            kwargs[key] = value
    if "dram" in m:
        kwargs["dram"] = c.fraction(f"{path}.dram", m["dram"])
    if "pcie_gbps" in m:
        kwargs["pcie_gbps"] = c.number(f"{path}.pcie_gbps", m["pcie_gbps"], 0, 128)
    if "nvlink_gbps" in m:
        kwargs["nvlink_gbps"] = c.number(f"{path}.nvlink_gbps", m["nvlink_gbps"], 0, 1800)
    if "busy" in m:
        busy = c.fraction(f"{path}.busy", m["busy"])
        if busy < sm:
            raise c.expected(
                f"{path}.busy", f"at least sm ({sm}): a kernel runs whenever SMs are active", m["busy"]
            )
        kwargs["busy"] = busy
    if "duty" in m:
        duty = c.fraction(f"{path}.duty", m["duty"])
        if duty < sm or duty == 0:
            raise c.expected(f"{path}.duty", f"at least sm ({sm}) and above 0", m["duty"])
        kwargs["duty"] = duty
    for key, field in (
        ("step", "step_seconds"),
        ("period", "period_seconds"),
        ("slot", "slot_seconds"),
        ("over", "over_seconds"),
    ):
        if key in m:
            value = c.duration(f"{path}.{key}", m[key])
            if value <= 0:
                raise c.expected(f"{path}.{key}", "a duration above 0", m[key])
            kwargs[field] = value
    if "warmup" in m:
        kwargs["warmup_seconds"] = c.duration(f"{path}.warmup", m["warmup"])
    if "rate" in m:
        kwargs["rate"] = c.fraction(f"{path}.rate", m["rate"])
    if "active" in m:
        kwargs["active"] = c.fraction(f"{path}.active", m["active"])
    if "memory_start" in m:
        start = c.size(f"{path}.memory_start", m["memory_start"])
        if start > memory:
            raise c.expected(f"{path}.memory_start", "at most memory", m["memory_start"])
        kwargs["memory_start_bytes"] = start
    if "repeat" in m:
        kwargs["repeat"] = c.boolean(f"{path}.repeat", m["repeat"])
    return WorkloadSpec(**kwargs)


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


def parse_process(
    c: _Check,
    path: str,
    raw: Any,
    gpus: tuple[GpuSpec, ...],
    users: dict[str, int],
    k8s_defaults: dict[str, str],
    instances: dict[int, dict[int, MigProfile]],
) -> ProcessSpec:
    m = c.mapping(
        path,
        raw,
        ("pid", "gpu", "workload"),
        (
            "instance",
            "kind",
            "name",
            "cmdline",
            "user",
            "uid",
            "job",
            "start",
            "end",
            "environ",
            "memory_limit",
            "serving",
        ),
    )
    pid = c.integer(f"{path}.pid", m["pid"], 2, 4194304)
    gpu_index = c.integer(f"{path}.gpu", m["gpu"])
    if not 0 <= gpu_index < len(gpus):
        raise c.expected(f"{path}.gpu", f"a GPU index from 0 to {len(gpus) - 1}", gpu_index)
    gpu = gpus[gpu_index]
    instance: int | None = None
    limit, limit_what = gpu.model.memory_bytes, f"memory of {gpu.model.key}"
    if gpu.mig is not None:
        ids = sorted(instances[gpu_index])
        if "instance" not in m:
            raise c.fail(
                f"{path}.instance",
                f"expected a GPU instance id (GPU {gpu_index} is in MIG mode: "
                f"{', '.join(map(str, ids)) or 'none'}), found nothing",
            )
        instance = c.integer(f"{path}.instance", m["instance"])
        if instance not in ids:
            raise c.expected(
                f"{path}.instance",
                f"a GPU instance id of GPU {gpu_index} ({', '.join(map(str, ids)) or 'none'})",
                instance,
            )
        profile = instances[gpu_index][instance]
        limit, limit_what = profile.memory_bytes, f"memory of MIG {profile.name}"
    elif "instance" in m:
        raise c.expected(
            f"{path}.instance", f"no instance (GPU {gpu_index} is not in MIG mode)", m["instance"]
        )
    kind = c.choice(f"{path}.kind", m.get("kind", "compute"), ("compute", "graphics", "mps_client"))
    if kind == "mps_client" and gpu.mps is None:
        raise c.expected(f"{path}.kind", f"compute or graphics (GPU {gpu_index} runs no MPS server)", kind)
    if kind != "mps_client" and gpu.mps is not None:
        raise c.expected(
            f"{path}.kind", f"mps_client (GPU {gpu_index} runs MPS in exclusive-process mode)", kind
        )
    job = _parse_job(c, f"{path}.job", m["job"], k8s_defaults) if m.get("job") is not None else None
    default_user = job.user if isinstance(job, SlurmJob) else "root"
    user = c.string(f"{path}.user", m.get("user", default_user))
    uid = c.integer(f"{path}.uid", m["uid"], 0, MAX_UID) if "uid" in m else users.get(user, default_uid(user))
    name = c.string(f"{path}.name", m.get("name", "python"))
    cmdline_raw = m.get("cmdline", [name])
    if isinstance(cmdline_raw, str):
        cmdline = tuple(cmdline_raw.split())
    else:
        cmdline = tuple(
            c.string(f"{path}.cmdline[{i}]", a) for i, a in enumerate(c.list_(f"{path}.cmdline", cmdline_raw))
        )
    if not cmdline:
        raise c.expected(f"{path}.cmdline", "at least one word", cmdline_raw)
    start = c.duration(f"{path}.start", m.get("start", 0), negative=True)
    end = c.duration(f"{path}.end", m["end"], negative=True, forever=True) if "end" in m else FOREVER
    if end <= start:
        raise c.expected(f"{path}.end", f"a time after start ({start:g}s)", m.get("end"))
    env = c.any_mapping(f"{path}.environ", m.get("environ", {}))
    environ = tuple((str(k), c.string(f"{path}.environ.{k}", v)) for k, v in env.items())
    serving = None
    workload_raw = m["workload"]
    if "serving" in m:
        serving = parse_serving(c, f"{path}.serving", m["serving"], job, limit)
        if isinstance(workload_raw, dict):
            if "memory" in workload_raw:
                raise c.expected(
                    f"{path}.workload.memory",
                    "nothing (a serving process holds what its server pre-allocates)",
                    workload_raw["memory"],
                )
            workload_raw = {**workload_raw, "memory": serving.reserved_bytes(limit)}
    workload = parse_workload(c, f"{path}.workload", workload_raw, limit, limit_what)
    sm_cap, memory_limit = _limits(c, path, m, dict(environ), kind)
    if workload.nvlink_gbps and not gpu.nvlink:
        raise c.expected(
            f"{path}.workload.nvlink_gbps",
            f"0 (GPU {gpu_index} exposes no NVLink: nvlink: false)",
            m["workload"]["nvlink_gbps"],
        )
    return ProcessSpec(
        pid=pid,
        gpu=gpu_index,
        instance=instance,
        kind=kind,  # type: ignore[arg-type]
        name=name,
        cmdline=cmdline,
        user=user,
        uid=uid,
        job=job,
        start=start,
        end=end,
        workload=workload,
        environ=environ,
        sm_cap=sm_cap,
        memory_limit_bytes=memory_limit,
        serving=serving,
    )


def parse_serving(c: _Check, path: str, raw: Any, job: Job | None, device_bytes: int) -> ServingSpec:
    """A process's `serving:` block: the server, its pre-allocation flags and its load."""
    if not isinstance(job, KubernetesJob):
        raise c.expected(
            path.rsplit(".", 1)[0] + ".job",
            "a kubernetes job (a server's metrics join its job by namespace and pod)",
            job,
        )
    if not isinstance(raw, dict):
        raise c.expected(path, "a mapping", raw)
    server = Server(c.choice(f"{path}.server", raw.get("server"), tuple(Server)))
    flag = "gpu_memory_utilization" if server is Server.VLLM else "mem_fraction_static"
    optional = ("model", "queue", "preemptions_per_hour", flag) + (
        ("kv_cache_memory",) if server is Server.VLLM else ()
    )
    m = c.mapping(path, raw, ("server", "weights", "kv_peak"), optional)
    weights = c.size(f"{path}.weights", m["weights"])
    fraction = c.fraction(f"{path}.{flag}", m.get(flag, 0.9 if server is Server.VLLM else 0.88))
    kv_set = c.size(f"{path}.kv_cache_memory", m["kv_cache_memory"]) if "kv_cache_memory" in m else None
    spec = ServingSpec(
        server=server,
        model_name=c.string(f"{path}.model", m.get("model", "model")),
        weights_bytes=weights,
        memory_fraction=fraction,
        kv_cache_memory_bytes=kv_set,
        kv_peak=c.fraction(f"{path}.kv_peak", m["kv_peak"]),
        queue=c.number(f"{path}.queue", m.get("queue", 0), 0, 10_000),
        preemptions_per_hour=c.number(
            f"{path}.preemptions_per_hour", m.get("preemptions_per_hour", 0), 0, 1e6
        ),
        device_bytes=device_bytes,
    )
    if spec.pool_bytes(device_bytes) <= 0:
        raise c.expected(
            f"{path}.{flag}",
            f"a fraction whose share of {_gib(device_bytes)} holds the weights and "
            f"{_gib(NON_KV_BYTES)} of non-KV memory with room for a KV cache",
            fraction,
        )
    if spec.reserved_bytes(device_bytes) > device_bytes:
        raise c.expected(
            f"{path}.kv_cache_memory", f"a pool that fits {_gib(device_bytes)} with the weights", kv_set
        )
    return spec


def _limits(
    c: _Check, path: str, m: dict[str, Any], env: dict[str, str], kind: str
) -> tuple[float | None, int | None]:
    """(SM cap, memory limit) of a process: an MPS client reads both from its environment, as the
    CUDA runtime does (a process without MPS ignores those variables); `memory_limit` is what a
    framework sets (PyTorch's per-process memory fraction, TensorFlow's memory limit); with both,
    the lower one holds."""
    limit = None
    if "memory_limit" in m:
        limit = c.size(f"{path}.memory_limit", m["memory_limit"])
        if limit <= 0:
            raise c.expected(f"{path}.memory_limit", "a size above 0", m["memory_limit"])
    if kind != "mps_client":
        return None, limit
    cap = None
    if THREAD_PERCENTAGE in env:
        raw = env[THREAD_PERCENTAGE]
        try:
            pct = float(raw)
        except ValueError:
            pct = math.nan
        if not 0 < pct <= 100:
            raise c.expected(f"{path}.environ.{THREAD_PERCENTAGE}", "a percentage above 0, at most 100", raw)
        cap = pct / 100
    if PINNED_MEM_LIMIT in env:
        pinned = parse_pinned_limit(env[PINNED_MEM_LIMIT])
        if pinned is None:
            raise c.expected(
                f"{path}.environ.{PINNED_MEM_LIMIT}",
                "device limits like '0=20G' or '0=20480M,1=8G' (device 0: the process's GPU)",
                env[PINNED_MEM_LIMIT],
            )
        if pinned:  # no entry for device 0: this process's GPU is not limited
            limit = pinned if limit is None else min(limit, pinned)
    return cap, limit


def parse_pinned_limit(value: str) -> int | None:
    """Device 0's limit in bytes from a CUDA_MPS_PINNED_DEVICE_MEM_LIMIT value (0: none for device
    0), or None when the value is malformed. A process here sees one GPU: device 0."""
    found = 0
    for part in value.split(","):
        match = _PINNED.match(part.strip())
        if match is None or int(match[2]) == 0:
            return None
        if match[1] == "0":
            found = int(match[2]) * _PINNED_UNITS[match[3]]
    return found


@dataclass(frozen=True)
class _FaultEntry:
    """What every fault parser gets: the checked entry, its kind's value, time, GPU and `for`."""

    c: _Check
    path: str  # faults.timeline[i]
    kind: FaultKind
    raw: dict[str, Any]  # the whole entry (keys checked)
    value: Any  # the value under the kind's key
    at: float
    gpu: GpuSpec | None  # None only for node-level kinds
    duration: float  # `for`, FOREVER when absent

    @property
    def vpath(self) -> str:
        return f"{self.path}.{self.kind}"

    @property
    def gpu_spec(self) -> GpuSpec:
        assert self.gpu is not None, "node-level kinds have no GPU"
        return self.gpu

    @property
    def gpu_index(self) -> int | None:
        return None if self.gpu is None else self.gpu.index


def _xid(e: _FaultEntry) -> Fault:
    c, code = e.c, e.c.integer(e.vpath, e.value, 1, 999)
    if "instance" not in e.raw:
        return XidFault(at=e.at, gpu=e.gpu_index, code=code)
    if e.gpu_spec.mig is None:
        raise c.expected(
            f"{e.path}.instance",
            f"no instance (GPU {e.gpu_spec.index} is not in MIG mode)",
            e.raw["instance"],
        )
    instance = c.integer(f"{e.path}.instance", e.raw["instance"], 0, 14)
    return XidFault(at=e.at, gpu=e.gpu_index, code=code, instance=instance)


def _ecc_counts(e: _FaultEntry, keys: tuple[str, ...]) -> tuple[int, int, int]:
    """(corrected, uncorrected, location) of an ecc / ecc_storm value, on a GPU with ECC on."""
    c = e.c
    m = c.mapping(e.vpath, e.value, (), keys)
    corrected = c.integer(f"{e.vpath}.corrected", m.get("corrected", 0), 0)
    uncorrected = c.integer(f"{e.vpath}.uncorrected", m.get("uncorrected", 0), 0)
    if corrected + uncorrected == 0:
        raise c.expected(e.vpath, "a corrected or uncorrected count above 0", e.value)
    location = MEMORY_LOCATIONS[
        c.choice(f"{e.vpath}.location", m.get("location", "dram"), list(MEMORY_LOCATIONS))
    ]
    if not e.gpu_spec.ecc:
        raise c.expected(e.path, f"a GPU with ECC enabled (GPU {e.gpu_spec.index} has ECC off)", e.value)
    return corrected, uncorrected, location


def _ecc(e: _FaultEntry) -> Fault:
    corrected, uncorrected, location = _ecc_counts(e, ("corrected", "uncorrected", "location"))
    return EccFault(
        at=e.at,
        gpu=e.gpu_index,
        corrected=corrected,
        uncorrected=uncorrected,
        location=location,
        duration=e.duration,
    )


def _ecc_storm(e: _FaultEntry) -> Fault:
    corrected, _, location = _ecc_counts(e, ("corrected", "location"))
    if e.duration <= 0 or e.duration == FOREVER:
        raise e.c.expected(f"{e.path}.for", "a finite duration above 0", e.raw["for"])
    return EccStormFault(
        at=e.at, gpu=e.gpu_index, corrected=corrected, location=location, duration=e.duration
    )


def _row_remap(e: _FaultEntry) -> Fault:
    c = e.c
    value = {"state": e.value} if isinstance(e.value, str) else e.value
    m = c.mapping(e.vpath, value, ("state",), ("rows",))
    if not e.gpu_spec.model.row_remapping:
        raise c.expected(e.path, f"a GPU with row remapping ({e.gpu_spec.model.key} has none)", value)
    state: Literal["pending", "failed"] = "pending"
    if c.choice(f"{e.vpath}.state", m["state"], ("pending", "failed")) == "failed":
        state = "failed"
    return RowRemapFault(
        at=e.at, gpu=e.gpu_index, state=state, rows=c.integer(f"{e.vpath}.rows", m.get("rows", 1), 1)
    )


def _lost(e: _FaultEntry) -> Fault:
    return LostFault(at=e.at, gpu=e.gpu_index, duration=e.c.duration(e.vpath, e.value, forever=True))


def _hang(e: _FaultEntry) -> Fault:
    seconds = e.c.duration(e.vpath, e.value)
    if seconds <= 0:
        raise e.c.expected(e.vpath, "a duration above 0", e.value)
    return HangFault(at=e.at, gpu=e.gpu_index, duration=seconds)


def _mps_restart(e: _FaultEntry) -> Fault:
    seconds = e.c.duration(e.vpath, e.value)
    if e.gpu_spec.mps is None:
        raise e.c.expected(f"{e.path}.gpu", "a GPU that runs an MPS server", e.gpu_spec.index)
    return MpsRestartFault(at=e.at, gpu=e.gpu_index, duration=seconds)


def _throttle(e: _FaultEntry) -> Fault:
    c = e.c
    names = [e.value] if isinstance(e.value, str) else c.list_(e.vpath, e.value)
    bits = 0
    for i, name in enumerate(names):
        bits |= THROTTLE_BITS[c.choice(f"{e.vpath}[{i}]", name, list(THROTTLE_BITS))]
    if not bits:
        raise c.expected(e.vpath, "at least one throttle reason", e.value)
    if bits & THROTTLE_BITS["hw_power_brake"]:
        bits |= THROTTLE_BITS["hw_slowdown"]  # power brake is a kind of HW slowdown
    return ThrottleFault(at=e.at, gpu=e.gpu_index, reasons=bits, duration=e.duration)


def _init_error(e: _FaultEntry) -> Fault:
    c = e.c
    if isinstance(e.value, int) and not isinstance(e.value, bool):
        code = c.integer(e.vpath, e.value, 1, 999)
    else:
        code = INIT_ERRORS[c.choice(e.vpath, e.value, list(INIT_ERRORS))]
    return InitErrorFault(at=e.at, code=code, duration=e.duration)


def _mig_gpu(e: _FaultEntry) -> GpuSpec:
    if e.gpu_spec.mig is None:
        raise e.c.expected(f"{e.path}.gpu", "a GPU in MIG mode", e.gpu_spec.index)
    return e.gpu_spec


def _mig_create(e: _FaultEntry) -> Fault:
    c, gpu = e.c, _mig_gpu(e)
    m = c.mapping(e.vpath, e.value, ("profile",), ("start", "id"))
    try:
        profile = gpu.model.mig_profile(c.string(f"{e.vpath}.profile", m["profile"]))
    except CatalogError:
        valid = ", ".join(pr.name for pr in gpu.model.mig_profiles)
        raise c.expected(
            f"{e.vpath}.profile", f"a MIG profile of {gpu.model.key} ({valid})", m["profile"]
        ) from None
    start = -1
    if "start" in m:
        start = c.integer(f"{e.vpath}.start", m["start"], 0, gpu.model.memory_slices - 1)
        if start not in profile.placement_starts:
            raise c.expected(
                f"{e.vpath}.start", f"a start of {profile.name} ({list(profile.placement_starts)})", start
            )
    gid = c.integer(f"{e.vpath}.id", m["id"], 0, 14) if "id" in m else -1
    return MigCreateFault(at=e.at, gpu=gpu.index, mig=MigInstanceSpec(profile, start, gid, -1))


def _mig_destroy(e: _FaultEntry) -> Fault:
    gpu = _mig_gpu(e)
    return MigDestroyFault(at=e.at, gpu=gpu.index, instance=e.c.integer(e.vpath, e.value, 0, 14))


def _pcie_replay(e: _FaultEntry) -> Fault:
    return PcieReplayFault(at=e.at, gpu=e.gpu_index, count=e.c.integer(e.vpath, e.value, 1))


def _nvlink_error(e: _FaultEntry) -> Fault:
    c, gpu = e.c, e.gpu_spec
    m = c.mapping(e.vpath, e.value, ("link",), ("counter", "count"))
    if gpu.model.nvlink_links == 0 or not gpu.nvlink:
        raise c.expected(f"{e.path}.gpu", "a GPU with NVLink", gpu.index)
    return NvlinkErrorFault(
        at=e.at,
        gpu=gpu.index,
        link=c.integer(f"{e.vpath}.link", m["link"], 0, gpu.model.nvlink_links - 1),
        counter=NVLINK_COUNTERS[
            c.choice(f"{e.vpath}.counter", m.get("counter", "crc_flit"), list(NVLINK_COUNTERS))
        ],
        count=c.integer(f"{e.vpath}.count", m.get("count", 1), 1),
    )


def _diag_fail(e: _FaultEntry) -> Fault:
    test = e.c.choice(e.vpath, e.value, list(DIAG_TESTS))
    return DiagFailFault(at=e.at, gpu=e.gpu_index, test=test, duration=e.duration)


@dataclass(frozen=True)
class _FaultRule:
    """How to read one kind: its parser and the keys its entry takes besides `at` and the kind."""

    parse: Callable[[_FaultEntry], Fault]
    optional: tuple[str, ...] = ("gpu",)
    required: tuple[str, ...] = ()
    node_level: bool = False  # applies to the node (no `gpu`)


FAULT_PARSERS: dict[FaultKind, _FaultRule] = {
    FaultKind.XID: _FaultRule(_xid, optional=("gpu", "instance")),
    FaultKind.ECC: _FaultRule(_ecc),
    FaultKind.ECC_STORM: _FaultRule(_ecc_storm, required=("for",)),
    FaultKind.ROW_REMAP: _FaultRule(_row_remap),
    FaultKind.LOST: _FaultRule(_lost),
    FaultKind.THROTTLE: _FaultRule(_throttle, optional=("gpu", "for")),
    FaultKind.HANG: _FaultRule(_hang),
    FaultKind.INIT_ERROR: _FaultRule(_init_error, optional=("for",), node_level=True),
    FaultKind.MIG_CREATE: _FaultRule(_mig_create),
    FaultKind.MIG_DESTROY: _FaultRule(_mig_destroy),
    FaultKind.MPS_RESTART: _FaultRule(_mps_restart),
    FaultKind.PCIE_REPLAY: _FaultRule(_pcie_replay),
    FaultKind.NVLINK_ERROR: _FaultRule(_nvlink_error),
    FaultKind.DIAG_FAIL: _FaultRule(_diag_fail, optional=("gpu", "for")),
}


def _parse_fault(c: _Check, path: str, raw: Any, gpus: tuple[GpuSpec, ...]) -> Fault:
    """One timeline entry: exactly one kind key, `at`, the GPU it hits, then the kind's parser."""
    if not isinstance(raw, dict):
        raise c.expected(path, "a mapping", raw)
    kinds = [FaultKind(k) for k in raw if k in FAULT_KINDS]
    if len(kinds) != 1:
        found = " and ".join(kinds) or "none"
        raise c.fail(path, f"expected exactly one fault kind ({', '.join(FAULT_KINDS)}), found {found}")
    kind = kinds[0]
    rule = FAULT_PARSERS[kind]
    m = c.mapping(path, raw, ("at", kind, *rule.required), rule.optional)
    at = c.duration(f"{path}.at", m["at"])
    gpu: GpuSpec | None = None
    if not rule.node_level:
        if "gpu" not in m:
            raise c.fail(f"{path}.gpu", "expected a GPU index for this fault, found nothing")
        index = c.integer(f"{path}.gpu", m["gpu"])
        if not 0 <= index < len(gpus):
            raise c.expected(f"{path}.gpu", f"a GPU index from 0 to {len(gpus) - 1}", index)
        gpu = gpus[index]
    duration = c.duration(f"{path}.for", m["for"], forever=True) if "for" in m else FOREVER
    return rule.parse(_FaultEntry(c, path, kind, m, m[kind], at, gpu, duration))


def _resolve_mig_timeline(
    c: _Check, faults: list[Fault], gpus: tuple[GpuSpec, ...], repeat: float | None
) -> list[Fault]:
    """Play mig_create / mig_destroy in time order (two cycles when repeating), placing created
    instances and checking every step is possible; returns the faults with placements filled in."""
    resolved = list(faults)
    order = sorted(
        (i for i, f in enumerate(faults) if isinstance(f, MigCreateFault | MigDestroyFault)),
        key=lambda i: (faults[i].at, i),
    )
    if not order:
        return resolved
    alive: dict[int, dict[int, MigInstanceSpec]] = {
        g.index: {inst.gpu_instance_id: inst for inst in g.mig} for g in gpus if g.mig is not None
    }
    for _cycle in range(2 if repeat else 1):
        for i in order:
            f = resolved[i]
            path = f"faults.timeline[{i}]"
            assert f.gpu is not None
            gpu = gpus[f.gpu]
            instances = alive[f.gpu]
            if isinstance(f, MigDestroyFault):
                if f.instance not in instances:
                    raise c.expected(
                        f"{path}.mig_destroy",
                        f"an instance that exists on GPU {f.gpu} at {f.at:g}s "
                        f"({', '.join(map(str, sorted(instances))) or 'none'})",
                        f.instance,
                    )
                del instances[f.instance]
                continue
            assert isinstance(f, MigCreateFault)
            requests: list[tuple[str, int | None]] = [
                (inst.profile.name, inst.start) for inst in instances.values()
            ]
            requests.append((f.mig.profile.name, f.mig.start if f.mig.start >= 0 else None))
            try:
                placed = place_mig_layout(gpu.model, requests)[-1]
            except CatalogError as e:
                raise c.fail(
                    f"{path}.mig_create", f"expected an instance that fits at {f.at:g}s, found: {e}"
                ) from None
            gid = (
                f.mig.gpu_instance_id
                if f.mig.gpu_instance_id >= 0
                else default_gpu_instance_id(gpu.model, placed.profile, placed.start)
            )
            if gid in instances:
                raise c.expected(
                    f"{path}.mig_create.id", f"an id not in use on GPU {f.gpu} at {f.at:g}s", gid
                )
            used = {inst.slot for inst in instances.values()}
            slot = next(s for s in range(gpu.model.compute_slices) if s not in used)
            spec = MigInstanceSpec(placed.profile, placed.start, gid, slot)
            if f.mig.slot >= 0 and (f.mig.start, f.mig.gpu_instance_id, f.mig.slot) != (
                spec.start,
                gid,
                slot,
            ):
                raise c.fail(
                    f"{path}.mig_create",
                    "expected the same placement in every cycle of the repeated timeline; give start and id",
                )
            resolved[i] = replace(f, mig=spec)
            instances[gid] = spec
    return resolved


def _parse_faults(c: _Check, raw: Any, gpus: tuple[GpuSpec, ...]) -> tuple[tuple[Fault, ...], float | None]:
    if raw is None:
        return (), None
    m = c.mapping("faults", raw, ("timeline",), ("repeat",))
    repeat = c.duration("faults.repeat", m["repeat"]) if m.get("repeat") is not None else None
    if repeat is not None and repeat <= 0:
        raise c.expected("faults.repeat", "a duration above 0", m["repeat"])
    faults: list[Fault] = []
    for i, entry in enumerate(c.list_("faults.timeline", m["timeline"])):
        fault = _parse_fault(c, f"faults.timeline[{i}]", entry, gpus)
        if repeat is not None:
            if fault.at >= repeat:
                raise c.expected(
                    f"faults.timeline[{i}].at", f"a time before the repeat period ({repeat:g}s)", entry["at"]
                )
            if fault.duration != FOREVER and fault.duration > repeat:
                raise c.expected(
                    f"faults.timeline[{i}]",
                    f"a duration within the repeat period ({repeat:g}s)",
                    fault.duration,
                )
        faults.append(fault)
    faults = _resolve_mig_timeline(c, faults, gpus, repeat)
    for i, f in enumerate(faults):
        if isinstance(f, XidFault) and f.instance is not None:
            assert f.gpu is not None
            ids = sorted(instance_profiles(gpus[f.gpu], faults))
            if f.instance not in ids:
                raise c.expected(
                    f"faults.timeline[{i}].instance",
                    f"a GPU instance id of GPU {f.gpu} ({', '.join(map(str, ids))})",
                    f.instance,
                )
    return tuple(faults), repeat


def parse_scenario(data: Any, source: str, name: str | None = None) -> Scenario:
    """Validate parsed YAML (`data`) read from `source` (used in error messages)."""
    c = _Check(source)
    top = c.mapping(
        "",
        data,
        ("gpus",),
        ("name", "description", "seed", "node", "users", "processes", "faults", "topology"),
    )
    scenario_name = c.string("name", top.get("name", name or Path(source).stem))
    description = c.string("description", top["description"]) if "description" in top else ""
    seed = c.integer("seed", top.get("seed", 0), 0, MAX_SEED)
    hostname, driver = _parse_driver(c, top.get("node", {}))
    node = top.get("node", {})
    k8s_defaults = c.mapping(
        "node.kubernetes", node.get("kubernetes", {}), (), ("driver", "runtime", "cgroup")
    )
    users_raw = c.any_mapping("users", top.get("users", {}))
    users = {str(u): c.integer(f"users.{u}", uid, 0, MAX_UID) for u, uid in users_raw.items()}
    gpus = _parse_gpus(c, top["gpus"], hostname, users)
    topology = parse_topology(top["topology"], gpus, c.fail) if "topology" in top else default_topology(gpus)
    faults, repeat = _parse_faults(c, top.get("faults"), gpus)
    instances = {g.index: instance_profiles(g, faults) for g in gpus}
    processes: list[ProcessSpec] = []
    owners: dict[int, str] = {}
    for g in gpus:
        if g.mps is not None:
            owners[g.mps.server_pid] = f"gpus[{g.index}].mps.server_pid"
            owners[g.mps.restart_pid] = f"gpus[{g.index}].mps.restart_pid"
    for i, entry in enumerate(c.list_("processes", top.get("processes", []) or [])):
        path = f"processes[{i}]"
        proc = parse_process(
            c, path, entry, gpus, users, {str(k): str(v) for k, v in k8s_defaults.items()}, instances
        )
        if proc.pid in owners:
            raise c.expected(
                f"{path}.pid", f"a pid not used elsewhere (already {owners[proc.pid]})", proc.pid
            )
        owners[proc.pid] = f"{path}.pid"
        processes.append(proc)
    _check_restart_pids(c, processes, owners)
    _check_memory_fits(c, gpus, processes, instances)
    return Scenario(
        name=scenario_name,
        source=source,
        description=description,
        seed=seed,
        hostname=hostname,
        driver=driver,
        gpus=gpus,
        processes=tuple(processes),
        faults=faults,
        repeat=repeat,
        users=tuple(sorted(users.items())),
        kubernetes_defaults=tuple(sorted((str(k), str(v)) for k, v in k8s_defaults.items())),
        topology=topology,
    )


def _check_restart_pids(c: _Check, processes: list[ProcessSpec], owners: dict[int, str]) -> None:
    """Processes that can restart take their new pids from RESTART_PID_BASE up: the scenario's own
    pids stay below it, so a restart never takes a pid the scenario uses."""
    restarting = sum(1 for p in processes if p.memory_limit_bytes is not None)
    if not restarting:
        return
    if restarting > MAX_RESTARTING:
        raise c.fail(
            "processes",
            f"expected at most {MAX_RESTARTING} processes with a memory limit, found {restarting}",
        )
    for pid, where in owners.items():
        if pid >= RESTART_PID_BASE:
            raise c.expected(
                where, f"a pid below {RESTART_PID_BASE} (restarted processes take the pids above)", pid
            )


def _check_memory_fits(
    c: _Check,
    gpus: tuple[GpuSpec, ...],
    processes: list[ProcessSpec],
    instances: dict[int, dict[int, MigProfile]],
) -> None:
    """Processes that run at the same time in one container must fit its memory together (at their
    peak), as the driver would refuse the allocation that does not."""
    by_container: dict[tuple[int, int | None], list[int]] = {}
    for i, proc in enumerate(processes):
        by_container.setdefault((proc.gpu, proc.instance), []).append(i)
    for (gpu_index, instance), members in by_container.items():
        gpu = gpus[gpu_index]
        if instance is None:
            capacity = gpu.model.memory_bytes - gpu_reserved_bytes(gpu.model)
            capacity -= gpu.mps.memory_bytes if gpu.mps is not None else 0
            what = f"GPU {gpu_index}"
        else:
            profile = instances[gpu_index][instance]
            capacity = profile.memory_bytes - instance_reserved_bytes(profile)
            what = f"GPU {gpu_index} instance {instance} ({profile.name})"
        # sweep start/end times; ends sort before starts at the same time
        events = sorted(
            [(processes[i].start, 1, i) for i in members] + [(processes[i].end, 0, i) for i in members]
        )
        running: dict[int, int] = {}
        for when, starting, i in events:
            if not starting:
                running.pop(i, None)
                continue
            limit = processes[i].memory_limit_bytes
            held = processes[i].workload.memory_bytes
            running[i] = held if limit is None else min(held, limit)  # past its limit it fails
            total = sum(running.values())
            if total > capacity:
                pids = ", ".join(str(processes[j].pid) for j in running)
                raise c.fail(
                    f"processes[{i}].workload.memory",
                    f"expected processes running together on {what} to fit its {_gib(capacity)},"
                    f" found {_gib(total)} (pids {pids} at {when:g}s)",
                )


def list_builtin() -> list[str]:
    """Names of the scenarios shipped with gpulens."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load a built-in scenario by name, or a scenario file by path."""
    text_name = str(name_or_path)
    builtin = BUILTIN_DIR / f"{text_name}.yaml"
    if "/" not in text_name and not text_name.endswith((".yaml", ".yml")) and builtin.is_file():
        path, shown = builtin, builtin.name
    else:
        path, shown = Path(text_name), text_name
        if not path.is_file():
            known = ", ".join(list_builtin())
            raise ScenarioError(
                f"{shown}: expected a built-in scenario name ({known}) or a YAML file, found neither"
            )
    try:
        data = load_yaml_file(path, shown)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "file"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if isinstance(e, NestingError):
            raise ScenarioError(f"{shown}: expected a scenario, found a document {problem}") from None
        raise ScenarioError(
            f"{shown}: {where}: expected valid YAML, found a syntax error ({problem})"
        ) from None
    except OSError as e:
        raise ScenarioError(f"{shown}: expected a readable file, found {e.strerror}") from None
    except InputError as e:  # not UTF-8, or over the YAML byte bound
        raise ScenarioError(str(e)) from None
    return parse_scenario(data, shown, name=path.stem)
