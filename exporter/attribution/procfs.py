"""Read what `/proc/<pid>` says about a GPU process: its cgroup identity, Slurm env and uid.

Processes come and go between NVML listing them and us reading procfs, so every read tolerates
the pid having vanished (the process then simply has no procfs identity). Results are cached per
pid for a short TTL (cgroup and environ rarely change during a process's life) and dropped as soon
as the pid is no longer listed by NVML, so ended jobs leave no state behind.

A pid without a readable entry is remembered as such for the same TTL. NVML keeps listing such a
pid when it lives in another pid namespace (an exporter without hostPID, or a simulated node's
processes): asking procfs again every cycle cost three failing opens per pid and sample (about
600 on the `large` node, ~15 ms of CPU per cycle, procfs lookups of absent pids being slow in the
kernel) for the same answer. A pid that really exited stops being listed and is forgotten.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpulens.exporter.attribution.cgroup import CgroupIdentity, parse_cgroup
from gpulens.exporter.attribution.logonce import LogOnce

MAX_CGROUP_BYTES = 64 * 1024
MAX_ENVIRON_BYTES = 512 * 1024
SLURM_ENV_KEYS = frozenset({"SLURM_JOB_ID", "SLURM_JOB_USER", "SLURM_JOB_ACCOUNT", "SLURM_JOB_UID"})
_VANISHED = (errno.ENOENT, errno.ESRCH)


@dataclass(frozen=True)
class ProcessInfo:
    """Identity-relevant facts about one pid (all empty when the process vanished)."""

    cgroup: CgroupIdentity = field(default_factory=CgroupIdentity)
    slurm_env: dict[str, str] = field(default_factory=dict)
    uid: int | None = None


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
        self._cache: dict[int, tuple[float, ProcessInfo]] = {}

    def _read(self, pid: int, name: str, limit: int) -> bytes | None:
        path = f"{self._prefix}{pid}/{name}"
        try:
            with open(path, "rb") as handle:
                return handle.read(limit)
        except OSError as exc:
            if exc.errno in _VANISHED:
                if not self._root.is_dir():  # not a vanished pid: the whole --procfs root is wrong
                    self._log.warning(
                        "procfs-root-missing",
                        "attribution: procfs root %s is not a directory (check --procfs); processes are "
                        "identified from other sources only",
                        self._root,
                    )
                return None
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

    def read(self, pid: int) -> ProcessInfo:
        now = self._clock()
        cached = self._cache.get(pid)
        if cached is not None and now - cached[0] < self._ttl_s:
            return cached[1]
        cgroup_bytes = self._read(pid, "cgroup", MAX_CGROUP_BYTES)
        environ = self._read(pid, "environ", MAX_ENVIRON_BYTES)
        status = self._read(pid, "status", MAX_CGROUP_BYTES)
        if cgroup_bytes is None and environ is None and status is None:
            info = ProcessInfo()  # vanished, unreadable or in another pid namespace (module docstring)
            self._cache[pid] = (now, info)
            return info
        info = ProcessInfo(
            cgroup=parse_cgroup(cgroup_bytes.decode("utf-8", "replace"))
            if cgroup_bytes
            else CgroupIdentity(),
            slurm_env=parse_environ(environ) if environ else {},
            uid=parse_status_uid(status.decode("utf-8", "replace")) if status else None,
        )
        self._cache[pid] = (now, info)
        return info

    def retain(self, pids: Iterable[int]) -> None:
        """Forget every pid not in `pids` (the processes NVML lists right now)."""
        keep = set(pids)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]
