"""Files the simulated node leaves on disk for attribution code to find.

Attribution reads job identity from the OS, not from NVML: `/proc/<pid>/cgroup` and
`/proc/<pid>/environ` (Slurm, Kubernetes), `/var/log/pods/<ns>_<pod>_<uid>/` (pod names),
and a dcgm-exporter style job-mapping directory (files named `<gpu>` or `<gpu>.<gpu_instance>`
holding job ids). This module renders those files in the real formats (pure functions, tested one
by one) and keeps a directory tree in step with the set of running simulated processes.

An MPS client's limits live in its control daemon, reached through the client's pipe directory
as the client's mount namespace shows it (`/proc/<pid>/root<pipe dir>`). The tree therefore has a
node filesystem root, `<procfs root>/.root`, that every `<pid>/root` links to, and below it each
running daemon's answers (`<pipe dir>/gpulens-sim-mps.json`) for the control client stand-in
(`mpscontrol.py`) to read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpulens.sim.mpscontrol import DEFAULT_PIPE_DIRECTORY, STATE_FILE, DaemonState
from gpulens.sim.scenario import KubernetesJob, MappingJob, MpsSpec, ProcessSpec, SlurmJob

NODE_ROOT = ".root"  # the node's filesystem root inside the procfs root; `<pid>/root` links to it

_V1_CONTROLLERS = (
    (12, "pids"),
    (11, "devices"),
    (10, "memory"),
    (9, "freezer"),
    (8, "cpuset"),
    (7, "cpu,cpuacct"),
    (6, "blkio"),
    (5, "net_cls,net_prio"),
    (4, "perf_event"),
    (3, "hugetlb"),
    (2, "rdma"),
)


@dataclass(frozen=True)
class ProcView:
    """A running process as the files show it: its spec plus where it runs right now."""

    spec: ProcessSpec
    pid: int  # differs from spec.pid only for a restarted MPS server
    device_uuid: str  # GPU or MIG UUID it was given (NVIDIA_VISIBLE_DEVICES)
    hostname: str
    mps: MpsSpec | None = None  # its GPU's MPS daemon settings (MPS servers and clients)


def comm(spec: ProcessSpec) -> str:
    """`/proc/<pid>/comm`: the executable name, truncated to 15 bytes, newline-terminated."""
    return spec.name[:15] + "\n"


def cmdline(spec: ProcessSpec) -> bytes:
    """`/proc/<pid>/cmdline`: arguments, each NUL-terminated."""
    return b"".join(arg.encode() + b"\0" for arg in spec.cmdline)


def kubernetes_cgroup_path(job: KubernetesJob) -> str:
    """The container's cgroup path as kubelet lays it out for the QoS class, driver and runtime."""
    if job.driver == "systemd":
        uid = job.pod_uid.replace("-", "_")
        if job.qos == "guaranteed":
            pod = f"/kubepods.slice/kubepods-pod{uid}.slice"
        else:
            pod = f"/kubepods.slice/kubepods-{job.qos}.slice/kubepods-{job.qos}-pod{uid}.slice"
        prefix = "cri-containerd" if job.runtime == "containerd" else "crio"
        return f"{pod}/{prefix}-{job.container_id}.scope"
    qos = "" if job.qos == "guaranteed" else f"/{job.qos}"
    leaf = job.container_id if job.runtime == "containerd" else f"crio-{job.container_id}"
    return f"/kubepods{qos}/pod{job.pod_uid}/{leaf}"


def _plain_cgroup_path(spec: ProcessSpec) -> str:
    if spec.kind == "mps_server":
        return "/system.slice/nvidia-mps.service"
    if spec.uid == 0:
        return "/system.slice/gpu-workload.service"
    return f"/user.slice/user-{spec.uid}.slice/session-{3 + spec.uid % 97}.scope"


def cgroup(spec: ProcessSpec) -> str:
    """`/proc/<pid>/cgroup` in cgroup v2 (`0::<path>`) or v1 (one line per hierarchy) format."""
    job = spec.job
    if isinstance(job, SlurmJob):
        step = f"step_{job.step}"
        if job.cgroup == "v2":
            return f"0::/system.slice/slurmstepd.scope/job_{job.job_id}/{step}/user/task_{job.task}\n"
        base = f"/slurm/uid_{spec.uid}/job_{job.job_id}/{step}"
        paths = {
            "devices": f"{base}/task_{job.task}",
            "memory": f"{base}/task_{job.task}",
            "freezer": base,
            "cpuset": base,
        }
        lines = [f"{n}:{ctl}:{paths.get(ctl, '/system.slice/slurmd.service')}" for n, ctl in _V1_CONTROLLERS]
        lines.append("1:name=systemd:/system.slice/slurmd.service")
        return "\n".join(lines) + "\n"
    if isinstance(job, KubernetesJob):
        path = kubernetes_cgroup_path(job)
        if job.cgroup == "v2":
            return f"0::{path}\n"
        lines = [f"{n}:{ctl}:{path}" for n, ctl in _V1_CONTROLLERS]
        lines.append(f"1:name=systemd:{path}")
        return "\n".join(lines) + "\n"
    return f"0::{_plain_cgroup_path(spec)}\n"


