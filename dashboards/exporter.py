"""Exporter health: is gpulens-exporter itself collecting, fresh and cheap?

A GPU dashboard that silently shows stale numbers is worse than none. This one shows the scrape
(`up`, Prometheus' own `scrape_duration_seconds`), NVML, each collector's success and duration, and
how old the last completed sample is (the exporter samples in the background; a scrape only
serves the last sample).
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from gpulens.dashboards.common import (
    COUNT,
    NODE,
    NONE,
    PERCENTUNIT,
    SAMPLE_AGE,
    SECONDS,
    UID_EXPORTER,
    UP,
    Layout,
    column_links,
    column_unit,
    dashboard,
    gpu_variable,
    node_link,
    node_variable,
    scope_variables,
    stat,
    steps,
    table,
    timeseries,
)
from gpulens.dashboards.queries import sel

EXPORTERS = sel("gpulens_build_info", base=NODE)
# `up` and the scrape_* series of the targets that are gpulens exporters (whatever the job name)
SCRAPE_OF = f"and on (instance, job) {EXPORTERS}"
SLOW = steps("green", (0.5, "orange"), (2.0, "red"))


def _scrape(layout: Layout) -> None:
    layout.row("Scrape")
    layout.add(
        stat(
            "Exporters up",
            [(f"sum(up{{{NODE}}} {SCRAPE_OF})", "")],
            COUNT,
            description="Targets exposing gpulens_build_info that answered the last scrape.",
        ),
        w=4,
        h=6,
    )
    layout.add(
        stat(
            "NVML up",
            [(f"min({sel('gpulens_nvml_up', base=NODE)})", "")],
            NONE,
            thresholds=UP,
            color_mode="background",
            description="0 when the NVML library could not be initialised on some node.",
        ),
        w=4,
        h=6,
    )
    layout.add(
        stat(
            "GPUs seen",
            [(f"sum({sel('gpulens_gpus', base=NODE)})", "")],
            COUNT,
            description="GPUs the exporters on the selected nodes see through NVML (gpulens_gpus); fewer "
            "than installed means a GPU fell off the bus or the driver hides it.",
        ),
        w=4,
        h=6,
    )
    layout.add(
        stat(
            "GPUs up",
            [(f"sum({sel('gpu_up')}) / count({sel('gpu_up')})", "")],
            PERCENTUNIT,
            thresholds=steps("red", (0.99, "orange"), (1.0, "green")),
            description="Share of the selected GPUs that answer NVML.",
        ),
        w=4,
        h=6,
    )
    layout.add(
        table(
            "Versions",
            [(f"max by (instance, version, python_version, nvml_library_version) ({EXPORTERS})", "")],
            NONE,
            hide=("Time", "Value"),
            overrides=[column_links("instance", node_link("${__data.fields.instance}"))],
            description="gpulens, Python and NVML library versions per node (gpulens_build_info), to spot "
            "nodes left behind by a rollout.",
        ),
        w=8,
        h=6,
    )
    layout.add(
        timeseries(
            "Scrape duration",
            [(f"scrape_duration_seconds{{{NODE}}} {SCRAPE_OF}", "{{instance}}")],
            SECONDS,
            thresholds=SLOW,
            description="Prometheus' own measurement. The exporter serves a prerendered sample, so this "
            "should stay in milliseconds.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Samples per scrape",
            [(f"scrape_samples_scraped{{{NODE}}} {SCRAPE_OF}", "{{instance}}")],
            COUNT,
            description="Series per scrape; a jump means new label values (jobs, MIG instances, Xids).",
        ),
        w=12,
        h=8,
    )


def _sampling(layout: Layout) -> None:
    layout.row("Sampling and collectors")
    layout.add(
        timeseries(
            "Sample age",
            [(f"time() - {sel('gpulens_last_sample_timestamp_seconds', base=NODE)}", "{{instance}}")],
            SECONDS,
            thresholds=SAMPLE_AGE,
            description="Seconds since the last completed background sample; more than a few intervals "
            "means the sampler is stuck.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Sample duration",
            [(sel("gpulens_sample_duration_seconds", base=NODE), "{{instance}}")],
            SECONDS,
            thresholds=SLOW,
            description="Seconds one sampling cycle took per node; a cycle longer than --interval means "
            "samples arrive late (see Sample age).",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Collector success",
            [
                (
                    f"avg by (collector) ({sel('gpulens_collector_success', base=NODE)})",
                    "{{collector}}",
                )
            ],
            PERCENTUNIT,
            thresholds=steps("red", (0.99, "green")),
            description="Share of the selected nodes where the collector's last run succeeded.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Collector duration (slowest node)",
            [
                (
                    f"max by (collector) ({sel('gpulens_collector_duration_seconds', base=NODE)})",
                    "{{collector}}",
                )
            ],
            SECONDS,
            stack=True,
            description="Seconds each collector took in its last run, the slowest node's value per "
            "collector: the place to look when Sample duration grows.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        table(
            "Collector status",
            [
                (f"min by (instance, collector) ({sel('gpulens_collector_success', base=NODE)})", ""),
                (
                    f"1 - min by (instance, collector) "
                    f"(avg_over_time({sel('gpulens_collector_success', base=NODE)}[$__range]))",
                    "",
                ),
                (
                    f"max by (instance, collector) ({sel('gpulens_collector_duration_seconds', base=NODE)})",
                    "",
                ),
            ],
            NONE,
            merge=True,
            rename={"Value #A": "last run", "Value #B": "failed (time range)", "Value #C": "duration"},
            order=("instance", "collector", "Value #A", "Value #B", "Value #C"),
            sort_by="failed (time range)",
            overrides=[
                column_links("instance", node_link("${__data.fields.instance}")),
                {
                    "matcher": {"id": "byName", "options": "last run"},
                    "properties": [
                        {
                            "id": "mappings",
                            "value": [
                                {
                                    "type": "value",
                                    "options": {
                                        "0": {"color": "red", "index": 0, "text": "failed"},
                                        "1": {"color": "green", "index": 1, "text": "ok"},
                                    },
                                }
                            ],
                        },
                        {"id": "custom.cellOptions", "value": {"type": "color-background"}},
                    ],
                },
                column_unit("failed (time range)", PERCENTUNIT),
                column_unit("duration", SECONDS),
            ],
            description="Each collector's last run per node, and the share of its runs that failed in the "
            "time range (failures first).",
        ),
        w=12,
        h=6,
    )
    layout.add(
        table(
            "Profiling source",
            [(f"max by (instance, gpu, source) ({sel('gpulens_profiling_source_info')})", "")],
            NONE,
            hide=("Time", "Value"),
            description="Where the *_active_ratio families come from: gpm (NVML, Hopper+), dcgm or nvml.",
        ),
        w=12,
        h=6,
    )


def build() -> Dashboard:
    layout = Layout()
    _scrape(layout)
    _sampling(layout)
    return dashboard(
        UID_EXPORTER,
        "gpulens: exporter scrape, sampling freshness and collector health.",
        layout,
        [*scope_variables(), node_variable(), gpu_variable()],
        time_from="now-3h",
    )
