"""Fleet overview: how many GPUs are busy, idle, broken or shared, and where the waste is.

The entry point for an SRE: state counts, activity and memory heat maps across every GPU, idle
GPU-hours and the jobs that hold GPUs without using them, open critical alerts and Xids by code,
and the fleet's health: fault rate per 1,000 GPU-days, recovery time and isolated nodes (from the
`gpulens remediate` receiver), the nodes and GPU models that fail most. Every node and job links
to its detail dashboard.
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from gpulens.dashboards import queries as q
from gpulens.dashboards.common import (
    ANY_IS_BAD,
    BYTES,
    CLUSTER,
    COUNT,
    CRITICAL_XID_REGEX,
    HOURS,
    IDLE_LOW,
    NONE,
    PERCENTUNIT,
    SCOPE,
    SECONDS,
    UID_FLEET,
    WATT,
    Layout,
    column_links,
    column_unit,
    dashboard,
    gpu_link,
    gpu_variable,
    heatmap,
    job_link,
    node_link,
    node_variable,
    runbook_link,
    scope_variables,
    stat,
    steps,
    table,
    timeseries,
)
from gpulens.dashboards.queries import sel

MIG_GPUS = sel("gpu_info", 'mig_mode="enabled"')
IDLE_HOURS = steps("green", (1.0, "orange"), (8.0, "red"))


def _state_row(layout: Layout) -> None:
    layout.row("GPUs by state")
    layout.add(
        stat("GPUs", [(f"count({sel('gpu_info')})", "")], COUNT, description="GPUs reporting `gpu_info`."),
        w=4,
        h=4,
    )
    layout.add(
        stat(
            "Busy",
            [(f"count({q.busy_gpus()})", "")],
            COUNT,
            no_value="0",
            description="GPUs with a process or at least 5 % SM activity (NVML utilization where no "
            "profiling source exists). A MIG GPU counts once, by its whole-GPU activity.",
        ),
        w=4,
        h=4,
    )
    layout.add(
        stat(
            "Idle",
            [(f"count({q.idle_gpus()})", "")],
            COUNT,
            no_value="0",
            thresholds=ANY_IS_BAD,
            description="GPUs nobody uses: no process and below 5 % SM activity "
            "(recording rule instance_gpu:gpu_idle:bool).",
        ),
        w=4,
        h=4,
    )
    layout.add(
        stat(
            "Faulty",
            [(f"count({q.faulty_gpus()})", "")],
            COUNT,
            no_value="0",
            thresholds=ANY_IS_BAD,
            color_mode="background",
            description="GPUs lost (`gpu_up == 0`), with row remapping pending or failed, retired pages "
            f"pending, or with a critical Xid ({CRITICAL_XID_REGEX.replace('|', ', ')}) or an uncorrectable "
            "ECC error in the last hour.",
        ),
        w=4,
        h=4,
    )
    layout.add(
        stat(
            "MIG enabled",
            [(f"count({MIG_GPUS})", "")],
            COUNT,
            no_value="0",
            description="GPUs in MIG mode (see the Sharing dashboard for their layout).",
        ),
        w=4,
        h=4,
    )
    layout.add(
        stat(
            "MPS active",
            [(f"count({sel('gpu_mps_server_active')} == 1)", "")],
            COUNT,
            no_value="0",
            description="GPUs whose context is owned by an MPS server.",
        ),
        w=4,
        h=4,
    )
    gpus_by_state = timeseries(
        "GPUs by state",
        [
            (f"count({q.busy_gpus()})", "busy"),
            (f"count({q.idle_gpus()})", "idle"),
            (f"count({q.faulty_gpus()})", "faulty"),
            (f"count({MIG_GPUS})", "MIG"),
            (f"count({sel('gpu_mps_server_active')} == 1)", "MPS"),
        ],
        COUNT,
        description="Busy and idle partition the healthy GPUs; MIG and MPS are sharing modes across them.",
        legend_calcs=("lastNotNull", "max"),
    )
    layout.add(gpus_by_state, w=10, h=9)
    nodes = table(
        "Nodes",
        [
            (f"count by (instance) ({sel('gpu_info')})", ""),
            (f"avg by (instance) ({q.activity()})", ""),
            (
                f"sum by (instance) ({sel('gpu_memory_used_bytes')})"
                f" / sum by (instance) ({sel('gpu_memory_total_bytes')})",
                "",
            ),
            (f"sum by (instance) ({sel('gpu_power_watts')})", ""),
            (f"count by (instance) (count by (instance, job_id) ({sel('gpu_job_info')}))", ""),
        ],
        NONE,
        merge=True,
        rename={
            "instance": "node",
            "Value #A": "GPUs",
            "Value #B": "SM activity",
            "Value #C": "memory used",
            "Value #D": "power",
            "Value #E": "jobs",
        },
        order=("instance", "Value #A", "Value #B", "Value #C", "Value #D", "Value #E"),
        overrides=[
            column_links("node", node_link("${__data.fields.node}")),
            column_unit("SM activity", PERCENTUNIT),
            column_unit("memory used", PERCENTUNIT),
            column_unit("power", WATT),
        ],
        description="Per node: GPUs, mean SM activity, memory used, power (parent GPUs only, so MIG "
        "never double counts) and jobs. Click a node for its detail.",
    )
    layout.add(nodes, w=14, h=9)


def _activity_row(layout: Layout) -> None:
    layout.row("Activity and memory")
    layout.add(
        heatmap(
            "SM activity across GPUs",
            q.activity(),
            PERCENTUNIT,
            description="Distribution of per-GPU SM activity over time: a bright band at the bottom is "
            "idle capacity.",
        ),
        w=12,
        h=9,
    )
    layout.add(
        heatmap(
            "Memory used across GPUs",
            q.memory_used_ratio(),
            PERCENTUNIT,
            scheme="Blues",
            description="Distribution of per-GPU memory used / total.",
        ),
        w=12,
        h=9,
    )
    layout.add(
        timeseries(
            "SM activity per node",
            [(f"avg by (instance) ({q.activity()})", "{{instance}}")],
            PERCENTUNIT,
            thresholds=IDLE_LOW,
            links=[node_link()],
            description="Average SM activity of each node's GPUs (instance_gpu:gpu_sm_active:ratio; NVML "
            "utilization where no profiling source exists).",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "Memory used vs total",
            [
                (f"sum({sel('gpu_memory_used_bytes')})", "used"),
                (f"sum({sel('gpu_memory_total_bytes')})", "total"),
            ],
            BYTES,
            description="Whole-GPU memory from the parent series (MIG instances are not added again).",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "Power per node",
            [(f"sum by (instance) ({sel('gpu_power_watts')})", "{{instance}}")],
            WATT,
            stack=True,
            links=[node_link()],
            description="Board power summed over parent GPUs. MIG instances carry no power series, so "
            "this never double counts (dcgm-exporter's dashboard does).",
        ),
        w=8,
        h=8,
    )


def _waste_row(layout: Layout) -> None:
    layout.row("Waste")
    layout.add(
        stat(
            "Idle GPU-hours (time range)",
            [(q.idle_gpu_hours(), "")],
            HOURS,
            thresholds=ANY_IS_BAD,
            description="GPU-hours without a process and below 5 % SM activity over the dashboard "
            "time range.",
        ),
        w=6,
        h=8,
    )
    layout.add(
        timeseries(
            "Idle GPUs per node",
            [(f"count by (instance) ({q.idle_gpus()})", "{{instance}}")],
            COUNT,
            stack=True,
            links=[node_link()],
            description="GPUs per node that are idle: no process and SM activity below 5 % "
            "(instance_gpu:gpu_idle:bool).",
        ),
        w=8,
        h=8,
    )
    layout.add(
        table(
            "Top wasteful jobs (time range)",
            [(q.top_wasteful_jobs(), "")],
            HOURS,
            rename={"Value": "idle GPU-hours held"},
            thresholds=IDLE_HOURS,
            sort_by="idle GPU-hours held",
            overrides=[column_links("job_id", job_link("${__data.fields.job_id}"))],
            description="GPU-hours a job held but left idle: its share of each GPU (a MIG slice's share "
            "of the GPU, split between jobs on MPS or time-sliced GPUs) minus the part it used. Click a "
            "job for its detail and recommendation.",
        ),
        w=10,
        h=8,
    )


def _alerts_row(layout: Layout) -> None:
    layout.row("Alerts and errors")
    layout.add(
        table(
            "Open critical alerts",
            [(f'ALERTS{{{SCOPE}, alertstate="firing", severity="critical", instance=~"$node|"}}', "")],
            NONE,
            hide=("Time", "__name__", "job", "Value", "alertstate"),
            order=("alertname", "instance", "gpu", "uuid"),
            overrides=[
                column_links("alertname", runbook_link()),
                column_links("instance", gpu_link("${__data.fields.instance}", "${__data.fields.gpu}")),
            ],
            description="Firing alerts with severity critical (alerts without a node label are always "
            "shown). The alert name links to its runbook.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Xid rate by code (events per 10 min)",
            [(f"sum by (xid) ({sel(q.XID_RECENT)})", "Xid {{xid}}")],
            COUNT,
            stack=True,
            description="Xid events in the preceding 10 minutes by code (recording rule over the per-code "
            "counter, first event of a code included; never a last-value gauge). Critical codes: "
            + CRITICAL_XID_REGEX.replace("|", ", ")
            + ".",
        ),
        w=12,
        h=8,
    )
    layout.add(
        table(
            "Xid events in time range",
            [(f"sum by (instance, gpu, xid) ({q.xid_events()}) > 0", "")],
            COUNT,
            rename={"Value": "events"},
            thresholds=ANY_IS_BAD,
            sort_by="events",
            overrides=[column_links("gpu", gpu_link("${__data.fields.instance}", "${__data.fields.gpu}"))],
            description="Xid events per GPU and code over the dashboard's time range, the first event of a "
            "code included (its counter is born with it).",
        ),
        w=24,
        h=7,
    )


# Fleet-, model- and recovery-level series (one per cluster) and the remediation receiver's own
# series (its own scrape job, not the exporters'): only the cluster applies.
FLEETWIDE = CLUSTER


def _health_row(layout: Layout) -> None:
    layout.row("Health: fault rate and recovery")
    layout.add(
        stat(
            "Fault rate (per 1,000 GPU-days, last day)",
            [(sel("fleet:gpu_faults_per_1000_gpu_days:ratio1d", base=FLEETWIDE), "")],
            NONE,
            thresholds=steps("green", (1.0, "orange"), (5.0, "red")),
            description="Fault-class Xid events (reset, reboot, NVLink, double-bit ECC; not application "
            "Xids) in the last day per 1,000 GPU-days of the fleet (recording rule "
            "fleet:gpu_faults_per_1000_gpu_days:ratio1d).",
        ),
        w=6,
        h=4,
    )
    layout.add(
        stat(
            "MTTR (last 7 days)",
            [(sel("fleet:gpulens_remediate_time_to_recover_seconds:mean7d", base=FLEETWIDE), "")],
            SECONDS,
            no_value="no recovery yet",
            description="Mean time from detection (the alert's start) to healthy through the hold-down "
            "after the recovery action, from the gpulens remediate receiver's histogram.",
        ),
        w=6,
        h=4,
    )
    layout.add(
        stat(
            "Isolated nodes now",
            [(f"sum({sel('gpulens_remediate_isolated_nodes', base=FLEETWIDE)})", "")],
            COUNT,
            thresholds=ANY_IS_BAD,
            no_value="receiver not scraped",
            description="Nodes held out of service by open fault episodes of gpulens remediate "
            "(isolated, recovering, in hold-down, ready to return, RMA or escalated).",
        ),
        w=6,
        h=4,
    )
    layout.add(
        stat(
            "Episodes by outcome (time range)",
            [
                (
                    "sum by (outcome) (increase("
                    f"{sel('gpulens_remediate_episodes_total', base=FLEETWIDE)}[$__range]))",
                    "{{outcome}}",
                )
            ],
            COUNT,
            no_value="0",
            description="Fault episodes of gpulens remediate that reached each outcome: returned to "
            "service, RMA (kept out), escalated (flapping or recovery failed).",
        ),
        w=6,
        h=4,
    )
    layout.add(
        table(
            "Top failing nodes (last day)",
            [
                (
                    f"topk(10, {sel('instance:gpu_faults_per_1000_gpu_days:ratio1d', base=SCOPE)})",
                    "",
                )
            ],
            NONE,
            rename={"Value": "faults per 1,000 GPU-days"},
            thresholds=ANY_IS_BAD,
            sort_by="faults per 1,000 GPU-days",
            overrides=[column_links("instance", node_link("${__data.fields.instance}"))],
            description="Nodes with fault-class Xids in the last day; click one for its history.",
        ),
        w=12,
        h=7,
    )
    layout.add(
        table(
            "Fault rate by GPU model (last day)",
            [(sel("model:gpu_faults_per_1000_gpu_days:ratio1d", base=FLEETWIDE), "")],
            NONE,
            rename={"Value": "faults per 1,000 GPU-days"},
            thresholds=ANY_IS_BAD,
            sort_by="faults per 1,000 GPU-days",
            description="Fault-class Xids in the last day per 1,000 GPU-days of each GPU model.",
        ),
        w=12,
        h=7,
    )


def build() -> Dashboard:
    layout = Layout()
    _state_row(layout)
    _activity_row(layout)
    _waste_row(layout)
    _alerts_row(layout)
    _health_row(layout)
    return dashboard(
        UID_FLEET,
        "gpulens: state, activity, waste and faults across every GPU.",
        layout,
        [*scope_variables(), node_variable(), gpu_variable()],
    )