def environ(view: ProcView) -> bytes:
    """`/proc/<pid>/environ`: NAME=value entries, each NUL-terminated."""
    spec = view.spec
    home = "/root" if spec.user == "root" else f"/home/{spec.user}"
    env: dict[str, str] = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": home,
        "USER": spec.user,
        "LANG": "C.UTF-8",
    }
    job = spec.job
    if isinstance(job, SlurmJob):
        env.update(
            {
                "SLURM_CLUSTER_NAME": "sim",
                "SLURM_JOB_ID": job.job_id,
                "SLURM_JOBID": job.job_id,
                "SLURM_JOB_USER": job.user,
                "SLURM_JOB_ACCOUNT": job.account,
                "SLURM_JOB_NODELIST": view.hostname,
                "SLURMD_NODENAME": view.hostname,
                "SLURM_STEP_ID": job.step,
                "SLURM_PROCID": str(job.task),
                "SLURM_LOCALID": str(job.task),
                "SLURM_JOB_GPUS": str(spec.gpu),
                "CUDA_VISIBLE_DEVICES": "0",
            }
        )
        if job.name:
            env["SLURM_JOB_NAME"] = job.name
        array, sep, task = job.job_id.partition("_")
        if sep:  # an array's task (`4711_3`), as sbatch --array sets them
            env.update({"SLURM_ARRAY_JOB_ID": array, "SLURM_ARRAY_TASK_ID": task})
    elif isinstance(job, KubernetesJob):
        env.update(
            {
                "HOSTNAME": job.pod,
                "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                "KUBERNETES_SERVICE_PORT": "443",
                "KUBERNETES_PORT": "tcp://10.96.0.1:443",
                "NVIDIA_VISIBLE_DEVICES": view.device_uuid,
            }
        )
    if spec.kind == "mps_client":  # as the device plugin or the user's job script hands it over
        env["CUDA_MPS_PIPE_DIRECTORY"] = view.mps.pipe_dir if view.mps else DEFAULT_PIPE_DIRECTORY
    env.update(dict(spec.environ))
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())


def status(view: ProcView) -> str:
    """`/proc/<pid>/status` (the lines attribution tools read: Name, Pid, PPid, Uid, Gid, NSpid).

    Every simulated process runs in the host's pid namespace (hostPID daemons, Slurm), so `NSpid`
    holds the one pid: the MPS daemon knows its servers by the pid it shows.
    """
    spec = view.spec
    uid = spec.uid
    ppid = 1 if spec.job is None else max(2, view.pid - 1)
    return (
        f"Name:\t{spec.name[:15]}\n"
        "Umask:\t0022\n"
        "State:\tS (sleeping)\n"
        f"Tgid:\t{view.pid}\n"
        "Ngid:\t0\n"
        f"Pid:\t{view.pid}\n"
        f"PPid:\t{ppid}\n"
        "TracerPid:\t0\n"
        f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        f"Gid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        "FDSize:\t256\n"
        f"Groups:\t{uid}\n"
        f"NStgid:\t{view.pid}\n"
        f"NSpid:\t{view.pid}\n"
        "VmRSS:\t 2048000 kB\n"
        "Threads:\t24\n"
    )


def pod_log_dir(job: KubernetesJob) -> str:
    """Directory name kubelet uses under /var/log/pods."""
    return f"{job.namespace}_{job.pod}_{job.pod_uid}"


def job_id(spec: ProcessSpec) -> str | None:
    """The id a job-mapping file would hold for this process (Slurm and mapping-only jobs)."""
    if isinstance(spec.job, SlurmJob | MappingJob):
        return spec.job.job_id
    return None


