"""Turn (process, identity) pairs into per-job usage for each GPU / MIG instance.

Kept apart from identity lookup so that the arithmetic rules (sums, sharing mode, caps) can be read
and tested on their own:

* memory of a job = sum of its processes' NVML used memory (None counts as 0);
* SM utilisation = the job's share of the device's SM figure (shares.py: its processes' per-process
  SM time over the device's busy time, times the device figure), so jobs plus the unattributed
  remainder add up to the device; None when no process of the job has a per-process figure; on a
  MIG instance owned by a single job, the instance's own SM activity; without a device figure, the
  sum of its processes' per-process SM ratios, capped at 1;
* under MPS, where any client's thread cap is known (its environment, its control daemon), the
  shares weigh each job by the SM activity its processes could add (time x cap,
  shares.capped_shares), so a client held to its cap is never measured above it; the job's cap is
  published with it;
* sharing per GPU / instance: `mig` on an instance, `mps` when MPS clients run, `time_slicing` when
  more than one job runs, else `exclusive` (the MPS server pseudo-job is not a job here);
* more than `max_jobs` jobs on one device: the smallest (by memory) are summed into `job_id="other"`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from gpulens.exporter.attribution.labels import sanitize_label_value
from gpulens.exporter.attribution.model import JobIdentity, JobUsage, ProcessKind, ProcessRef, SharingMode
from gpulens.exporter.attribution.shares import capped_shares, sm_shares
from gpulens.jobids import MPS_SERVER_JOB_ID

SOURCE_SYSTEM = "system"
SOURCE_UNKNOWN = "unknown"
SOURCE_OTHER = "other"
UNKNOWN_JOB = JobIdentity(job_id="unknown", source=SOURCE_UNKNOWN)
# its job id shared with the analyzer, which reads the row back (gpulens.jobids)
MPS_SERVER_JOB = JobIdentity(job_id=MPS_SERVER_JOB_ID, source=SOURCE_SYSTEM)
OTHER_JOB_ID = "other"

#: When one job id was found by several sources, the identity shown comes from the strongest.
SOURCE_RANK = {
    "slurm": 0,
    "kubernetes": 1,
    "mapping": 2,
    SOURCE_SYSTEM: 3,
    SOURCE_OTHER: 4,
    SOURCE_UNKNOWN: 5,
}


@dataclass
class _JobAccumulator:
    identities: list[JobIdentity] = field(default_factory=list)
    memory: int = 0
    sm_values: list[float] = field(default_factory=list)
    processes: int = 0
    mps_clients: int = 0
    capacity: float = 0.0  # per-process SM time x the process's thread cap (1 without one)
    caps: list[float] = field(default_factory=list)  # the known thread caps of its processes

    def add(self, proc: ProcessRef, identity: JobIdentity, cap: float | None = None) -> None:
        self.identities.append(identity)
        self.memory += proc.used_memory_bytes or 0
        if proc.sm_util_ratio is not None:
            value = min(max(proc.sm_util_ratio, 0.0), 1.0)
            self.sm_values.append(value)
            self.capacity += value * (1.0 if cap is None else cap)
        if cap is not None:
            self.caps.append(cap)
        self.processes += 1
        self.mps_clients += proc.kind is ProcessKind.MPS_CLIENT

    def absorb(self, other: _JobAccumulator) -> None:
        self.identities.extend(other.identities)
        self.memory += other.memory
        self.sm_values.extend(other.sm_values)
        self.processes += other.processes
        self.mps_clients += other.mps_clients
        self.capacity += other.capacity
        self.caps.extend(other.caps)

    def sm_capacity(self) -> float | None:
        """The SM activity the job's processes could have added (None without a per-process figure)."""
        return self.capacity if self.sm_values else None

    def thread_cap(self) -> float | None:
        """The job's MPS thread cap: the largest of its processes' own (None when none has one)."""
        return max(self.caps) if self.caps else None

    def sm_ratio(self) -> float | None:
        return min(sum(self.sm_values), 1.0) if self.sm_values else None

    def sm_weight(self) -> float | None:
        """The job's summed per-process SM time (uncapped), None when no process reports one."""
        return sum(self.sm_values) if self.sm_values else None


def _merge_field(values: Sequence[str]) -> str:
    distinct = sorted({v for v in values if v})
    return sanitize_label_value(",".join(distinct))


def merge_identities(identities: Sequence[JobIdentity]) -> JobIdentity:
    """One identity for processes sharing a job id: strongest source, fields joined when they differ."""
    first = identities[0]
    if all(i == first for i in identities):
        return first
    source = min((i.source for i in identities), key=lambda s: SOURCE_RANK.get(s, len(SOURCE_RANK)))
    return JobIdentity(
        job_id=identities[0].job_id,
        source=source,
        user=_merge_field([i.user for i in identities]),
        namespace=_merge_field([i.namespace for i in identities]),
        pod=_merge_field([i.pod for i in identities]),
        container=_merge_field([i.container for i in identities]),
        # one name per job, whatever its steps say (`srun -J` renames a step): the workload the
        # analyzer follows must not change with which processes happen to run
        name=min((i.name for i in identities if i.name), default=""),
        uid=next((i.uid for i in identities if i.uid is not None), None),
    )


