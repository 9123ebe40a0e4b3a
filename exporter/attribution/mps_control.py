"""What active-thread percentage an MPS client's server runs under, asked of its control daemon.

A client's own `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (procfs.py) only tightens what its MPS server
runs under, and that comes from the control daemon: the NVIDIA device plugin's MPS sets
`set_default_active_thread_percentage 100/replicas`, which neither NVML nor procfs shows. So the
control client program (`--mps-control`, `nvidia-cuda-mps-control`) is run with
`CUDA_MPS_PIPE_DIRECTORY` set to the client's own pipe directory as the client sees it, through
`/proc/<pid>/root`: a pod whose pipe directory is a host mount at a container path
(`/mps/nvidia.com/gpu/pipe`) is found with no configuration. Two runs per daemon:

1. `get_default_active_thread_percentage` then `get_server_list` (the default on the first line,
   server pids after it, one a line);
2. `get_active_thread_percentage <pid>` for each listed server (one answer line each).

The client's server: the only one listed; with several, the one(s) NVML lists as MPS servers on
the client's GPU, by host pid mapped to the daemon's own view (the last field of `NSpid:` in
`/proc/<server>/status`: the daemon may run in a pod's pid namespace), narrowed to the client's
uid (MPS runs one server per uid) where that still leaves several; with none of them matched, the
daemon's default (what a server started later gets).

A client whose own view cannot be reached, its environment unreadable (so its pipe directory is
unknown) or `/proc/<pid>/root` refused (EACCES/EPERM: the kernel checks both as a ptrace read, which
an exporter without capabilities fails for root pods holding capabilities), is asked through the
fallback (`--mps-pipe-dir`): the node's daemon's pipe directory as the exporter itself sees it
(the chart mounts the device plugin's MPS root read-only at the same path). Unset, such clients'
caps stay unknown, one log line saying so. (A client without a procfs entry, exited, is not
asked at all: attributor.py.)

Answers are cached per daemon (its pipe directory's st_dev/st_ino, so N clients of one daemon,
reached through their own view or the fallback, cost one exchange) for the TTL, failures too
(program missing, non-zero exit, no answer within the timeout, output past 64 KiB or unparsable),
each logged once naming the pipe directory and why. All runs of one sample share one timeout, so a
sample waits at most that long however many daemons there are; a daemon not asked in time is asked
at the next sample. Never raises.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import selectors
import subprocess
import time
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from gpulens.exporter.attribution.logonce import LogOnce

DEFAULT_COMMAND = ("nvidia-cuda-mps-control",)
DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
MAX_OUTPUT_BYTES = 64 * 1024
MAX_ERROR_BYTES = 4 * 1024  # of stderr, for the log line
MAX_SERVERS = 64  # one server per uid: a daemon listing more is not one to trust
MAX_STATUS_BYTES = 64 * 1024
DEFAULT_TTL_S = 60.0
DEFAULT_TIMEOUT_S = 1.0
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"


class ControlError(Exception):
    """Why one run of the control program gave no answer (one line)."""


class ControlTimeout(ControlError):
    """The program did not finish within the time it was given."""


class ProgramMissing(ControlError):
    """The program could not be started (not installed, not executable): the same for every daemon."""


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: bytes
    stderr: bytes


#: (argv, environment, stdin, timeout in seconds) -> what it printed; raises ControlError
Runner = Callable[[Sequence[str], Mapping[str, str], bytes, float], RunResult]
#: a path -> its stat (os.stat); injectable because tests run as root, which no mode bits refuse
Stat = Callable[[str], os.stat_result]
_DENIED = (errno.EACCES, errno.EPERM)


def run_bounded(argv: Sequence[str], env: Mapping[str, str], stdin: bytes, timeout: float) -> RunResult:
    """Run `argv` with `stdin`, reading at most 64 KiB of output within `timeout` seconds; the
    program is killed when it runs longer or prints more."""
    deadline = time.monotonic() + timeout
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            close_fds=True,
        )
    except OSError as exc:
        raise ProgramMissing(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:  # a few short lines: they fit the pipe's buffer, so this never blocks
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:  # it exited without reading: its status says why
            pass
        out, err = _read_bounded(proc.stdout.fileno(), proc.stderr.fileno(), deadline, timeout)
        try:
            code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # closed its output but kept running
            raise ControlTimeout(f"no answer within {timeout:g}s") from None
        return RunResult(code, out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _read_bounded(out_fd: int, err_fd: int, deadline: float, timeout: float) -> tuple[bytes, bytes]:
    """Both pipes until end of file; raises ControlError past the deadline or the output bound."""
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(out_fd, selectors.EVENT_READ, out)
        selector.register(err_fd, selectors.EVENT_READ, err)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise ControlTimeout(f"no answer within {timeout:g}s")
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                buffer: bytearray = key.data
                if buffer is out:
                    out += chunk
                    if len(out) > MAX_OUTPUT_BYTES:
                        raise ControlError(f"more than {MAX_OUTPUT_BYTES // 1024} KiB of output")
                elif len(err) < MAX_ERROR_BYTES:  # stderr past the bound is drained, not kept
                    err += chunk[: MAX_ERROR_BYTES - len(err)]
    return bytes(out), bytes(err)


def parse_percentage(text: str) -> float | None:
    """`33.0` (or `33`, `33.0%`) as a ratio; None unless a number in (0, 100]."""
    value = text.strip().removesuffix("%").strip()
    try:
        pct = float(value)
    except ValueError:
        return None
    return pct / 100 if math.isfinite(pct) and 0 < pct <= 100 else None


def parse_nspid(status: str) -> tuple[int | None, int | None]:
    """(the pid in the innermost pid namespace, the real uid) from `/proc/<pid>/status`."""
    nspid = uid = None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()
            if len(fields) >= 2 and fields[-1].isdigit():
                nspid = int(fields[-1])
        elif line.startswith("Uid:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                uid = int(fields[1])
    return nspid, uid


@dataclass(frozen=True)
class DaemonAnswer:
    """What one control daemon said: its default and each listed server's ratio (None: unknown)."""

    default: float | None
    servers: Mapping[int, float | None]  # server pid as the daemon sees it -> its ratio


