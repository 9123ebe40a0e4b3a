"""Kubernetes pod identity of a process without talking to the API server.

The cgroup gives the pod UID and container id; the kubelet's log directories give the names:
`/var/log/pods/<namespace>_<pod>_<uid>/<container>/` and the CRI symlinks
`/var/log/containers/<pod>_<namespace>_<container>-<container id>.log` (a sibling of the pods
dir). Namespace, pod and container names are DNS labels and never contain `_`, so splitting on `_`
is unambiguous. Listings are cached and refreshed on a miss at most once per `min_refresh_s`, so a
new pod is named within a sample or two and the directory is not re-listed for every process.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpulens.exporter.attribution.model import JobIdentity
from gpulens.exporter.attribution.procfs import ProcessInfo

SOURCE_KUBERNETES = "kubernetes"
_CONTAINER_LOG = re.compile(r"^([^_]+)_([^_]+)_(.+)-([0-9a-f]{64})\.log$")


@dataclass(frozen=True)
class PodName:
    namespace: str
    pod: str
    containers: tuple[str, ...] = ()


def pod_job_id(namespace: str, pod: str) -> str:
    """The job id of a pod: `<namespace>/<pod>` (the same whichever source found the pod)."""
    return f"{namespace}/{pod}"


class PodDirectory:
    """Pod UID -> names and container id -> container name from kubelet log directory names."""

    def __init__(
        self,
        pod_logs_dir: Path,
        min_refresh_s: float = 2.0,
        max_age_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pods_dir = pod_logs_dir
        self._containers_dir = pod_logs_dir.parent / "containers"
        self._min_refresh_s = min_refresh_s
        self._max_age_s = max_age_s
        self._clock = clock
        self._pods: dict[str, PodName] = {}
        self._container_names: dict[str, str] = {}
        self._loaded_at: float | None = None

    def _refresh(self) -> None:
        pods: dict[str, PodName] = {}
        try:
            entries = list(os.scandir(self._pods_dir))
        except OSError:
            entries = []
        for entry in entries:
            parts = entry.name.split("_")
            if len(parts) != 3 or not all(parts):
                continue
            try:
                containers = tuple(sorted(e.name for e in os.scandir(entry.path) if e.is_dir()))
            except OSError:
                containers = ()
            pods[parts[2]] = PodName(namespace=parts[0], pod=parts[1], containers=containers)
        names: dict[str, str] = {}
        try:
            log_names = os.listdir(self._containers_dir)
        except OSError:
            log_names = []
        for name in log_names:
            match = _CONTAINER_LOG.match(name)
            if match:
                names[match.group(4)] = match.group(3)
        self._pods, self._container_names = pods, names
        self._loaded_at = self._clock()

    def _maybe_refresh(self, miss: bool) -> None:
        now = self._clock()
        if (
            self._loaded_at is None
            or (miss and now - self._loaded_at >= self._min_refresh_s)
            or now - self._loaded_at >= self._max_age_s
        ):
            self._refresh()

    def pod(self, uid: str) -> PodName | None:
        self._maybe_refresh(miss=False)
        if uid not in self._pods:
            self._maybe_refresh(miss=True)
        return self._pods.get(uid)

    def container(self, container_id: str, pod: PodName) -> str:
        """Container name from the CRI log symlink, else the pod's only container, else ''."""
        name = self._container_names.get(container_id)
        if name is None and len(pod.containers) != 1:
            self._maybe_refresh(miss=True)
            name = self._container_names.get(container_id)
        if name is None and len(pod.containers) == 1:
            name = pod.containers[0]
        return name or ""


def kubernetes_identity(info: ProcessInfo, pods: PodDirectory) -> JobIdentity | None:
    """The process's pod, or None when its cgroup is not a kubepods one.

    Without a log directory for the pod the job id is the pod UID (still unique and joinable).
    """
    uid = info.cgroup.pod_uid
    if uid is None:
        return None
    name = pods.pod(uid)
    if name is None:
        return JobIdentity(job_id=uid, source=SOURCE_KUBERNETES)
    container = pods.container(info.cgroup.container_id, name) if info.cgroup.container_id else ""
    if not container and len(name.containers) == 1:
        container = name.containers[0]
    return JobIdentity(
        job_id=pod_job_id(name.namespace, name.pod),
        source=SOURCE_KUBERNETES,
        namespace=name.namespace,
        pod=name.pod,
        container=container,
    )