def sharing_mode(
    gpu_instance: int | None, jobs: Mapping[str, _JobAccumulator], identities: Mapping[str, JobIdentity]
) -> SharingMode:
    if gpu_instance is not None:
        return SharingMode.MIG
    if any(acc.mps_clients for acc in jobs.values()):
        return SharingMode.MPS
    real_jobs = [job_id for job_id in jobs if identities[job_id].source != SOURCE_SYSTEM]
    return SharingMode.TIME_SLICING if len(real_jobs) > 1 else SharingMode.EXCLUSIVE


@dataclass(frozen=True)
class DeviceOverflow:
    """Reported back so the caller can log that a device hit the job cap."""

    gpu: int
    gpu_instance: int | None
    jobs: int
    aggregated: int


def _cap(jobs: dict[str, _JobAccumulator], max_jobs: int) -> tuple[dict[str, _JobAccumulator], int]:
    if len(jobs) <= max_jobs:
        return jobs, 0
    ranked = sorted(jobs.items(), key=lambda item: (-item[1].memory, -item[1].processes, item[0]))
    kept = dict(ranked[: max_jobs - 1])
    other = _JobAccumulator()
    for _, acc in ranked[max_jobs - 1 :]:
        other.absorb(acc)
    if OTHER_JOB_ID in kept:  # a job really named "other" joins the overflow row rather than vanish
        other.absorb(kept.pop(OTHER_JOB_ID))
    other.identities = [JobIdentity(job_id=OTHER_JOB_ID, source=SOURCE_OTHER)]
    kept[OTHER_JOB_ID] = other
    return kept, len(ranked) - (max_jobs - 1)


def aggregate(
    pairs: Sequence[tuple[ProcessRef, JobIdentity]],
    instance_sm_active: Mapping[tuple[int, int | None], float],
    max_jobs: int,
    device_duty: Mapping[int, float] | None = None,
    thread_caps: Mapping[int, float] | None = None,
    sm_activity: Collection[int] = (),
) -> tuple[list[JobUsage], list[DeviceOverflow]]:
    """Per (GPU, GPU instance, job) usage, sorted by GPU, instance, job id.

    `instance_sm_active[(gpu, gi)]` is the device's SM figure (a GPU's SM activity, else its
    utilization; an instance's SM activity) that the jobs' SM shares divide; `device_duty[gpu]` the
    GPU's NVML utilization, the scale of the per-process figures (shares.py); `thread_caps[pid]` an
    MPS client's active-thread limit (a ratio), where it is known; `sm_activity`
    the GPUs whose figure is SM activity (GPM / DCGM) rather than NVML utilization: only that
    figure is on the scale a thread cap limits (shares.py)."""
    duty = device_duty or {}
    caps = thread_caps or {}
    devices: dict[tuple[int, int | None], dict[str, _JobAccumulator]] = {}
    uuids: dict[int, str] = {}
    for proc, identity in pairs:
        uuids.setdefault(proc.gpu, proc.uuid)
        jobs = devices.setdefault((proc.gpu, proc.gpu_instance), {})
        jobs.setdefault(identity.job_id, _JobAccumulator()).add(proc, identity, caps.get(proc.pid))
    usages: list[JobUsage] = []
    overflows: list[DeviceOverflow] = []
    for (gpu, gi), jobs in sorted(
        devices.items(), key=lambda item: (item[0][0], -1 if item[0][1] is None else item[0][1])
    ):
        identities = {job_id: merge_identities(acc.identities) for job_id, acc in jobs.items()}
        sharing = sharing_mode(gi, jobs, identities)
        capped, aggregated = _cap(jobs, max_jobs)
        if aggregated:
            overflows.append(DeviceOverflow(gpu, gi, len(jobs), aggregated))
            identities[OTHER_JOB_ID] = merge_identities(capped[OTHER_JOB_ID].identities)
        owners = [job_id for job_id, ident in identities.items() if ident.source != SOURCE_SYSTEM]
        instance_value = instance_sm_active.get((gpu, gi)) if gi is not None and len(owners) == 1 else None
        figure = instance_sm_active.get((gpu, gi))
        shares = None
        if figure is not None and instance_value is None:  # a lone MIG owner takes the instance's figure
            if sharing is SharingMode.MPS and gpu in sm_activity and any(acc.caps for acc in capped.values()):
                shares = capped_shares({job_id: acc.sm_capacity() for job_id, acc in capped.items()}, figure)
            else:
                weights = {job_id: acc.sm_weight() for job_id, acc in capped.items()}
                shares = sm_shares(weights, figure, duty.get(gpu) if gi is None else None)
        for job_id in sorted(capped):
            acc, identity = capped[job_id], identities[job_id]
            sm = acc.sm_ratio() if shares is None else shares[job_id]
            if instance_value is not None:
                sm = min(max(float(instance_value), 0.0), 1.0) if identity.source != SOURCE_SYSTEM else None
            usages.append(
                JobUsage(
                    gpu=gpu,
                    uuid=uuids[gpu],
                    gpu_instance=gi,
                    identity=identity,
                    sharing=sharing,
                    memory_used_bytes=acc.memory,
                    sm_utilization_ratio=sm,
                    processes=acc.processes,
                    mps_thread_ratio=acc.thread_cap() if sharing is SharingMode.MPS else None,
                    duty_cycle_ratio=acc.sm_ratio(),
                )
            )
    return usages, overflows
