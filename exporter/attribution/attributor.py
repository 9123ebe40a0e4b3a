"""Who owns each GPU process, and how much each job uses: the exporter's entry point.

Identity precedence for one process (first that answers wins; see docs/attribution.md):

1. MPS server processes are the `mps_server` pseudo-job (source `system`): their memory is the
   server's, not any client job's.
2. The process itself, via procfs: a Slurm job from its cgroup path or `SLURM_JOB_ID` env, else a
   Kubernetes pod from its kubepods cgroup (names from the kubelet's log directories).
3. The kubelet pod-resources API: the pod the process's MIG device / GPU is allocated to, by the
   device plugin or through a DRA ResourceClaim, when that device is allocated to exactly one pod
   (with time-slicing replicas or a shared ResourceClaim several pods share a GPU and the device
   alone cannot tell them apart).
4. Job mapping files: the most specific file (MIG UUID, `<gpu>.<gi>`, GPU UUID, `<gpu>`); with several
   jobs listed, the one whose uid owns the process (jobstats format), else undecided.
5. `job_id="unknown"`, source `unknown`: counted, never dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from types import MappingProxyType

from gpulens.exporter.attribution.aggregate import (
    MPS_SERVER_JOB,
    SOURCE_OTHER,
    SOURCE_SYSTEM,
    SOURCE_UNKNOWN,
    UNKNOWN_JOB,
    aggregate,
)
from gpulens.exporter.attribution.kubernetes import (
    SOURCE_KUBERNETES,
    PodDirectory,
    kubernetes_identity,
    pod_job_id,
)
from gpulens.exporter.attribution.labels import sanitize_label_value
from gpulens.exporter.attribution.logonce import LogOnce
from gpulens.exporter.attribution.mapping_dir import (
    MappingDirectory,
    MappingEntry,
    MappingKey,
    MappingStats,
)
from gpulens.exporter.attribution.model import (
    AttributionConfig,
    DeviceHolder,
    DeviceRef,
    JobIdentity,
    JobUsage,
    ProcessKind,
    ProcessRef,
)
from gpulens.exporter.attribution.mps_control import DEFAULT_PIPE_DIRECTORY, MpsControl
from gpulens.exporter.attribution.pod_resources import PodContainer, PodResourcesClient
from gpulens.exporter.attribution.procfs import EnvironRead, ProcessInfo, ProcfsReader
from gpulens.exporter.attribution.resourceslices import ResourceSlices
from gpulens.exporter.attribution.slurm import SOURCE_SLURM, UserNames, slurm_identity

SOURCE_MAPPING = "mapping"
_EMPTY: Mapping[tuple[int, int | None], float] = MappingProxyType({})
_KIND_RANK = {
    ProcessKind.MPS_SERVER: 0,
    ProcessKind.MPS_CLIENT: 1,
    ProcessKind.COMPUTE: 2,
    ProcessKind.GRAPHICS: 3,
}


def dedupe_processes(processes: Sequence[ProcessRef]) -> list[ProcessRef]:
    """One entry per (pid, GPU, instance): NVML lists a process with compute and graphics contexts
    in both lists with the same memory, which must be counted once."""
    chosen: dict[tuple[int, int, int | None], ProcessRef] = {}
    for proc in processes:
        key = (proc.pid, proc.gpu, proc.gpu_instance)
        seen = chosen.get(key)
        if seen is None:
            chosen[key] = proc
            continue
        memories = [m for m in (seen.used_memory_bytes, proc.used_memory_bytes) if m is not None]
        sms = [s for s in (seen.sm_util_ratio, proc.sm_util_ratio) if s is not None]
        best = min(seen, proc, key=lambda p: _KIND_RANK.get(p.kind, len(_KIND_RANK)))
        chosen[key] = ProcessRef(
            pid=best.pid,
            gpu=best.gpu,
            uuid=best.uuid,
            gpu_instance=best.gpu_instance,
            mig_uuid=best.mig_uuid or seen.mig_uuid or proc.mig_uuid,
            kind=best.kind,
            used_memory_bytes=max(memories) if memories else None,
            sm_util_ratio=max(sms) if sms else None,
        )
    return list(chosen.values())


# identity (with its uid, which is not part of JobIdentity's equality) -> its sanitized copy: the same
# few hundred identities come back every sample; cleared when it grows past the limit
_SANITIZED: dict[tuple[JobIdentity, int | None], JobIdentity] = {}
_SANITIZED_LIMIT = 4096


def _sanitized(identity: JobIdentity) -> JobIdentity:
    key = (identity, identity.uid)
    clean = _SANITIZED.get(key)
    if clean is None:
        if len(_SANITIZED) >= _SANITIZED_LIMIT:
            _SANITIZED.clear()
        clean = _SANITIZED[key] = _sanitize(identity)
    return clean


def _sanitize(identity: JobIdentity) -> JobIdentity:
    job_id = sanitize_label_value(identity.job_id)
    if not job_id:
        return UNKNOWN_JOB
    return JobIdentity(
        job_id=job_id,
        source=identity.source,
        user=sanitize_label_value(identity.user),
        namespace=sanitize_label_value(identity.namespace),
        pod=sanitize_label_value(identity.pod),
        container=sanitize_label_value(identity.container),
        name=sanitize_label_value(identity.name),
        uid=identity.uid,
    )


class Attributor:
    """Maps NVML processes to jobs and sums their usage per GPU / MIG instance, once per sample.

    Not thread-safe: the exporter's sampler calls `attribute` from its one sampling thread.
    """

    def __init__(
        self,
        config: AttributionConfig,
        logger: logging.Logger | None = None,
        max_jobs_per_device: int = 64,
        pods_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`pods_clock` times the refreshes of the kubelet's pod directory listing: a simulated node's
        clock under `gpulens simulate`, where a sample is minutes of node time but milliseconds of
        real time, so a pod started mid-run is named at its next sample, not by its UID all run."""
        self._config = config
        self._logger = logger or logging.getLogger("gpulens.exporter.attribution")
        self._log = LogOnce(self._logger)
        self._max_jobs = max(2, max_jobs_per_device)
        self._users = UserNames()
        # pid -> (the procfs facts it was identified from, its sanitized Slurm job): a Slurm identity
        # depends only on those facts (cgroup, environment, uid -> user name), which the procfs cache
        # keeps for its TTL, so ~200 processes per `large` sample skip the lookup and the sanitizing
        self._slurm_jobs: dict[int, tuple[ProcessInfo, JobIdentity]] = {}
        self._procfs = ProcfsReader(config.procfs_root, self._log) if config.enable_procfs else None
        self._pods = PodDirectory(config.pod_logs_dir, clock=pods_clock) if config.enable_procfs else None
        self._mps = (
            MpsControl(
                config.mps_control,
                config.procfs_root,
                self._log,
                timeout_s=config.mps_control_timeout_seconds,
                fallback_pipe_dir=config.mps_pipe_dir,
            )
            if config.enable_procfs and config.mps_control
            else None
        )
        slices = (
            ResourceSlices(config.kube_api, config.node_name, self._log)
            if config.kube_api is not None and config.node_name
            else None
        )
        self._pod_resources = (
            PodResourcesClient(config.pod_resources_socket, self._log, uuids=slices)
            if config.enable_pod_resources and config.pod_resources_socket is not None
            else None
        )
        self._mapping = (
            MappingDirectory(
                config.job_mapping_dir,
                # its own bounded table: a directory full of junk must not use up the room the
                # other sources' warnings (kubelet, procfs, job cap) need
                LogOnce(self._logger),
                max_files=config.mapping_max_files,
                budget=config.mapping_budget_seconds,
            )
            if config.enable_mapping and config.job_mapping_dir is not None
            else None
        )
        self._mapping_fresh = False  # `attribute` refreshed the directory and `holders` did not yet use it

    # -- identity sources ------------------------------------------------------------------

    def _from_procfs(self, info: ProcessInfo) -> JobIdentity | None:
        identity = slurm_identity(info, self._users)
        if identity is None and self._pods is not None:
            identity = kubernetes_identity(info, self._pods)
        return identity

    @staticmethod
    def _from_pod_resources(
        proc: ProcessRef, devices: Mapping[str, tuple[PodContainer, ...]]
    ) -> JobIdentity | None:
        containers = (devices.get(proc.mig_uuid) if proc.mig_uuid else None) or devices.get(proc.uuid)
        if not containers:
            return None
        pods = {(c.namespace, c.pod) for c in containers}
        if len(pods) != 1:
            return None  # several pods share the device (replicas): the device cannot tell them apart
        namespace, pod = next(iter(pods))
        names = sorted({c.container for c in containers if c.container})
        return JobIdentity(
            job_id=pod_job_id(namespace, pod),
            source=SOURCE_KUBERNETES,
            namespace=namespace,
            pod=pod,
            container=",".join(names),
        )

    def _from_mapping(
        self, proc: ProcessRef, uid: int | None, entries: Mapping[MappingKey, tuple[MappingEntry, ...]]
    ) -> JobIdentity | None:
        candidates: tuple[MappingEntry, ...] = ()
        for key in (
            MappingKey(uuid=proc.mig_uuid) if proc.mig_uuid else None,
            MappingKey(gpu=proc.gpu, gpu_instance=proc.gpu_instance)
            if proc.gpu_instance is not None
            else None,
            MappingKey(uuid=proc.uuid),
            MappingKey(gpu=proc.gpu),
        ):
            if key is not None and entries.get(key):
                candidates = entries[key]
                break
        if not candidates:
            return None
        if len({e.job_id for e in candidates}) > 1 and uid is not None:
            owned = tuple(e for e in candidates if e.uid == uid)
            candidates = owned or candidates
        jobs = {e.job_id for e in candidates}
        if len(jobs) != 1:
            return None  # several jobs listed for this device and nothing says which owns the process
        entry = candidates[0]
        owner = entry.uid if entry.uid is not None else None
        return JobIdentity(
            job_id=entry.job_id,
            source=SOURCE_MAPPING,
            user=self._users.name(owner) if owner is not None else "",
            uid=owner,
        )

    @staticmethod
    def _mapping_entries(
        device: DeviceRef, entries: Mapping[MappingKey, tuple[MappingEntry, ...]]
    ) -> tuple[MappingEntry, ...]:
        """The most specific mapping file's entries for a device (MIG UUID, `<gpu>.<gi>`, GPU UUID,
        `<gpu>`); a MIG instance never falls back to its parent's files, which name the GPU's job."""
        if device.gpu_instance is not None:
            keys = [MappingKey(uuid=device.mig_uuid) if device.mig_uuid else None]
            keys.append(MappingKey(gpu=device.gpu, gpu_instance=device.gpu_instance))
        else:
            keys = [MappingKey(uuid=device.uuid), MappingKey(gpu=device.gpu)]
        for key in keys:
            if key is not None and entries.get(key):
                return entries[key]
        return ()

    def _thread_cap(self, proc: ProcessRef, info: ProcessInfo, servers: Sequence[int]) -> float | None:
        """An MPS client's active-thread limit: the lower of its own environment's and its server's
        (the daemon's), either where only one is known; None when neither is."""
        daemon = None
        if self._mps is not None and info.environ is not EnvironRead.NO_ENTRY:  # exited: none to ask
            # the pipe directory in the client's own view; unknown (None) where environ was unreadable
            pipe_dir = (
                (info.mps_pipe_dir or DEFAULT_PIPE_DIRECTORY) if info.environ is EnvironRead.READ else None
            )
            daemon = self._mps.thread_ratio(proc.pid, pipe_dir, servers, info.uid)
        known = [c for c in (info.mps_thread_ratio, daemon) if c is not None]
        return min(known) if known else None

    # -- the sample ------------------------------------------------------------------------

    def attribute(
        self,
        processes: Sequence[ProcessRef],
        instance_sm_active: Mapping[tuple[int, int | None], float] = _EMPTY,
        device_duty: Mapping[int, float] | None = None,
        sm_activity: Collection[int] = (),
    ) -> list[JobUsage]:
        """Per-job usage for this sample's processes (jobs with no process left are simply absent);
        `sm_activity`: the GPUs whose figure in `instance_sm_active` is SM activity (aggregate.py)."""
        unique = dedupe_processes(processes)
        if self._procfs is not None:
            self._procfs.retain(p.pid for p in unique)
        devices: Mapping[str, tuple[PodContainer, ...]] | None = None
        mapping: Mapping[MappingKey, tuple[MappingEntry, ...]] | None = None
        if self._mapping is not None:
            mapping = self._mapping.refresh()  # bounded (mapping_dir.py); bad files reported promptly
            self._mapping_fresh = True
        pairs: list[tuple[ProcessRef, JobIdentity]] = []
        thread_caps: dict[int, float] = {}  # MPS clients' known active-thread limits, by pid
        servers: dict[int, list[int]] = {}  # GPU -> its MPS servers' pids (to find a client's)
        for proc in unique:
            if proc.kind is ProcessKind.MPS_SERVER:
                servers.setdefault(proc.gpu, []).append(proc.pid)
        if self._mps is not None:
            self._mps.start_sample({pid for pids in servers.values() for pid in pids})
        missing_memory: set[int] = set()
        # pids that left are forgotten (the procfs cache drops them too)
        alive = {p.pid for p in unique}
        slurm_jobs = self._slurm_jobs = {
            pid: known for pid, known in self._slurm_jobs.items() if pid in alive
        }
        for proc in unique:
            if proc.used_memory_bytes is None:
                missing_memory.add(proc.gpu)
            if proc.kind is ProcessKind.MPS_SERVER:
                pairs.append((proc, MPS_SERVER_JOB))
                continue
            info = self._procfs.read(proc.pid) if self._procfs is not None else ProcessInfo()
            if proc.kind is ProcessKind.MPS_CLIENT:
                cap = self._thread_cap(proc, info, servers.get(proc.gpu, ()))
                if cap is not None:
                    thread_caps[proc.pid] = cap
            known = slurm_jobs.get(proc.pid)
            if known is not None and known[0] is info:  # procfs gave the same facts as last sample
                pairs.append((proc, known[1]))
                continue
            identity = self._from_procfs(info)
            from_slurm = identity is not None and identity.source == SOURCE_SLURM
            if identity is None and self._pod_resources is not None:
                if devices is None:
                    devices = self._pod_resources.devices()
                identity = self._from_pod_resources(proc, devices)
            if identity is None and mapping:
                identity = self._from_mapping(proc, info.uid, mapping)
            clean = _sanitized(identity) if identity is not None else UNKNOWN_JOB
            if from_slurm:
                slurm_jobs[proc.pid] = (info, clean)
            pairs.append((proc, clean))
        for gpu in sorted(missing_memory):
            self._log.info(
                ("memory-missing", gpu),
                "attribution: NVML reports no used memory for some processes on GPU %d; "
                "they count as 0 bytes",
                gpu,
            )
        usages, overflows = aggregate(
            pairs, instance_sm_active, self._max_jobs, device_duty, thread_caps, sm_activity
        )
        for overflow in overflows:
            where = f"GPU {overflow.gpu}" + (
                f" instance {overflow.gpu_instance}" if overflow.gpu_instance is not None else ""
            )
            self._log.warning(
                ("job-cap", overflow.gpu, overflow.gpu_instance),
                'attribution: %d jobs on %s exceed the cap of %d; %d of them are summed into job_id="other"',
                overflow.jobs,
                where,
                self._max_jobs,
                overflow.aggregated,
            )
        return usages

    def holders(self, devices: Sequence[DeviceRef], usages: Sequence[JobUsage]) -> list[DeviceHolder]:
        """Who holds each device this sample, from every source that knows (the caller picks):
        the pods the kubelet allocated it to, the jobs its mapping file names, and the jobs whose
        processes run on it (`usages` of this sample). Sources that are off or unreachable add
        nothing; the kubelet answer is the cached one `attribute` uses."""
        found: list[DeviceHolder] = []
        allocations = self._pod_resources.devices() if self._pod_resources is not None else {}
        mapping: Mapping[MappingKey, tuple[MappingEntry, ...]] = {}
        if self._mapping is not None:  # this sample's refresh when `attribute` just ran
            mapping = self._mapping.entries if self._mapping_fresh else self._mapping.refresh()
            self._mapping_fresh = False
        for device in devices:
            key = device.mig_uuid if device.gpu_instance is not None else device.uuid
            for c in allocations.get(key or "", ()):
                identity = JobIdentity(
                    job_id=pod_job_id(c.namespace, c.pod),
                    source=SOURCE_KUBERNETES,
                    namespace=c.namespace,
                    pod=c.pod,
                    container=c.container,
                )
                found.append(
                    DeviceHolder(device.gpu, device.gpu_instance, _sanitized(identity), "pod_resources")
                )
            for entry in self._mapping_entries(device, mapping):
                identity = JobIdentity(
                    job_id=entry.job_id,
                    source=SOURCE_MAPPING,
                    user=self._users.name(entry.uid) if entry.uid is not None else "",
                    uid=entry.uid,
                )
                found.append(DeviceHolder(device.gpu, device.gpu_instance, _sanitized(identity), "mapping"))
        for usage in usages:
            if usage.identity.source not in (SOURCE_SYSTEM, SOURCE_UNKNOWN, SOURCE_OTHER):
                found.append(DeviceHolder(usage.gpu, usage.gpu_instance, usage.identity, "process"))
        return found

    def mapping_stats(self) -> MappingStats | None:
        """The mapping directory as of its last refresh (None when that source is off); safe to
        call from another thread (an immutable record swapped in after each refresh)."""
        return self._mapping.stats if self._mapping is not None else None

    def mapping_listed(self) -> int:
        """Entries of the mapping directory being worked on (known before its files are read)."""
        return self._mapping.listed if self._mapping is not None else 0

    def close(self) -> None:
        """Release the kubelet gRPC channel."""
        if self._pod_resources is not None:
            self._pod_resources.close()
