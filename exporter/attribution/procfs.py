"""Read what `/proc/<pid>` says about a GPU process: its cgroup identity, Slurm env, uid, MPS cap
and MPS pipe directory.

Processes come and go between NVML listing them and us reading procfs, so every read tolerates
the pid having vanished (the process then simply has no procfs identity). Results are cached per
pid for a short TTL (cgroup and environ rarely change during a process's life) and dropped as soon
as the pid is no longer listed by NVML, so ended jobs leave no state behind. When the TTL runs out,
the cgroup file is read again first: if it is unchanged and names a job or pod, the answer stands
without reading environ and status again (two of three opens per pid and TTL).

A pid without an entry is looked up again with a back-off: at the next sample, then after as long
as it has been missing so far (doubling), at most every TTL. NVML keeps listing such a pid when it
lives in another pid namespace (an exporter without hostPID, or a simulated node's processes):
asking procfs every cycle cost failing opens per pid and sample (~200 pids on the `large` node,
procfs lookups of absent pids being slow in the kernel) for the same answer, while an entry that
shows up again (a transient failure) is still found within as long as it was missing. A pid that
really exited stops being listed and is forgotten.
"""

from __future__ import annotations

import enum
import errno
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpulens.exporter.attribution.cgroup import CgroupIdentity, parse_cgroup
from gpulens.exporter.attribution.logonce import LogOnce

MAX_CGROUP_BYTES = 64 * 1024
MAX_ENVIRON_BYTES = 512 * 1024
SLURM_ENV_KEYS = frozenset(
    {"SLURM_JOB_ID", "SLURM_JOB_USER", "SLURM_JOB_ACCOUNT", "SLURM_JOB_UID", "SLURM_JOB_NAME"}
)
#: An MPS client's own active-thread limit (Slurm sets it from the job's gres/mps share; gpulens'
#: plans set it per client). The control daemon's default is not in the environment: NVML and
#: procfs cannot see it, so mps_control.py asks the daemon.
MPS_THREAD_KEY = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#: Where an MPS client finds its control daemon (default `/tmp/nvidia-mps`, as the client sees its
#: file system): mps_control.py asks that daemon for the cap the client runs under.
MPS_PIPE_KEY = "CUDA_MPS_PIPE_DIRECTORY"
MAX_PIPE_DIR_CHARS = 256  # a Unix socket path (the daemon's `control`) fits 108 bytes anyway
ENV_KEYS = SLURM_ENV_KEYS | {MPS_THREAD_KEY, MPS_PIPE_KEY}
_VANISHED = (errno.ENOENT, errno.ESRCH)


class EnvironRead(enum.Enum):
    """What became of reading a pid's environ."""

    READ = "read"
    UNREADABLE = "unreadable"  # the entry is there, its environ is not (refused: the ptrace check)
    NO_ENTRY = "no entry"  # the process exited, or is in another pid namespace


@dataclass(frozen=True)
class ProcessInfo:
    """Identity-relevant facts about one pid (all empty when the process vanished)."""

    cgroup: CgroupIdentity = field(default_factory=CgroupIdentity)
    slurm_env: dict[str, str] = field(default_factory=dict)
    uid: int | None = None
    # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / 100 where the environment sets a valid one (0 < p <= 100)
    mps_thread_ratio: float | None = None
    # CUDA_MPS_PIPE_DIRECTORY where it is a sane absolute path (parse_pipe_dir); None: the default
    mps_pipe_dir: str | None = None
    # whether /proc/<pid>/environ was read: where it was not, the two fields above say nothing (an
    # MPS client's pipe directory is then unknown, not the default)
    environ: EnvironRead = EnvironRead.NO_ENTRY


_NO_ENTRY = ProcessInfo()


class _Vanished(Exception):
    """The pid has no procfs entry (or the --procfs root is wrong)."""


def parse_environ(data: bytes, keys: frozenset[str] = SLURM_ENV_KEYS) -> dict[str, str]:
    """The wanted `KEY=VALUE` entries of a NUL-separated environ block (undecodable bytes replaced)."""
    wanted: dict[str, str] = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if not sep:
            continue
        name = key.decode("ascii", "replace")
        if name in keys:
            wanted[name] = value.decode("utf-8", "replace")
    return wanted


def parse_thread_percentage(value: str | None) -> float | None:
    """`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` as a ratio; None unless a number in (0, 100] (CUDA
    rejects other values, so the client then runs without a limit of its own)."""
    if value is None:
        return None
    try:
        pct = float(value.strip())
    except ValueError:
        return None
    return pct / 100 if 0 < pct <= 100 else None


