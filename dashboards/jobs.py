"""Jobs: one job's GPUs, how much of them it uses, and what the analyzer recommends for it.

Jobs are identified by the attribution label `job_id` (Slurm job, Kubernetes pod or mapping-file
entry). Capacity is the job's slot: the whole GPU, or the MIG instance it runs in, so "memory peak
vs capacity" answers whether a smaller slice would fit. The recommendation comes from the analyzer's
published `gpulens_recommendation_info{job_id, recommendation, mig_profile, ...} 1` series.
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from gpulens.dashboards.common import (
    BYTES,
    CLUSTER,
    COUNT,
    NONE,
    PERCENTUNIT,
    RATIO_HIGH,
    SCOPE,
    UID_JOBS,
    Layout,
    column_links,
    column_unit,
    dashboard,
    dashed_series,
    gpu_link,
    gpu_variable,
    job_variable,
    node_variable,
    scope_variables,
    stat,
    steps,
    table,
    timeseries,
)
from gpulens.dashboards.queries import sel

JOB = 'job_id="$job_id"'
SLOT = "instance, gpu, gpu_instance"
LEGEND = "{{instance}} GPU {{gpu}} {{gpu_instance}}"
# a job's GPUs are shown wherever they are in the selected clusters and scrape jobs, whatever node
# and GPU the variables say
ANYWHERE = SCOPE
# the analyzer's recommendations come from wherever its textfile is scraped (node_exporter's
# textfile collector, typically), not from a gpulens scrape job: only the cluster applies
RECOMMENDATIONS = CLUSTER

INFO = sel("gpu_job_info", JOB, base=ANYWHERE)
# recording rules (alerts/recording_rules.yml), one series per (device, job): a device is a whole GPU
# or the MIG instance the job runs in
OWN_SM = sel("instance_gpu_job:gpu_job_sm_utilization:ratio", JOB, base=ANYWHERE)
DEVICE_SM = sel("instance_gpu_job:gpu_sm_active:ratio", JOB, base=ANYWHERE)
MEMORY = sel("instance_gpu_job:gpu_job_memory_used_bytes:sum", JOB, base=ANYWHERE)
MEMORY_RATIO = sel("instance_gpu_job:gpu_job_memory_used:ratio", JOB, base=ANYWHERE)
CAPACITY = (
    f"max by ({SLOT}) (instance_device:gpu_memory_total_bytes:max"
    f" and on (instance, job, gpu, gpu_instance) {INFO})"
)
PEAK = f"max by ({SLOT}) (max_over_time({MEMORY}[$__range]))"
PEAK_RATIO = f"max by ({SLOT}) (max_over_time({MEMORY_RATIO}[$__range]))"
LOW_IS_BAD = steps("red", (0.1, "orange"), (0.5, "green"))


def _identity(layout: Layout) -> None:
    layout.row("Job $job_id")
    layout.add(
        stat(
            "GPU slots",
            [(f"count({INFO})", "")],
            COUNT,
            description="GPUs or MIG instances the job holds now.",
        ),
        w=4,
        h=5,
    )
    layout.add(
        stat(
            "Sharing mode",
            [(f"count by (sharing) ({INFO})", "{{sharing}}")],
            NONE,
            text_mode="name",
            description="exclusive, mig, mps or time_slicing, from the attribution.",
        ),
        w=4,
        h=5,
    )
    layout.add(
        stat(
            "Mean SM activity (time range)",
            [(f"avg(avg_over_time({OWN_SM}[$__range]))", "")],
            PERCENTUNIT,
            thresholds=LOW_IS_BAD,
            description="On MIG, relative to the job's instance; otherwise to the whole GPU.",
        ),
        w=4,
        h=5,
    )
    layout.add(
        stat(
            "Memory peak / capacity",
            [(f"max({PEAK_RATIO})", "")],
            PERCENTUNIT,
            thresholds=RATIO_HIGH,
            description="Highest memory used in the time range against the slot's memory (the GPU or "
            "the MIG instance). Low values mean a smaller MIG profile would fit.",
        ),
        w=4,
        h=5,
    )
    layout.add(
        table(
            "Latest recommendation",
            [
                (
                    "max by (job_id, recommendation, mig_profile, gpu_model, confidence_level) "
                    f"({sel('gpulens_recommendation_info', JOB, base=RECOMMENDATIONS)})",
                    "",
                ),
                (
                    "max by (job_id) ("
                    f"{sel('gpulens_recommendation_confidence', JOB, base=RECOMMENDATIONS)})",
                    "",
                ),
            ],
            NONE,
            merge=True,
            hide=("Time", "Value #A", "job_id"),
            rename={"Value #B": "confidence", "gpu_model": "for GPU model", "confidence_level": "level"},
            order=("recommendation", "mig_profile", "Value #B", "confidence_level", "gpu_model"),
            overrides=[column_unit("confidence", PERCENTUNIT)],
            description="From the analyzer (`gpulens recommend --textfile FILE`, exposed by node_exporter's "
            "textfile collector): exclusive, mps, mig (with the profile), time_slicing or reclaim. Empty "
            "until the analyzer has seen this job.",
        ),
        w=8,
        h=5,
    )
    layout.add(
        table(
            "GPUs of this job",
            [(INFO, "")],
            NONE,
            hide=("Time", "__name__", "job", "Value", "job_id"),
            order=("instance", "gpu", "gpu_instance", "uuid", "sharing", "job_source", "job_user"),
            overrides=[column_links("gpu", gpu_link("${__data.fields.instance}", "${__data.fields.gpu}"))],
            description="Click a GPU for its node detail.",
        ),
        w=24,
        h=6,
    )


def _usage(layout: Layout) -> None:
    layout.row("Usage")
    layout.add(
        timeseries(
            "SM activity",
            [(OWN_SM, LEGEND + " job"), (DEVICE_SM, LEGEND + " device")],
            PERCENTUNIT,
            thresholds=LOW_IS_BAD,
            links=[gpu_link()],
            description="Per device: the job's own processes' SM utilization, and the SM activity of the "
            "device it runs on (the same on exclusive GPUs and MIG; the whole GPU with MPS / time-slicing).",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Memory used vs capacity",
            [
                (MEMORY, LEGEND + " used"),
                (CAPACITY, LEGEND + " capacity"),
            ],
            BYTES,
            overrides=[dashed_series(".* capacity")],
            description="The job's device memory per slot against the memory of that slot (whole GPU or MIG"
            " instance, dashed).",
        ),
        w=12,
        h=8,
    )
    layout.add(
        table(
            "Memory peak per slot (time range)",
            [(PEAK, ""), (CAPACITY, ""), (PEAK_RATIO, "")],
            BYTES,
            merge=True,
            rename={"Value #A": "peak", "Value #B": "capacity", "Value #C": "peak / capacity"},
            order=("instance", "gpu", "gpu_instance"),
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "peak / capacity"},
                    "properties": [{"id": "unit", "value": PERCENTUNIT}],
                }
            ],
            description="The job's highest memory use over the time range per slot, the slot's capacity and"
            " the peak as a share of it: the figure a smaller slot must fit.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Processes",
            [(sel("gpu_job_processes", JOB, base=ANYWHERE), LEGEND)],
            COUNT,
            description="Processes of the job on each GPU or MIG instance (gpu_job_processes).",
        ),
        w=12,
        h=8,
    )


def build() -> Dashboard:
    layout = Layout()
    _identity(layout)
    _usage(layout)
    return dashboard(
        UID_JOBS,
        "gpulens: one job's GPUs, SM activity, memory against its slot and the rightsizing recommendation.",
        layout,
        [*scope_variables(), node_variable(), gpu_variable(), job_variable()],
        time_from="now-24h",
    )
