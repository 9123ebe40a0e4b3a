"""Sharing: how GPUs are split between jobs with MIG, MPS and time-slicing.

MIG panels read the per-instance `gpu_mig_*` families (never the parent's device-wide values, which
would repeat once per instance); power is only ever shown per parent GPU, or as an explicit estimate
split by each instance's share of the SMs. MPS and time-slicing panels read the per-job families,
which the exporter aggregates from per-process data so they add up to the GPU.
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from gpulens.dashboards.common import (
    BYTES,
    COUNT,
    NONE,
    PERCENTUNIT,
    RATIO_HIGH,
    UID_SHARING,
    WATT,
    Layout,
    column_links,
    column_unit,
    dashboard,
    gpu_link,
    gpu_variable,
    job_link,
    node_variable,
    scope_variables,
    stat,
    table,
    timeseries,
)
from gpulens.dashboards.queries import sel

MIG_LEGEND = "GPU {{gpu}} GI {{gpu_instance}} {{mig_profile}}"
JOB_LEGEND = "GPU {{gpu}} job {{job_id}}"
SLOT = "instance, gpu, gpu_instance, mig_profile"
MIG_PARENTS = sel("gpu_info", 'mig_mode="enabled"')
MIG_SMS = sel("gpu_mig_multiprocessors")
TIME_SLICED = sel("gpu_job_info", 'sharing="time_slicing"')


def _jobs_with(sharing: str, metric: str) -> str:
    """Per-job `metric` restricted to jobs whose attribution says `sharing`."""
    info = sel("gpu_job_info", f'sharing="{sharing}"')
    return f"{sel(metric)} and on (instance, gpu, gpu_instance, job_id) {info}"


def _mig(layout: Layout) -> None:
    layout.row("MIG")
    layout.add(
        stat(
            "MIG GPUs",
            [(f"count({MIG_PARENTS})", "")],
            COUNT,
            no_value="0",
            description='GPUs with MIG mode enabled on the selected nodes (gpu_info mig_mode="enabled").',
        ),
        w=4,
        h=8,
    )
    layout.add(
        stat(
            "Instances by profile",
            [(f"count by (mig_profile) ({sel('gpu_mig_instance_info')})", "{{mig_profile}}")],
            COUNT,
            text_mode="value_and_name",
            description="GPU instances of each MIG profile on the selected GPUs.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        table(
            "MIG layout",
            [
                (f"max by ({SLOT}, compute_instance, mig_uuid) ({sel('gpu_mig_instance_info')})", ""),
                (f"max by ({SLOT}) ({sel('gpu_mig_multiprocessors')})", ""),
                (f"max by ({SLOT}) ({sel('gpu_mig_memory_total_bytes')})", ""),
                (f"max by ({SLOT}) ({sel('gpu_mig_memory_used_bytes')})", ""),
                (f"max by ({SLOT}) ({sel('gpu_mig_sm_active_ratio')})", ""),
                (f"max by ({SLOT}) ({sel('gpu_mig_processes')})", ""),
            ],
            NONE,
            merge=True,
            hide=("Time", "Value #A"),
            rename={
                "Value #B": "SMs",
                "Value #C": "memory",
                "Value #D": "memory used",
                "Value #E": "SM activity",
                "Value #F": "processes",
            },
            order=("instance", "gpu", "gpu_instance", "mig_profile", "compute_instance", "mig_uuid"),
            overrides=[
                column_links("gpu", gpu_link("${__data.fields.instance}", "${__data.fields.gpu}")),
                column_unit("memory", BYTES),
                column_unit("memory used", BYTES),
                column_unit("SM activity", PERCENTUNIT),
            ],
            description="One row per GPU instance: profile, size, memory and current activity.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "SM activity per instance",
            [(sel("gpu_mig_sm_active_ratio"), MIG_LEGEND)],
            PERCENTUNIT,
            description="Relative to the instance's own SMs (GPM MIG samples or DCGM GPU-instance fields).",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Tensor / DRAM active per instance",
            [
                (sel("gpu_mig_tensor_active_ratio"), MIG_LEGEND + " tensor"),
                (sel("gpu_mig_dram_active_ratio"), MIG_LEGEND + " dram"),
            ],
            PERCENTUNIT,
            description="Tensor core and DRAM activity of each MIG instance (gpu_mig_*; GPM on Hopper and "
            "later, or DCGM).",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Memory used per instance",
            [(sel("gpu_mig_memory_used_bytes"), MIG_LEGEND)],
            BYTES,
            description="Device memory used by each MIG instance (gpu_mig_memory_used_bytes).",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Memory used / instance memory",
            [(f"{sel('gpu_mig_memory_used_bytes')} / {sel('gpu_mig_memory_total_bytes')}", MIG_LEGEND)],
            PERCENTUNIT,
            thresholds=RATIO_HIGH,
            description="Memory used by each MIG instance as a share of that instance's own memory; orange "
            "at 80 %, red at 95 %.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Power of MIG GPUs (parent only)",
            [(f"{sel('gpu_power_watts')} and on (instance, gpu) {MIG_PARENTS}", "GPU {{gpu}}")],
            WATT,
            description="Board power is device-wide: it is read once per parent GPU and never repeated "
            "per instance, so summing it is correct.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Estimated power per instance (by SM share)",
            [
                (
                    f"{sel('gpu_power_watts')} * on (instance, gpu) group_right ()"
                    f" ({MIG_SMS} / on (instance, gpu) group_left () sum by (instance, gpu) ({MIG_SMS}))",
                    MIG_LEGEND,
                )
            ],
            WATT,
            stack=True,
            description="An attribution, not a measurement: the parent's power split by each instance's "
            "share of the instances' SMs. Stacked, the instances of a GPU add up to its power.",
        ),
        w=12,
        h=8,
    )


def _mps(layout: Layout) -> None:
    layout.row("MPS")
    layout.add(
        stat(
            "GPUs with an MPS server",
            [(f"count({sel('gpu_mps_server_active')} == 1)", "")],
            COUNT,
            no_value="0",
            description="GPUs on which an MPS control daemon serves clients (gpu_mps_server_active).",
        ),
        w=4,
        h=8,
    )
    layout.add(
        timeseries(
            "MPS clients per GPU",
            [
                (
                    f"{sel('gpu_mps_clients')} and on (instance, gpu) ({sel('gpu_mps_server_active')} == 1)",
                    "GPU {{gpu}}",
                )
            ],
            COUNT,
            description="Client processes of the MPS server on each GPU that runs one.",
        ),
        w=10,
        h=8,
    )
    layout.add(
        timeseries(
            "Memory per MPS job",
            [(_jobs_with("mps", "gpu_job_memory_used_bytes"), JOB_LEGEND)],
            BYTES,
            stack=True,
            links=[job_link()],
            description="Device memory used by each job's MPS client processes; stacked per GPU.",
        ),
        w=10,
        h=8,
    )
    layout.add(
        timeseries(
            "SM utilization per MPS job",
            [(_jobs_with("mps", "gpu_job_sm_utilization_ratio"), JOB_LEGEND)],
            PERCENTUNIT,
            stack=True,
            links=[job_link()],
            description="Per-job share of the GPU's SM time from NVML process utilization.",
        ),
        w=24,
        h=8,
    )


def _time_slicing(layout: Layout) -> None:
    layout.row("Time-slicing")
    layout.add(
        timeseries(
            "Time-sliced jobs per GPU",
            [
                (
                    f"count by (instance, gpu) ({TIME_SLICED})",
                    "GPU {{gpu}}",
                )
            ],
            COUNT,
            description="Jobs sharing each time-sliced GPU (several jobs on one GPU without MIG or MPS); "
            "each gets a slice of time, not of the GPU.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "SM utilization per time-sliced job",
            [(_jobs_with("time_slicing", "gpu_job_sm_utilization_ratio"), JOB_LEGEND)],
            PERCENTUNIT,
            stack=True,
            links=[job_link()],
            description="NVML's per-process SM utilization summed per job on time-sliced GPUs: each job's "
            "share of the time the GPU was busy.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "Memory per time-sliced job",
            [(_jobs_with("time_slicing", "gpu_job_memory_used_bytes"), JOB_LEGEND)],
            BYTES,
            stack=True,
            links=[job_link()],
            description="Device memory of each job on a time-sliced GPU; the jobs share the GPU's memory "
            "with no limit between them.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        table(
            "Jobs on shared GPUs",
            [(sel("gpu_job_info", 'sharing=~"mig|mps|time_slicing"'), "")],
            NONE,
            hide=("Time", "__name__", "job", "Value"),
            order=("job_id", "sharing", "instance", "gpu", "gpu_instance", "job_source", "job_user"),
            overrides=[
                column_links("job_id", job_link("${__data.fields.job_id}")),
                column_links("gpu", gpu_link("${__data.fields.instance}", "${__data.fields.gpu}")),
            ],
            description="Every job on a MIG, MPS or time-sliced GPU: its node, GPU, slot and sharing mode "
            "(gpu_job_info).",
        ),
        w=24,
        h=7,
    )


def build() -> Dashboard:
    layout = Layout()
    _mig(layout)
    _mps(layout)
    _time_slicing(layout)
    return dashboard(
        UID_SHARING,
        "gpulens: MIG layouts and per-instance usage, MPS clients, time-sliced jobs.",
        layout,
        [*scope_variables(), node_variable(), gpu_variable()],
        time_from="now-3h",
    )
