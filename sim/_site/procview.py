"""A /proc look-alike in which the simulated node's processes are host processes.

On a real GPU node the pids NVML reports are processes of the same host, and tools such as
nvitop (through psutil) show their user, command line, CPU and memory. The simulated pids exist
only in the scenario, so a program launched by `gpulens sim run` would see "No Such Process".
psutil reads every process fact below `psutil.PROCFS_PATH` (made configurable for monitoring from
a container with the host's /proc mounted elsewhere). Pointing it at this view is that same
set-up: the view mirrors the real /proc entry for entry (symbolic links, so `self`, `stat`,
`meminfo` and the program's own pid stay live) and adds a directory per simulated process with the
engine's files (`cgroup`, `environ`, `comm`, `cmdline`, `status`) plus the `stat` and `statm` psutil
needs, derived from the process's start time and the RSS the engine writes.

The view is refreshed by a daemon thread, so processes that start and end in the scenario come and
go here too. Only psutil is redirected; nothing else in the program reads the view.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from gpulens.sim.state import ProcessState, SimNode

ENGINE_FILES = ("cgroup", "environ", "comm", "cmdline", "status")
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def boot_time(real_proc: Path) -> float:
    for line in (real_proc / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def simulated_processes(node: SimNode) -> dict[int, ProcessState]:
    """Every process with a context on any simulated GPU, by pid."""
    found: dict[int, ProcessState] = {}
    for index in range(len(node.identities)):
        state = node.gpu_state(index)
        groups: list[Iterable[ProcessState]] = [state.processes, state.mps_clients]
        for instance in state.mig_instances:
            groups += [instance.processes, instance.mps_clients]
        for group in groups:
            for proc in group:
                found.setdefault(proc.pid, proc)
    return found


def _rss_bytes(status_file: Path) -> int:
    try:
        for line in status_file.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1024**3


def stat_line(proc: ProcessState, boot: float, rss_bytes: int) -> str:
    """`/proc/<pid>/stat` with the fields psutil reads: name, state, parent, start time, RSS.

    CPU time is not modelled (utime = stime = 0, so CPU% reads 0): rewriting every process's stat
    each second to advance it would cost the measured program about 2 % of a core with 200
    processes, which would bias the side-by-side benchmarks this view serves.
    """
    start_ticks = max(0, int((proc.start_time - boot) * CLK_TCK))
    name = proc.name[:15].replace(")", "]")
    fields = ["S", "1", str(proc.pid), str(proc.pid), "0", "-1", "4194304", "0", "0", "0", "0"]
    fields += ["0", "0", "0", "0", "20", "0", "24", "0", str(start_ticks)]
    fields += [str(rss_bytes * 4), str(rss_bytes // PAGE)] + ["0"] * 30
    return f"{proc.pid} ({name}) {' '.join(fields)}\n"


def statm_line(rss_bytes: int) -> str:
    pages = rss_bytes // PAGE
    return f"{pages * 4} {pages} {pages // 8} 1 0 {pages} 0\n"


class ProcView:
    """The directory `root` kept equal to the real /proc plus the node's processes."""

    def __init__(
        self, root: Path, node: SimNode, engine_procfs: Path, real_proc: Path = Path("/proc")
    ) -> None:
        self.root = root
        self.node = node
        self.engine_procfs = engine_procfs
        self.real_proc = real_proc
        self.boot = boot_time(real_proc)
        self._stop = threading.Event()
        self._entries: dict[str, int | None] = {}  # name in the view -> simulated pid or None (mirror)
        root.mkdir(parents=True, exist_ok=True)

    def refresh(self) -> None:
        """Bring the view up to date; only entries that appeared or went away are touched."""
        wanted: dict[str, int | None] = {}
        for pid, proc in simulated_processes(self.node).items():
            if self._entries.get(str(pid)) == pid:  # already shown
                wanted[str(pid)] = pid
                continue
            source = self.engine_procfs / str(pid)
            if source.is_dir():  # the engine has written its files
                wanted[str(pid)] = pid
                self._simulated_entry(proc, source)
        for name in os.listdir(self.real_proc):
            if name not in wanted:
                wanted[name] = None
                if name not in self._entries or self._entries[name] is not None:
                    self._mirror_entry(name)
        for name in set(self._entries) - set(wanted):
            self._remove(self.root / name)
        self._entries = wanted

    def _mirror_entry(self, name: str) -> None:
        link = self.root / name
        if link.is_symlink() and os.readlink(link) == str(self.real_proc / name):
            return  # made by the process itself at its start (see `show_self`)
        self._remove(link)
        with contextlib.suppress(FileExistsError):  # another process of the program made it
            link.symlink_to(self.real_proc / name)

    def _simulated_entry(self, proc: ProcessState, source: Path) -> None:
        directory = self.root / str(proc.pid)
        self._remove(directory)
        tmp = self.root / f".{proc.pid}.tmp"
        self._remove(tmp)
        tmp.mkdir()
        for name in ENGINE_FILES:
            (tmp / name).symlink_to(source / name)
        (tmp / "cwd").symlink_to("/")
        rss = _rss_bytes(source / "status")
        (tmp / "stat").write_text(stat_line(proc, self.boot, rss))
        (tmp / "statm").write_text(statm_line(rss))
        os.replace(tmp, directory)  # appears complete, never half-written

    @staticmethod
    def _remove(path: Path) -> None:
        if path.is_symlink() or path.is_file():
            path.unlink(missing_ok=True)
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)

    def run(self, interval: float = 1.0) -> None:
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except Exception:  # a transient race with the real /proc must not kill the thread
                continue

    def start(self, interval: float = 1.0) -> threading.Thread:
        """Refresh now, then every `interval` seconds on a daemon thread."""
        self.refresh()
        thread = threading.Thread(target=self.run, args=(interval,), name="gpulens-sim-procview", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()


def show_self(root: Path, real_proc: Path = Path("/proc")) -> None:
    """Put this process into the view now: the refresher (another process) adds it only on its
    next pass, and a program such as nvitop looks itself up at once."""
    pid = str(os.getpid())
    with contextlib.suppress(OSError):  # already there, or the view is gone
        (root / pid).symlink_to(real_proc / pid)


def redirect_psutil(root: Path) -> bool:
    """Make psutil read `root` as /proc; False when psutil is not installed."""
    try:
        import psutil
    except ImportError:
        return False
    psutil.PROCFS_PATH = str(root)
    return True