def parse_first(stdout: str) -> tuple[float | None, tuple[int, ...]]:
    """The first run's output: the default on line 1, then server pids; raises ControlError when a
    server line is not a pid or there are too many."""
    lines = [line.strip() for line in stdout.splitlines()]
    if not lines:
        raise ControlError("no answer on stdout")
    pids = [line for line in lines[1:] if line]
    if not all(p.isdigit() and len(p) <= 10 for p in pids):
        raise ControlError("unparsable server list")
    if len(pids) > MAX_SERVERS:
        raise ControlError(f"more than {MAX_SERVERS} servers listed")
    return parse_percentage(lines[0]), tuple(dict.fromkeys(int(p) for p in pids))


@dataclass(frozen=True)
class _Cached:
    until: float
    answer: DaemonAnswer | None  # None: the daemon could not be asked (logged)


class MpsControl:
    """Asks MPS control daemons for their clients' caps (module docstring); one sampling thread."""

    def __init__(
        self,
        command: Sequence[str],
        procfs_root: Path,
        log: LogOnce,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        runner: Runner = run_bounded,
        fallback_pipe_dir: str | None = None,
        stat: Stat = os.stat,
    ) -> None:
        self._command = tuple(command)
        # --mps-pipe-dir: the node's daemon as the exporter sees it, for clients whose own view
        # cannot be reached; None: such clients' caps stay unknown
        self._fallback = fallback_pipe_dir or None
        self._stat = stat
        self._prefix = str(procfs_root).rstrip("/") + "/"
        self._log = log
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._runner = runner
        self._daemons: dict[tuple[int, int], _Cached] = {}
        # (client pid, its pipe directory; None: unknown) -> (until, its daemon's key and path;
        # None: none there): one stat per client and TTL, not per sample
        self._clients: dict[tuple[int, str | None], tuple[float, tuple[tuple[int, int], str] | None]] = {}
        self._statuses: dict[int, tuple[int, int | None]] = {}  # server host pid -> (NSpid, uid)
        self._budget_until = 0.0

    def start_sample(self, servers: Collection[int]) -> None:
        """A new sample: its runs share one timeout; `servers` (NVML's MPS server pids, host view)
        keep their cached NSpid, the others are forgotten."""
        self._budget_until = self._clock() + self._timeout_s
        self._statuses = {pid: known for pid, known in self._statuses.items() if pid in servers}
        now = self._clock()
        self._daemons = {key: c for key, c in self._daemons.items() if c.until > now}
        self._clients = {key: c for key, c in self._clients.items() if c[0] > now}

    def thread_ratio(
        self, client: int, pipe_dir: str | None, servers: Collection[int], uid: int | None = None
    ) -> float | None:
        """The active-thread ratio `client`'s server runs under (None: unknown). `pipe_dir`: the
        client's pipe directory in its own view (its `CUDA_MPS_PIPE_DIRECTORY`, else
        `DEFAULT_PIPE_DIRECTORY`), None where its environment could not be read (the fallback is
        asked); `servers`: the host pids of the MPS servers NVML lists on the client's GPU; `uid`:
        the client's."""
        answer = self._answer(client, pipe_dir)
        if answer is None:
            return None
        if len(answer.servers) == 1:
            return next(iter(answer.servers.values()))
        matched = {self._status(pid) for pid in servers}
        chosen = [(owner, answer.servers[ns]) for ns, owner in matched if ns in answer.servers]
        if len(chosen) > 1 and uid is not None:
            chosen = [c for c in chosen if c[0] == uid] or chosen
        if not chosen:
            return answer.default
        ratios = [ratio for _, ratio in chosen]
        # several servers of the client's GPU and uid: the largest never reads it above its cap
        return None if None in ratios else max(r for r in ratios if r is not None)

    # -- the daemon ----------------------------------------------------------------------

    def _daemon_of(self, client: int, pipe_dir: str | None, now: float) -> tuple[tuple[int, int], str] | None:
        """The daemon's cache key (st_dev, st_ino of its pipe directory) and the path it is asked
        at: the client's own view, else the fallback; None where there is none to see (cached for
        the TTL either way)."""
        cached = self._clients.get((client, pipe_dir))
        if cached is not None and now < cached[0]:
            return cached[1]
        if pipe_dir is None:
            found = self._fallback_daemon(client, "its environment cannot be read")
        else:
            path = f"{self._prefix}{client}/root{pipe_dir}"
            try:
                found = self._key(path)
            except OSError as exc:
                if exc.errno in _DENIED:
                    found = self._fallback_daemon(client, f"{path}: permission denied")
                else:
                    found = None  # the client exited, or no daemon there
        self._clients[(client, pipe_dir)] = (now + self._ttl_s, found)
        return found

    def _key(self, path: str) -> tuple[tuple[int, int], str]:
        st = self._stat(path)
        return (st.st_dev, st.st_ino), path

    def _fallback_daemon(self, client: int, why: str) -> tuple[tuple[int, int], str] | None:
        """The `--mps-pipe-dir` daemon for a client whose own view cannot be reached (`why`)."""
        if self._fallback is None:
            self._log.warning(
                "mps-pipe-unreachable",
                "attribution: cannot reach MPS client %d's pipe directory (%s) and --mps-pipe-dir is "
                "unset: such clients' caps come from their environment only, where it can be read "
                "(set --mps-pipe-dir to the node's MPS control daemon's pipe directory, or add "
                "SYS_PTRACE: docs/attribution.md#mps-thread-caps)",
                client,
                why,
            )
            return None
        self._log.info(
            "mps-pipe-unreachable",
            "attribution: cannot reach MPS client %d's pipe directory (%s): such clients ask the "
            "daemon of --mps-pipe-dir %s",
            client,
            why,
            self._fallback,
        )
        try:
            found = self._key(self._fallback)
        except OSError as exc:
            self._log.warning(
                "mps-pipe-dir",
                "attribution: --mps-pipe-dir %s: %s; clients whose own pipe directory cannot be "
                "reached have no daemon to ask",
                self._fallback,
                exc.strerror or exc,
            )
            return None
        self._log.forget("mps-pipe-dir")
        return found

    def _answer(self, client: int, pipe_dir: str | None) -> DaemonAnswer | None:
        now = self._clock()
        daemon = self._daemon_of(client, pipe_dir, now)
        if daemon is None:
            return None
        key, path = daemon
        cached = self._daemons.get(key)
        if cached is not None and now < cached.until:
            return cached.answer
        left = self._budget_until - now
        if left <= 0:
            return None  # this sample's time for daemons is spent: asked at the next one
        try:
            answer = self._ask(path, min(left, self._timeout_s))
        except ControlTimeout:
            if left < self._timeout_s:
                return None  # cut short by other daemons' time, not its own: asked again next sample
            self._failed(("mps-control", key), key, path, f"no answer within {self._timeout_s:g}s", now)
            return None
        except ProgramMissing as exc:  # the same for every daemon: one line for all of them
            self._failed("mps-control-missing", key, path, f"{exc} (--mps-control)", now)
            return None
        except (ControlError, OSError) as exc:  # OSError: a pipe the system refused (never raises)
            self._failed(("mps-control", key), key, path, str(exc), now)
            return None
        self._daemons[key] = _Cached(now + self._ttl_s, answer)
        self._log.forget(("mps-control", key))
        return answer

    def _failed(self, log_key: Hashable, key: tuple[int, int], path: str, why: str, now: float) -> None:
        self._daemons[key] = _Cached(now + self._ttl_s, None)
        self._log.warning(
            log_key,
            "attribution: cannot ask the MPS control daemon of pipe directory %s: %s; its clients' "
            "caps come from their environment only",
            path,
            why,
        )

    def _run(self, path: str, lines: Sequence[str], timeout: float) -> str:
        env = {**os.environ, PIPE_ENV: path}
        result = self._runner(self._command, env, "".join(f"{line}\n" for line in lines).encode(), timeout)
        if len(result.stdout) > MAX_OUTPUT_BYTES:  # an injected runner is held to the same bound
            raise ControlError(f"more than {MAX_OUTPUT_BYTES // 1024} KiB of output")
        if result.returncode != 0:
            said = result.stderr[:MAX_ERROR_BYTES].decode("utf-8", "replace").strip().splitlines()
            reason = f": {said[0][:200]!r}" if said else ""
            raise ControlError(f"exit status {result.returncode}{reason}")
        return result.stdout.decode("utf-8", "replace")

    def _ask(self, path: str, timeout: float) -> DaemonAnswer:
        started = self._clock()
        default, pids = parse_first(
            self._run(path, ("get_default_active_thread_percentage", "get_server_list"), timeout)
        )
        if not pids:
            return DaemonAnswer(default, MappingProxyType({}))
        left = timeout - (self._clock() - started)
        if left <= 0:
            raise ControlTimeout(f"no answer within {timeout:g}s")
        lines = self._run(path, [f"get_active_thread_percentage {pid}" for pid in pids], left).splitlines()
        answers = [line for line in lines if line.strip()]
        if len(answers) != len(pids):  # one line per server, or the lines cannot be told apart
            raise ControlError("unparsable server percentages")
        return DaemonAnswer(
            default,
            MappingProxyType({pid: parse_percentage(a) for pid, a in zip(pids, answers, strict=True)}),
        )

    def _status(self, server: int) -> tuple[int, int | None]:
        """(pid as the daemon sees it, uid) of an MPS server by its host pid, read once while NVML
        lists it; without an `NSpid:` line (kernels before 4.1) the host pid."""
        known = self._statuses.get(server)
        if known is None:
            try:
                with open(f"{self._prefix}{server}/status", "rb") as f:
                    text = f.read(MAX_STATUS_BYTES).decode("utf-8", "replace")
            except OSError:
                return (server, None)  # exited, or not visible: not cached, tried again
            nspid, uid = parse_nspid(text)
            known = self._statuses[server] = (server if nspid is None else nspid, uid)
        return known