def daemons(views: list[ProcView]) -> dict[str, DaemonState]:
    """What each running MPS control daemon answers, by pipe directory: the servers of the GPUs
    given that directory (by the pid the daemon shows), each at its GPU's percentage. The default
    is theirs when they agree (one `set_default_active_thread_percentage` for the daemon's
    devices, as the device plugin sets it), else MPS's own 100."""
    servers: dict[str, dict[int, float]] = {}
    for view in views:
        if view.spec.kind == "mps_server" and view.mps is not None:
            servers.setdefault(view.mps.pipe_dir, {})[view.pid] = view.mps.active_thread_percentage
    out: dict[str, DaemonState] = {}
    for pipe_dir, by_pid in servers.items():
        percentages = set(by_pid.values())
        default = percentages.pop() if len(percentages) == 1 else 100.0
        out[pipe_dir] = DaemonState(default, by_pid)
    return out


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class NodeFiles:
    """Keeps procfs, pod-log and job-mapping trees equal to the running processes.

    Only entries this object wrote are ever removed, so pointing it at a shared directory is safe.
    Any root may be None (that tree is not written). The procfs tree includes the node filesystem
    root (`.root`) with each running MPS daemon's state file below its pipe directory.
    """

    def __init__(self, procfs_root: Path | None, pods_root: Path | None, mapping_dir: Path | None) -> None:
        self.procfs_root = procfs_root
        self.pods_root = pods_root
        self.mapping_dir = mapping_dir
        for root in (procfs_root, pods_root, mapping_dir):
            if root is not None:
                root.mkdir(parents=True, exist_ok=True)
        self.node_root = procfs_root / NODE_ROOT if procfs_root is not None else None
        self._made: set[Path] = set()  # directories made for state files (removed once empty)
        if self.node_root is not None and not self.node_root.is_dir():
            self.node_root.mkdir()
            self._made.add(self.node_root)
        self._pids: set[int] = set()
        self._pods: set[str] = set()
        self._mapping: dict[str, str] = {}
        self._daemons: dict[str, str] = {}  # pipe directory -> the state written there

    @property
    def enabled(self) -> bool:
        return any(r is not None for r in (self.procfs_root, self.pods_root, self.mapping_dir))

    def sync(self, views: list[ProcView], mapping: dict[str, list[str]]) -> None:
        """Make the trees show exactly `views` and the job-mapping `mapping` (device key -> job ids)."""
        if self.procfs_root is not None:
            wanted = {v.pid: v for v in views}
            for pid in self._pids - set(wanted):
                shutil.rmtree(self.procfs_root / str(pid), ignore_errors=True)
            for pid in set(wanted) - self._pids:
                self._write_process(self.procfs_root, wanted[pid])
            self._pids = set(wanted)
            self._sync_daemons({d: state.to_json() for d, state in daemons(views).items()})
        if self.pods_root is not None:
            pods = {
                pod_log_dir(v.spec.job): v.spec.job for v in views if isinstance(v.spec.job, KubernetesJob)
            }
            for name in self._pods - set(pods):
                shutil.rmtree(self.pods_root / name, ignore_errors=True)
            for name in set(pods) - self._pods:
                container = self.pods_root / name / pods[name].container
                container.mkdir(parents=True, exist_ok=True)
                (container / "0.log").touch()
            for view in views:  # every container of a pod gets its own log dir
                job = view.spec.job
                if isinstance(job, KubernetesJob):
                    (self.pods_root / pod_log_dir(job) / job.container).mkdir(parents=True, exist_ok=True)
            self._pods = set(pods)
        if self.mapping_dir is not None:
            wanted_files = {
                key: "".join(f"{j}\n" for j in sorted(set(ids))) for key, ids in mapping.items() if ids
            }
            for key in set(self._mapping) - set(wanted_files):
                (self.mapping_dir / key).unlink(missing_ok=True)
            for key, text in wanted_files.items():
                if self._mapping.get(key) != text:
                    _write_atomic(self.mapping_dir / key, text.encode())
            self._mapping = wanted_files

    def _sync_daemons(self, wanted: dict[str, str]) -> None:
        """Write each running daemon's state file, remove those of daemons no server runs under."""
        gone = set(self._daemons) - set(wanted)
        for pipe_dir in gone:
            (self._pipe_path(pipe_dir) / STATE_FILE).unlink(missing_ok=True)
            del self._daemons[pipe_dir]
        for pipe_dir, text in wanted.items():
            if self._daemons.get(pipe_dir) != text:
                directory = self._pipe_path(pipe_dir)
                self._make_dirs(directory)
                _write_atomic(directory / STATE_FILE, text.encode())
                self._daemons[pipe_dir] = text
        if gone:
            self._prune()

    def _pipe_path(self, pipe_dir: str) -> Path:
        assert self.node_root is not None
        if not os.path.isabs(pipe_dir) or os.path.normpath(pipe_dir) != pipe_dir or pipe_dir == "/":
            # the scenario parser allows no other; a path leaving the node root is never written
            raise ValueError(f"MPS pipe directory {pipe_dir!r}: expected an absolute, normalized directory")
        return self.node_root / pipe_dir.lstrip("/")

    def _make_dirs(self, directory: Path) -> None:
        missing = []
        while not directory.is_dir():
            missing.append(directory)
            directory = directory.parent
        for path in reversed(missing):
            path.mkdir()
            self._made.add(path)

    def _prune(self) -> None:
        """Remove the directories made for state files that hold nothing now (deepest first); the
        node root stays while the node's files do (`clear`)."""
        for path in sorted(self._made, key=lambda p: len(p.parts), reverse=True):
            if path == self.node_root:
                continue
            try:
                path.rmdir()
            except OSError:  # not empty: a live state file, or someone else's files
                continue
            self._made.discard(path)

    @staticmethod
    def _write_process(root: Path, view: ProcView) -> None:
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
        os.symlink(f"../{NODE_ROOT}", tmp / "root")  # the process sees the node's filesystem
        (tmp / "cgroup").write_text(cgroup(view.spec))
        (tmp / "environ").write_bytes(environ(view))
        (tmp / "comm").write_text(comm(view.spec))
        (tmp / "cmdline").write_bytes(cmdline(view.spec))
        (tmp / "status").write_text(status(view))
        target = root / str(view.pid)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)

    def clear(self) -> None:
        """Remove everything this object wrote."""
        self.sync([], {})
        if self.node_root is not None and self.node_root in self._made:
            try:
                self.node_root.rmdir()
                self._made.discard(self.node_root)
            except OSError:  # someone else's files are in it
                pass
