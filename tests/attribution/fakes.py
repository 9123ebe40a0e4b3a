"""A fake node for attribution tests: procfs, kubelet log dirs and a mapping dir under tmp."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from gpulens.exporter.attribution import AttributionConfig, Attributor, ProcessRef
from gpulens.exporter.attribution.model import ProcessKind

GPU0 = "GPU-00000000-1111-2222-3333-000000000000"
GPU1 = "GPU-00000000-1111-2222-3333-000000000001"
MIG_A = "MIG-aaaaaaaa-1111-2222-3333-000000000000"
MIG_B = "MIG-bbbbbbbb-1111-2222-3333-000000000000"
POD_UID_A = "0b1c2d3e-1111-2222-3333-444455556666"
POD_UID_B = "9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"
CID_A = "a" * 64
CID_B = "b" * 64


def slurm_v1(job: str, uid: int = 1000) -> str:
    base = f"/slurm/uid_{uid}/job_{job}/step_0/task_0"
    return "".join(f"{n}:{c}:{base}\n" for n, c in ((12, "memory"), (11, "devices"), (4, "cpu,cpuacct")))


def slurm_v2(job: str) -> str:
    return f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"


def kube_systemd(pod_uid: str, cid: str, runtime: str = "cri-containerd", qos: str = "burstable") -> str:
    under = pod_uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{under}.slice/{runtime}-{cid}.scope\n"


def kube_cgroupfs(pod_uid: str, cid: str, qos: str = "burstable") -> str:
    return f"11:memory:/kubepods/{qos}/pod{pod_uid}/{cid}\n0::/kubepods/{qos}/pod{pod_uid}/{cid}\n"


@dataclass
class FakeNode:
    root: Path
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("tests.attribution"))

    @property
    def procfs(self) -> Path:
        return self.root / "proc"

    @property
    def pod_logs(self) -> Path:
        return self.root / "log" / "pods"

    @property
    def mapping_dir(self) -> Path:
        return self.root / "mapping"

    def process(
        self, pid: int, cgroup: str = "0::/user.slice\n", env: dict[str, str] | None = None, uid: int = 1000
    ) -> None:
        d = self.procfs / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup").write_text(cgroup)
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in (env or {}).items()))
        (d / "status").write_text(f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")

    @property
    def fs_root(self) -> Path:
        """The node's file system as its processes see it (`/proc/<pid>/root`)."""
        return self.root / "fsroot"

    def mps_client(
        self, pid: int, cgroup: str, pipe_dir: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        """An MPS client process seeing the node's file system, with the pipe directory its
        environment names (none: the default `/tmp/nvidia-mps`)."""
        extra = {"CUDA_MPS_PIPE_DIRECTORY": pipe_dir} if pipe_dir else {}
        self.process(pid, cgroup, env={**extra, **(env or {})})
        self.fs_root.mkdir(parents=True, exist_ok=True)
        (self.procfs / str(pid) / "root").symlink_to(self.fs_root)

    def refuse_environ(self, pid: int) -> None:
        """`/proc/<pid>/environ` cannot be read, as the kernel's ptrace check refuses it (a
        directory in its place: tests run as root, which no mode bits refuse)."""
        environ = self.procfs / str(pid) / "environ"
        environ.unlink()
        environ.mkdir()

    def mps_daemon(self, pipe_dir: str, state_json: str) -> Path:
        """A control daemon behind `pipe_dir` answering as `state_json` says (the stand-in's file)."""
        directory = self.fs_root / pipe_dir.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "gpulens-sim-mps.json").write_text(state_json)
        return directory

    def mps_server(self, pid: int, nspid: int, uid: int = 0) -> None:
        """An MPS server process: host pid `pid`, `nspid` in the daemon's pid namespace."""
        d = self.procfs / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "status").write_text(
            f"Name:\tnvidia-cuda-mps\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{pid}\t{nspid}\n"
        )

    def pod(self, namespace: str, name: str, uid: str, containers: dict[str, str]) -> None:
        """A pod's kubelet log dirs; `containers` maps container name -> container id."""
        for container, cid in containers.items():
            (self.pod_logs / f"{namespace}_{name}_{uid}" / container).mkdir(parents=True, exist_ok=True)
            links = self.root / "log" / "containers"
            links.mkdir(parents=True, exist_ok=True)
            (links / f"{name}_{namespace}_{container}-{cid}.log").write_text("")

    def mapping(self, name: str, content: str | bytes) -> Path:
        self.mapping_dir.mkdir(parents=True, exist_ok=True)
        path = self.mapping_dir / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def config(self, **overrides: object) -> AttributionConfig:
        values: dict[str, object] = {
            "procfs_root": self.procfs,
            "job_mapping_dir": self.mapping_dir,
            "pod_resources_socket": None,
            "pod_logs_dir": self.pod_logs,
            # not the node's own MPS control program: a test asks only the daemons it stands in
            "mps_control": (),
        }
        values.update(overrides)
        return AttributionConfig(**values)  # type: ignore[arg-type]

    def attributor(self, **overrides: object) -> Attributor:
        self.procfs.mkdir(parents=True, exist_ok=True)
        return Attributor(self.config(**overrides), logger=self.logger)


def proc(
    pid: int,
    gpu: int = 0,
    memory: int | None = 1 << 30,
    sm: float | None = None,
    kind: str = "compute",
    gi: int | None = None,
    mig_uuid: str | None = None,
    uuid: str | None = None,
) -> ProcessRef:
    return ProcessRef(
        pid=pid,
        gpu=gpu,
        uuid=uuid or (GPU0 if gpu == 0 else GPU1),
        gpu_instance=gi,
        mig_uuid=mig_uuid,
        kind=ProcessKind(kind),
        used_memory_bytes=memory,
        sm_util_ratio=sm,
    )


def by_job(usages):
    """(gpu, gpu_instance, job_id) -> JobUsage."""
    return {(u.gpu, u.gpu_instance, u.identity.job_id): u for u in usages}
