"""Job identity from a process's `/proc/<pid>/cgroup` text (Slurm and Kubernetes layouts).

Pure parsing, no I/O, so it can be fuzzed. Layouts recognised:

Slurm
  * cgroup v1: ``/slurm/uid_<uid>/job_<id>/step_<s>/task_<t>`` (also ``/slurm_<node>/...``)
  * cgroup v2: ``/system.slice/slurmstepd.scope/job_<id>/step_<s>/user/task_<t>``
    (also ``<node>_slurmstepd.scope`` when several slurmd run on one host)

Kubernetes
  * cgroupfs driver: ``/kubepods[/burstable|/besteffort]/pod<uid>/<container id>``
  * systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/
    cri-containerd-<id>.scope`` (also ``crio-<id>.scope``, ``docker-<id>.scope``)
  * either one nested under another prefix (kind, kubelet.slice, docker-in-docker).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SLURM_V1_JOB = re.compile(r"^uid_(\d+)$")
_JOB_COMPONENT = re.compile(r"^job_(\d+)$")
_STEP_COMPONENT = re.compile(r"^step_([A-Za-z0-9_]+)$")
_SLURMSTEPD_SCOPE = re.compile(r"^(?:[A-Za-z0-9._-]+_)?slurmstepd\.scope$")
_SLURM_V1_ROOT = re.compile(r"^slurm(?:_[A-Za-z0-9._-]+)?$")

_UID_BODY = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD_CGROUPFS = re.compile(rf"^pod({_UID_BODY})$")
_POD_SYSTEMD = re.compile(rf"^kubepods(?:-(?:burstable|besteffort|guaranteed))?-pod({_UID_BODY})\.slice$")
_CONTAINER = re.compile(r"^(?:(cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class CgroupIdentity:
    """What a cgroup path says about a process; every field may be missing."""

    slurm_job_id: str | None = None
    slurm_uid: int | None = None
    slurm_step: str | None = None
    pod_uid: str | None = None
    container_id: str | None = None
    container_runtime: str | None = None

    @property
    def empty(self) -> bool:
        return self.slurm_job_id is None and self.pod_uid is None


def cgroup_paths(text: str) -> list[str]:
    """The cgroup paths of a `/proc/<pid>/cgroup` file (`hierarchy:controllers:path` per line)."""
    paths = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            paths.append(parts[2])
    return paths


def _slurm_from_path(components: list[str]) -> tuple[str, int | None, str | None] | None:
    for i, comp in enumerate(components):
        uid: int | None = None
        if _SLURM_V1_ROOT.match(comp) and i + 2 < len(components):
            uid_match = _SLURM_V1_JOB.match(components[i + 1])
            job_match = _JOB_COMPONENT.match(components[i + 2])
            if uid_match and job_match:
                uid = int(uid_match.group(1))
                step = _STEP_COMPONENT.match(components[i + 3]) if i + 3 < len(components) else None
                return job_match.group(1), uid, step.group(1) if step else None
        if _SLURMSTEPD_SCOPE.match(comp) and i + 1 < len(components):
            job_match = _JOB_COMPONENT.match(components[i + 1])
            if job_match:
                step = _STEP_COMPONENT.match(components[i + 2]) if i + 2 < len(components) else None
                return job_match.group(1), None, step.group(1) if step else None
    return None


def _pod_from_path(components: list[str]) -> tuple[str, str | None, str | None] | None:
    if not any(comp.startswith("kubepods") for comp in components):
        return None
    for i, comp in enumerate(components):
        match = _POD_CGROUPFS.match(comp) or _POD_SYSTEMD.match(comp)
        if not match:
            continue
        uid = match.group(1).replace("_", "-")
        container_id = runtime = None
        if i + 1 < len(components):
            cmatch = _CONTAINER.match(components[i + 1])
            if cmatch:
                runtime, container_id = cmatch.group(1), cmatch.group(2)
        return uid, container_id, runtime
    return None


def parse_cgroup(text: str) -> CgroupIdentity:
    """Slurm job / Kubernetes pod identity found in any of the process's cgroup paths.

    The first path that names a Slurm job wins (v2 has one path; v1 repeats it per controller);
    the pod is taken from the first kubepods path. Unknown layouts give an empty identity.
    """
    slurm: tuple[str, int | None, str | None] | None = None
    pod: tuple[str, str | None, str | None] | None = None
    for path in cgroup_paths(text):
        components = [c for c in path.split("/") if c]
        if slurm is None:
            slurm = _slurm_from_path(components)
        if pod is None:
            pod = _pod_from_path(components)
        if slurm and pod:
            break
    return CgroupIdentity(
        slurm_job_id=slurm[0] if slurm else None,
        slurm_uid=slurm[1] if slurm else None,
        slurm_step=slurm[2] if slurm else None,
        pod_uid=pod[0] if pod else None,
        container_id=pod[1] if pod else None,
        container_runtime=pod[2] if pod else None,
    )