def parse_pipe_dir(value: str | None) -> str | None:
    """`CUDA_MPS_PIPE_DIRECTORY` when it is an absolute path of at most 256 characters without
    control characters or `..` (it is resolved under the client's `/proc/<pid>/root`, and a process
    must not steer the exporter elsewhere); None otherwise (then the client uses the default)."""
    if not value or len(value) > MAX_PIPE_DIR_CHARS or not value.startswith("/"):
        return None
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value) or ".." in value.split("/"):
        return None
    return value


def parse_status_uid(text: str) -> int | None:
    """Real uid from `/proc/<pid>/status` (`Uid:\treal\teffective\tsaved\tfs`)."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1])
    return None


class ProcfsReader:
    """Per-pid reads under a procfs root with a TTL cache; never raises for a vanished pid."""

    def __init__(
        self,
        root: Path,
        log: LogOnce,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._root = root
        # paths built as strings: pathlib's `/` parsed two components per file, ~600 per cycle
        self._prefix = str(root).rstrip("/") + "/"
        self._log = log
        self._ttl_s = ttl_s
        self._clock = clock
        # pid -> (when read, what was found, the cgroup file's bytes then)
        self._cache: dict[int, tuple[float, ProcessInfo, bytes | None]] = {}
        # pid -> (first lookup that found no entry, latest such lookup), for the back-off
        self._missing: dict[int, tuple[float, float]] = {}

    def _read(self, pid: int, name: str, limit: int) -> bytes | None:
        """The file's first `limit` bytes; None when unreadable. Raises `_Vanished` without an entry."""
        path = f"{self._prefix}{pid}/{name}"
        try:
            with open(path, "rb") as handle:
                return handle.read(limit)
        except OSError as exc:
            if exc.errno in _VANISHED:
                raise _Vanished from None
            if exc.errno in (errno.EACCES, errno.EPERM):
                self._log.warning(
                    ("procfs-denied", name),
                    "attribution: cannot read %s (permission denied); processes whose %s cannot be read "
                    "fall back to other identity sources (run the exporter as root with hostPID)",
                    path,
                    name,
                )
                return None
            self._log.warning(("procfs-error", name), "attribution: cannot read %s: %s", path, exc)
            return None

    def _missing_root(self) -> None:
        if not self._root.is_dir():  # not a vanished pid: the whole --procfs root is wrong
            self._log.warning(
                "procfs-root-missing",
                "attribution: procfs root %s is not a directory (check --procfs); processes are "
                "identified from other sources only",
                self._root,
            )

    def read(self, pid: int) -> ProcessInfo:
        now = self._clock()
        cached = self._cache.get(pid)
        if cached is not None and now - cached[0] < self._ttl_s:
            return cached[1]
        missing = self._missing.get(pid)
        if missing is not None:
            first, latest = missing
            if now - latest < min(self._ttl_s, latest - first):  # back-off (module docstring)
                return _NO_ENTRY
        try:
            cgroup_bytes = self._read(pid, "cgroup", MAX_CGROUP_BYTES)
            if cached is not None and cgroup_bytes == cached[2] and not cached[1].cgroup.empty:
                # the cgroup still names the same job or pod: environ and uid only matter to the
                # identity when it does not (both read at the process's first sight)
                self._cache[pid] = (now, cached[1], cgroup_bytes)
                return cached[1]
            environ = self._read(pid, "environ", MAX_ENVIRON_BYTES)
            status = self._read(pid, "status", MAX_CGROUP_BYTES)
        except _Vanished:  # no entry (exited, or another pid namespace): nothing else to read
            self._cache.pop(pid, None)
            self._missing[pid] = (now if missing is None else missing[0], now)
            self._missing_root()
            return _NO_ENTRY
        self._missing.pop(pid, None)
        env = parse_environ(environ, ENV_KEYS) if environ else {}
        thread_pct = env.pop(MPS_THREAD_KEY, None)
        pipe_dir = env.pop(MPS_PIPE_KEY, None)
        info = ProcessInfo(
            cgroup=parse_cgroup(cgroup_bytes.decode("utf-8", "replace"))
            if cgroup_bytes
            else CgroupIdentity(),
            slurm_env=env,
            uid=parse_status_uid(status.decode("utf-8", "replace")) if status else None,
            mps_thread_ratio=parse_thread_percentage(thread_pct),
            mps_pipe_dir=parse_pipe_dir(pipe_dir),
            environ=EnvironRead.UNREADABLE if environ is None else EnvironRead.READ,
        )
        self._cache[pid] = (now, info, cgroup_bytes)
        return info

    def retain(self, pids: Iterable[int]) -> None:
        """Forget every pid not in `pids` (the processes NVML lists right now)."""
        keep = set(pids)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]
        for pid in [p for p in self._missing if p not in keep]:
            del self._missing[pid]
