"""Per-job usage from the attribution engine: an identity series plus usage series per job.

Jobs are keyed by (GPU, GPU instance, job id). `gpu_instance` is empty on GPUs without MIG. The
values of `gpu_job_memory_used_bytes` on a GPU add up to the memory NVML reports for its processes.
`gpu_job_sm_utilization_ratio` is each job's share of the device's SM figure (attribution/shares.py)
and `gpu_job_sm_unattributed_ratio` the rest, so the two add up to `snapshot.sm_figure` of every GPU
(every MIG instance on a MIG GPU); the remainder is left out when attribution failed this sample.

With the collector on, the engine's own health comes with it: `gpulens_attribution_*` (deadline
misses) and, when a job mapping directory is read, `gpulens_job_mapping_*` (files by state, reads,
rejections by reason, refresh time). Their labels take fixed values only, whatever the directory
holds.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.exporter.attribution.mapping_dir import FileState, MappingStats, RejectReason
from gpulens.exporter.attribution.model import JobUsage
from gpulens.exporter.collectors.base import (
    GPU_LABELS,
    CollectorOptions,
    CollectorSpec,
    FamilySpec,
    Kind,
    Unit,
    counter,
    fresh,
    gauge,
    non_empty,
)
from gpulens.exporter.snapshot import Area, AttributionHealth, NodeSnapshot, sm_figure

USAGE_LABELS = [*GPU_LABELS, "gpu_instance", "job_id"]
_USAGE = tuple(USAGE_LABELS)
_PER_INSTANCE = "per instance"

# Every family is filled in code rather than by an accessor: the rows are jobs summed per device.
INFO = FamilySpec[JobUsage](
    "gpu_job_info",
    Kind.GAUGE,
    "A job running on the GPU or MIG instance, where its identity came from (job_name: the Slurm"
    " job's name) and how the GPU is shared; always 1.",
    "attribution of the sample's processes (procfs cgroups/environ, kubelet pod-resources, mapping files)",
    labels=(
        *GPU_LABELS,
        "gpu_instance",
        "job_id",
        "job_source",
        "job_user",
        "job_name",
        "job_namespace",
        "job_pod",
        "job_container",
        "sharing",
    ),
    unit=Unit.ALWAYS_ONE,
    mig="one per (GPU or instance, job)",
    label_doc="gpu_instance, job_id, job_source (`slurm`/`kubernetes`/`mapping`/`unknown`, `system` for"
    " the MPS server's own row with `job_id=\"mps_server\"`), job_user, job_name (Slurm's `SLURM_JOB_NAME`,"
    " one per job, capped at 128 characters; empty when unknown and on Kubernetes), job_namespace,"
    " job_pod, job_container, sharing (`exclusive`/`mig`/`mps`/`time_slicing`)",
)
MEMORY = FamilySpec[JobUsage](
    "gpu_job_memory_used_bytes",
    Kind.GAUGE,
    "GPU memory used by the job's processes (NVML per-process used memory, summed).",
    "per-process `usedGpuMemory` summed per job (MPS clients count for their own job)",
    labels=_USAGE,
    unit=Unit.BYTES,
    mig=_PER_INSTANCE,
)
SM = FamilySpec[JobUsage](
    "gpu_job_sm_utilization_ratio",
    Kind.GAUGE,
    "The job's share of the device's SM figure (gpu_sm_active_ratio, else gpu_utilization_ratio; on"
    " MIG gpu_mig_sm_active_ratio), split by the processes' NVML utilization.",
    "the job's share of the device's SM figure (gpu_sm_active_ratio where profiled, else"
    " gpu_utilization_ratio; per MIG instance gpu_mig_sm_active_ratio), split by per-process NVML"
    " utilization ([attribution.md](attribution.md#usage-values))",
    labels=_USAGE,
    unit=Unit.RATIO,
    mig=_PER_INSTANCE,
)
PROCESSES = FamilySpec[JobUsage](
    "gpu_job_processes",
    Kind.GAUGE,
    "Processes of the job on the GPU or MIG instance.",
    "processes of the job",
    labels=_USAGE,
    unit=Unit.PROCESSES,
    mig=_PER_INSTANCE,
)
UNATTRIBUTED = FamilySpec[JobUsage](
    "gpu_job_sm_unattributed_ratio",
    Kind.GAUGE,
    "The part of the device's SM figure no job's processes account for: with the jobs'"
    " gpu_job_sm_utilization_ratio it adds up to the figure.",
    "the part of the same figure no job accounts for: `sum by (gpu, uuid, gpu_instance)"
    " (gpu_job_sm_utilization_ratio) + gpu_job_sm_unattributed_ratio` is the figure",
    labels=(*GPU_LABELS, "gpu_instance"),
    unit=Unit.RATIO,
    mig=_PER_INSTANCE,
)
THREAD_CAP = FamilySpec[JobUsage](
    "gpu_job_mps_active_thread_ratio",
    Kind.GAUGE,
    "An MPS client job's effective active-thread limit: the share of the GPU's SMs its kernels may"
    " use, the lower of its own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and its MPS server's; absent where"
    " neither is known.",
    "per MPS client process, the lower of `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` in its environment and"
    " the percentage its MPS control daemon runs its server under (`--mps-control`); the largest of"
    " the job's processes",
    labels=_USAGE,
    unit=Unit.RATIO,
    mig="not on MIG (MPS on whole GPUs)",
)
DUTY_CYCLE = FamilySpec[JobUsage](
    "gpu_job_duty_cycle_ratio",
    Kind.GAUGE,
    "The fraction of the interval in which a kernel of the job's processes ran (NVML per-process"
    " utilization, summed, at most 1): the job's own gpu_utilization_ratio.",
    "per-process NVML utilization (`nvmlDeviceGetProcessUtilization` smUtil) summed per job, at"
    " most 1; under an MPS thread cap, `gpu_job_sm_utilization_ratio` near this x"
    " `gpu_job_mps_active_thread_ratio` says the cap held the job whenever it ran",
    labels=_USAGE,
    unit=Unit.RATIO,
    mig=_PER_INSTANCE,
)
FAMILIES: tuple[FamilySpec[JobUsage], ...] = (
    INFO, MEMORY, SM, PROCESSES, UNATTRIBUTED, THREAD_CAP, DUTY_CYCLE,
)  # fmt: skip


def collect(snapshot: NodeSnapshot, options: CollectorOptions) -> Iterator[Metric]:
    families = fresh(FAMILIES)
    info, mem, sm = families[INFO.name], families[MEMORY.name], families[SM.name]
    procs, unattributed = families[PROCESSES.name], families[UNATTRIBUTED.name]
    thread_cap, duty = families[THREAD_CAP.name], families[DUTY_CYCLE.name]
    duties: dict[tuple[str, ...], float] = {}
    usage: dict[tuple[str, ...], list[float | None]] = {}
    caps: dict[tuple[str, ...], float] = {}
    seen_info: set[tuple[str, ...]] = set()
    for job in snapshot.jobs:
        gi = "" if job.gpu_instance is None else str(job.gpu_instance)
        ident = job.identity
        info_labels = (
            str(job.gpu),
            job.uuid,
            gi,
            ident.job_id,
            ident.source,
            ident.user,
            ident.name,
            ident.namespace,
            ident.pod,
            ident.container,
            job.sharing,
        )
        if info_labels not in seen_info:
            seen_info.add(info_labels)
            info.add_metric(list(info_labels), 1.0)
        key: tuple[str, ...] = (str(job.gpu), job.uuid, gi, ident.job_id)
        row = usage.setdefault(key, [0.0, None, 0.0])
        row[0] = float(row[0] or 0) + job.memory_used_bytes
        if job.sm_utilization_ratio is not None:
            row[1] = min(1.0, float(row[1] or 0) + job.sm_utilization_ratio)
        row[2] = float(row[2] or 0) + job.processes
        if job.mps_thread_ratio is not None:
            caps[key] = max(caps.get(key, 0.0), job.mps_thread_ratio)
        if job.duty_cycle_ratio is not None:
            duties[key] = min(1.0, duties.get(key, 0.0) + job.duty_cycle_ratio)
    for key, (memory, ratio, count) in usage.items():
        labels = list(key)
        mem.add_metric(labels, float(memory or 0))
        if ratio is not None:
            sm.add_metric(labels, ratio)
        procs.add_metric(labels, float(count or 0))
        if key in caps:
            thread_cap.add_metric(labels, caps[key])
        if key in duties:
            duty.add_metric(labels, duties[key])
    shared: dict[tuple[str, str], float] = {}
    for (gpu, _uuid, gi, _job), (_mem, ratio, _count) in usage.items():
        shared[(gpu, gi)] = shared.get((gpu, gi), 0.0) + float(ratio or 0.0)
    for gpu_sample in snapshot.gpus if not snapshot.jobs_error else ():
        if not gpu_sample.up:
            continue
        device = gpu_sample.identity
        devices = [(str(m.gpu_instance), sm_figure(m)) for m in gpu_sample.mig_instances] or [
            ("", sm_figure(gpu_sample))
        ]
        for gi, figure in devices:
            if figure is not None:
                rest = max(0.0, min(figure, 1.0) - shared.get((str(device.index), gi), 0.0))
                unattributed.add_metric([str(device.index), device.uuid, gi], rest)
    yield from non_empty(*families.values())
    if snapshot.attribution is not None:
        yield from _health(snapshot.attribution)


def _health(health: AttributionHealth) -> Iterator[Metric]:
    misses = counter(
        "gpulens_attribution_deadline_misses_total",
        "Samples without job attribution because it ran past its deadline (the jobs collector"
        " fails in those samples).",
        [],
    )
    misses.add_metric([], float(health.deadline_misses))
    yield misses
    if health.mapping is not None:
        yield from _mapping(health.mapping)


def _mapping(stats: MappingStats) -> Iterator[Metric]:
    files = gauge(
        "gpulens_job_mapping_files",
        "Entries of the job mapping directory in its last refresh, by what became of them (pending:"
        " not read yet, the refresh's time budget ran out).",
        ["state"],
    )
    for state in FileState:
        files.add_metric([state.value], float(stats.files.get(state, 0)))
    limit = gauge(
        "gpulens_job_mapping_files_max",
        "Most entries of the job mapping directory read (--job-mapping-max-files).",
        [],
    )
    limit.add_metric([], float(stats.max_files))
    reads = counter("gpulens_job_mapping_reads_total", "Job mapping file versions read and parsed.", [])
    reads.add_metric([], float(stats.reads))
    rejected = counter(
        "gpulens_job_mapping_rejected_total",
        "Job mapping file versions skipped, by reason (one log line per file names it).",
        ["reason"],
    )
    for reason in RejectReason:
        rejected.add_metric([reason.value], float(stats.rejected.get(reason, 0)))
    duration = gauge(
        "gpulens_job_mapping_refresh_duration_seconds",
        "Seconds the last refresh of the job mapping directory took.",
        [],
    )
    duration.add_metric([], stats.refresh_seconds)
    yield from (files, limit, reads, rejected, duration)


SPEC = CollectorSpec(
    Area.JOBS,
    True,
    "per-job identity, memory, SM utilization and process count",
    collect,
    families=FAMILIES,
)
