"""A /proc look-alike in which the simulated node's processes are host processes.

On a real GPU node the pids NVML reports are processes of the same host, and tools such as
nvitop (through psutil) show their user, command line, CPU and memory. The simulated pids exist
only in the scenario, so a program launched by `gpulens sim run` would see "No Such Process".
psutil reads every process fact below `psutil.PROCFS_PATH` (made configurable for monitoring from
a container with the host's /proc mounted elsewhere). Pointing it at this view is that same
set-up: the view mirrors the real /proc entry for entry (symbolic links, so `self`, `stat`,
`meminfo` and the program's own pid stay live) and adds a directory per simulated process with the
engine's files (`cgroup`, `environ`, `comm`, `cmdline`, `status`) plus the `stat` and `statm` psutil
needs, derived from the process's start time and state.

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

from gpulens.exporter.sim.state import ProcessState, SimNode

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


def stat_line(proc: ProcessState, now: float, boot: float, rss_bytes: int) -> str:
    """`/proc/<pid>/stat`: a running GPU process uses about one core, mostly in user mode."""
    running = max(0.0, now - proc.start_time)
    cpu_share = 0.5 + min(100, proc.sm_util_percent) / 200  # a CUDA host thread feeding the GPU
    utime = int(running * cpu_share * 0.9 * CLK_TCK)
    stime = int(running * cpu_share * 0.1 * CLK_TCK)
    start_ticks = max(0, int((proc.start_time - boot) * CLK_TCK))
    name = proc.name[:15].replace(")", "]")
    fields = ["S", "1", str(proc.pid), str(proc.pid), "0", "-1", "4194304", "0", "0", "0", "0"]
    fields += [str(utime), str(stime), "0", "0", "20", "0", "24", "0", str(start_ticks)]
    fields += [str(rss_bytes * 4), str(rss_bytes // PAGE)] + ["0"] * 30
    return f"{proc.pid} ({name}) {' '.join(fields)}\n"


def statm_line(rss_bytes: int) -> str:
    pages = rss_bytes // PAGE
    return f"{pages * 4} {pages} {pages // 8} 1 0 {pages} 0\n"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
        self._statm: dict[int, str] = {}  # last statm written per pid (it rarely changes)
        root.mkdir(parents=True, exist_ok=True)

    def refresh(self) -> None:
        simulated = simulated_processes(self.node)
        now = self.node.clock.now()
        wanted: set[str] = set()
        for pid, proc in simulated.items():
            source = self.engine_procfs / str(pid)
            if source.is_dir():
                self._simulated_entry(pid, proc, source, now)
                wanted.add(str(pid))
        for name in os.listdir(self.real_proc):
            if name not in wanted:
                self._mirror_entry(name)
                wanted.add(name)
        for name in os.listdir(self.root):
            if name not in wanted and not name.startswith("."):
                self._remove(self.root / name)

    def _mirror_entry(self, name: str) -> None:
        link = self.root / name
        target = self.real_proc / name
        if link.is_symlink() and os.readlink(link) == str(target):
            return
        self._remove(link)
        with contextlib.suppress(FileExistsError):  # another process of the program made it
            link.symlink_to(target)

    def _simulated_entry(self, pid: int, proc: ProcessState, source: Path, now: float) -> None:
        directory = self.root / str(pid)
        if directory.is_symlink() or not directory.is_dir():
            self._remove(directory)
            directory.mkdir()
            for name in ENGINE_FILES:
                (directory / name).symlink_to(source / name)
            (directory / "cwd").symlink_to("/")
        rss = _rss_bytes(source / "status")
        _write(directory / "stat", stat_line(proc, now, self.boot, rss))
        statm = statm_line(rss)
        if self._statm.get(pid) != statm or not (directory / "statm").exists():
            _write(directory / "statm", statm)
            self._statm[pid] = statm

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


def redirect_psutil(root: Path) -> bool:
    """Make psutil read `root` as /proc; False when psutil is not installed."""
    try:
        import psutil
    except ImportError:
        return False
    psutil.PROCFS_PATH = str(root)
    return True
