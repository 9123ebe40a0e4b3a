"""Shared building blocks for the gpulens dashboards: variables, units, thresholds, links, panels.

Every dashboard module builds its panels through these helpers so that the things reviewers check
once (datasource on every panel and target, a unit on every panel, percentunit for ratios,
`$__rate_interval` in rates, stable links by uid) are decided in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import attr
from grafanalib.core import (
    REFRESH_ON_TIME_RANGE_CHANGE,
    SORT_ALPHA_ASC,
    Annotations,
    Dashboard,
    DashboardLink,
    GridPos,
    Panel,
    RowPanel,
    Stat,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

# --- identity ------------------------------------------------------------------------------------

TAG = "gpulens"
SCHEMA_VERSION = 39  # panels below are written in the Grafana 10/11 JSON model; no migration needed

# Stable dashboard uids: links, provisioning and bookmarks depend on them; never change one.
UID_FLEET = "gpulens-fleet"
UID_NODE = "gpulens-node"
UID_SHARING = "gpulens-sharing"
UID_JOBS = "gpulens-jobs"
UID_EXPORTER = "gpulens-exporter"

# url slugs (Grafana ignores the slug when resolving /d/<uid>/<slug>, but it reads better)
SLUGS = {
    UID_FLEET: "gpu-fleet-overview",
    UID_NODE: "gpu-node-detail",
    UID_SHARING: "gpu-sharing-mig-mps",
    UID_JOBS: "gpu-jobs",
    UID_EXPORTER: "gpulens-exporter-health",
}
TITLES = {
    UID_FLEET: "GPU fleet overview",
    UID_NODE: "GPU node / GPU detail",
    UID_SHARING: "GPU sharing: MIG, MPS, time-slicing",
    UID_JOBS: "GPU jobs",
    UID_EXPORTER: "gpulens exporter health",
}

# --- datasource and units -------------------------------------------------------------------------

DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}

PERCENTUNIT = "percentunit"  # every 0..1 ratio
BYTES = "bytes"  # IEC
BYTES_PER_SECOND = "Bps"
WATT = "watt"
CELSIUS = "celsius"
HERTZ = "hertz"
SECONDS = "s"
HOURS = "h"
COUNT = "short"
NONE = "none"
EVENTS_PER_MINUTE = "cpm"
TIMESTAMP = "dateTimeAsIso"

# Xid codes that need a GPU reset, a node reboot or hardware service: exactly the codes of the
# critical Xid alerts in alerts/gpu_alerts.yml (a test keeps the two equal). Shown as "faulty".
CRITICAL_XIDS: tuple[int, ...] = (
    46, 48, 54, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143, 155, 156, 158,
)  # fmt: skip
CRITICAL_XID_REGEX = "|".join(str(x) for x in CRITICAL_XIDS)

# Label selectors every query starts from. SCOPE is the mixin's part: the build
# (gpulens.dashboards.build.apply_config) renames the `cluster` label to the config's cluster label
# and puts the config's selector before `job=~"$job"`, so the Python here serves every config.
CLUSTER = 'cluster=~"$cluster"'
SCRAPE_JOB = 'job=~"$job"'
SCOPE = f"{CLUSTER}, {SCRAPE_JOB}"
NODE = f'{SCOPE}, instance=~"$node"'
NODE_GPU = f'{NODE}, gpu=~"$gpu"'


# --- thresholds -----------------------------------------------------------------------------------


def steps(base: str, *levels: tuple[float, str]) -> list[dict[str, Any]]:
    """Absolute threshold steps in Grafana's model: a base colour, then (value, colour) ascending."""
    out: list[dict[str, Any]] = [{"color": base, "value": None}]
    last = float("-inf")
    for value, colour in levels:
        if value <= last:
            raise ValueError(f"threshold values must increase, got {value} after {last}")
        out.append({"color": colour, "value": value})
        last = value
    return out


OK_ONLY = steps("green")
RATIO_HIGH = steps("green", (0.8, "orange"), (0.95, "red"))  # memory / power near the limit
TEMPERATURE = steps("green", (83.0, "orange"), (87.0, "red"))  # H100 slowdown starts near 87 C
IDLE_LOW = steps("red", (0.05, "orange"), (0.3, "green"))  # low activity is the bad case
ANY_IS_BAD = steps("green", (1.0, "red"))  # counts of faults / errors
UP = steps("red", (1.0, "green"))  # 0/1 up gauges
SAMPLE_AGE = steps("green", (15.0, "orange"), (60.0, "red"))

# --- variables ------------------------------------------------------------------------------------


def datasource_variable() -> Template:
    return Template(
        name="datasource",
        label="Data source",
        query="prometheus",
        type="datasource",
        default="default",
        refresh=1,
    )


def _select_all(variable: Template) -> Template:
    """Start a multi-value variable on "All" the way Grafana itself saves it."""
    variable._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return variable


def _all_variable(name: str, label: str, query: str) -> Template:
    return _select_all(
        Template(
            name=name,
            label=label,
            query=query,
            dataSource=DATASOURCE,
            multi=True,
            includeAll=True,
            allValue=".*",
            refresh=REFRESH_ON_TIME_RANGE_CHANGE,
            sort=SORT_ALPHA_ASC,
        )
    )


def cluster_variable() -> Template:
    """Clusters in a global view (Thanos, Mimir): the mixin's cluster label of gpulens targets. The
    build writes the config's selector and label into this query (apply_config); a Prometheus
    without that label offers only "All", which matches every series."""
    return _all_variable("cluster", "Cluster", "label_values(gpu_info, cluster)")


def scrape_job_variable() -> Template:
    """Prometheus scrape jobs of gpulens exporters (the `job` label, never a workload: see job_id)."""
    return _all_variable("job", "Scrape job", f"label_values(gpu_info{{{CLUSTER}}}, job)")


def scope_variables() -> list[Template]:
    """Data source, cluster and scrape job: the variables every gpulens dashboard starts with."""
    return [datasource_variable(), cluster_variable(), scrape_job_variable()]


def node_variable(multi: bool = True) -> Template:
    """Nodes are Prometheus `instance` labels of targets that export `gpu_info`."""
    variable = Template(
        name="node",
        label="Node",
        query=f"label_values(gpu_info{{{SCOPE}}}, instance)",
        dataSource=DATASOURCE,
        multi=multi,
        includeAll=multi,
        allValue=".*" if multi else None,
        refresh=REFRESH_ON_TIME_RANGE_CHANGE,
        sort=SORT_ALPHA_ASC,
    )
    return _select_all(variable) if multi else variable


def gpu_variable() -> Template:
    """GPU index on the selected nodes (the `gpu` label; `uuid` identifies it across nodes)."""
    return _select_all(
        Template(
            name="gpu",
            label="GPU",
            query=f"label_values(gpu_info{{{NODE}}}, gpu)",
            dataSource=DATASOURCE,
            multi=True,
            includeAll=True,
            allValue=".*",
            refresh=REFRESH_ON_TIME_RANGE_CHANGE,
            sort=3,  # numerical ascending: 0, 1, ..., 10
        )
    )


def job_variable() -> Template:
    """One job at a time: the attribution label `job_id` (never Prometheus' own `job`)."""
    return Template(
        name="job_id",
        label="Job",
        query=f'label_values(gpu_job_info{{{NODE_GPU}, job_source!="system"}}, job_id)',
        dataSource=DATASOURCE,
        multi=False,
        includeAll=False,
        refresh=REFRESH_ON_TIME_RANGE_CHANGE,
        sort=SORT_ALPHA_ASC,
    )


# --- links ----------------------------------------------------------------------------------------


def dashboard_url(uid: str, **variables: str) -> str:
    """A relative Grafana URL to dashboard `uid` keeping the time range and the datasource.

    `variables` maps variable name -> value expression (e.g. `${__data.fields.instance}`).
    """
    params = ["${__url_time_range}", "${datasource:queryparam}"]
    params += [f"var-{name}={value}" for name, value in sorted(variables.items())]
    return f"/d/{uid}/{SLUGS[uid]}?" + "&".join(params)


def dashboard_links(current: str) -> list[DashboardLink]:
    """Top-of-dashboard links to every other gpulens dashboard, carrying time and variables."""
    return [
        DashboardLink(
            type="link",
            title=TITLES[uid],
            uri=f"/d/{uid}/{SLUGS[uid]}",
            includeVars=True,
            keepTime=True,
            icon="dashboard",
        )
        for uid in SLUGS
        if uid != current
    ]


def data_link(title: str, uid: str, **variables: str) -> dict[str, Any]:
    return {"title": title, "url": dashboard_url(uid, **variables), "targetBlank": False}


# Where a link's URL is the runbook of the alert in the row: the build replaces this token with the
# mixin config's runbookURLPattern, the alert name taken from the row's `alertname` field
# (gpulens.dashboards.build.apply_config), so the links follow a user's own runbook location.
RUNBOOK_URL = "${__gpulens_runbook_url}"
RUNBOOK_ALERT_FIELD = "${__data.fields.alertname}"


def runbook_link() -> dict[str, Any]:
    return {"title": "Runbook", "url": RUNBOOK_URL, "targetBlank": True}


def column_links(column: str, *links: dict[str, Any]) -> dict[str, Any]:
    """A field override that puts data links on one table column."""
    return {
        "matcher": {"id": "byName", "options": column},
        "properties": [{"id": "links", "value": list(links)}],
    }


def column_unit(column: str, unit: str) -> dict[str, Any]:
    return {"matcher": {"id": "byName", "options": column}, "properties": [{"id": "unit", "value": unit}]}


def dashed_series(name_regex: str) -> dict[str, Any]:
    """Draw the series whose name matches as a dashed line: a limit or capacity, not a measurement."""
    return {
        "matcher": {"id": "byRegexp", "options": name_regex},
        "properties": [{"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}}],
    }


def node_link(field_expr: str = "${__field.labels.instance}") -> dict[str, Any]:
    return data_link("Node detail", UID_NODE, node=field_expr)


def gpu_link(
    node_expr: str = "${__field.labels.instance}", gpu_expr: str = "${__field.labels.gpu}"
) -> dict[str, Any]:
    return data_link("GPU detail", UID_NODE, node=node_expr, gpu=gpu_expr)


def job_link(job_expr: str = "${__field.labels.job_id}") -> dict[str, Any]:
    return data_link("Job detail", UID_JOBS, job_id=job_expr)


# --- targets and panels ---------------------------------------------------------------------------


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> Target:
    return Target(
        expr=expr,
        legendFormat=legend,
        refId=ref,
        instant=instant,
        format="table" if table else "time_series",
        intervalFactor=1,
        datasource=DATASOURCE,
    )


def targets(*pairs: tuple[str, str], instant: bool = False, table: bool = False) -> list[Target]:
    """Several (expr, legend) targets with refIds A, B, C, ..."""
    return [
        target(expr, legend, ref=chr(ord("A") + i), instant=instant, table=table)
        for i, (expr, legend) in enumerate(pairs)
    ]


def _field_extra(links: Sequence[dict[str, Any]], extra: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if links:
        out["fieldConfig"] = {"defaults": {"links": list(links)}}
    if extra:
        for key, value in extra.items():
            if key in out and isinstance(value, dict):
                out[key] = {**out[key], **value}
            else:
                out[key] = value
    return out


def timeseries(
    title: str,
    exprs: Sequence[tuple[str, str]],
    unit: str,
    *,
    description: str = "",
    thresholds: list[dict[str, Any]] | None = None,
    ratio: bool | None = None,
    stack: bool = False,
    bars: bool = False,
    links: Sequence[dict[str, Any]] = (),
    legend_calcs: Sequence[str] = ("mean", "max"),
    overrides: Sequence[dict[str, Any]] = (),
) -> TimeSeries:
    """A time series panel; ratios (percentunit) are pinned to 0..1."""
    is_ratio = unit == PERCENTUNIT if ratio is None else ratio
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=targets(*exprs),
        unit=unit,
        valueMin=0 if is_ratio else None,
        valueMax=1 if is_ratio else None,
        thresholds=thresholds if thresholds is not None else OK_ONLY,
        thresholdsStyleMode="line" if thresholds not in (None, OK_ONLY) else "off",
        fillOpacity=60 if stack or bars else 10,
        drawStyle="bars" if bars else "line",
        stacking={"mode": "normal", "group": "A"} if stack else {},
        legendDisplayMode="table",
        legendPlacement="bottom",
        legendCalcs=list(legend_calcs),
        tooltipMode="multi",
        tooltipSort="desc",
        maxDataPoints=500,
        overrides=list(overrides),
        extraJson=_field_extra(links, None) or None,
    )


def stat(
    title: str,
    exprs: Sequence[tuple[str, str]],
    unit: str,
    *,
    description: str = "",
    thresholds: list[dict[str, Any]] | None = None,
    reduce: str = "lastNotNull",
    no_value: str = "No data",
    text_mode: str = "auto",
    graph: bool = False,
    instant: bool = True,
    links: Sequence[dict[str, Any]] = (),
    color_mode: str = "value",
) -> Stat:
    """A stat panel reading the latest value of instant queries unless told otherwise."""
    return Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=targets(*exprs, instant=instant),
        format=unit,
        thresholds=thresholds if thresholds is not None else OK_ONLY,
        reduceCalc=reduce,
        noValue=no_value,
        textMode=text_mode,
        graphMode="area" if graph else "none",
        colorMode=color_mode,
        extraJson=_field_extra(links, None) or None,
    )


def table(
    title: str,
    exprs: Sequence[tuple[str, str]],
    unit: str,
    *,
    description: str = "",
    thresholds: list[dict[str, Any]] | None = None,
    hide: Iterable[str] = ("Time", "__name__", "job"),
    rename: dict[str, str] | None = None,
    order: Sequence[str] = (),
    overrides: Sequence[dict[str, Any]] = (),
    merge: bool = False,
    sort_by: str | None = None,
) -> Table:
    """An instant-query table; several queries are merged into one row per label set."""
    transformations: list[dict[str, Any]] = []
    if merge:
        transformations.append({"id": "merge", "options": {}})
    transformations.append(
        {
            "id": "organize",
            "options": {
                "excludeByName": {name: True for name in sorted(hide)},
                "indexByName": {name: i for i, name in enumerate(order)},
                "renameByName": dict(sorted((rename or {}).items())),
            },
        }
    )
    extra: dict[str, Any] = {"fieldConfig": {"defaults": {"thresholds": {"mode": "absolute"}}}}
    if sort_by:
        extra["options"] = {"showHeader": True, "sortBy": [{"desc": True, "displayName": sort_by}]}
    return Table(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=targets(*exprs, instant=True, table=True),
        unit=unit,
        thresholds=thresholds if thresholds is not None else OK_ONLY,
        filterable=True,
        overrides=list(overrides),
        transformations=transformations,
        extraJson=extra,
    )


@attr.s
class HeatmapPanel(Panel):
    """Grafana's (10+) heatmap panel, bucketing series values per time step.

    grafanalib 0.7.1 only models the pre-Grafana-9 heatmap; this emits the current JSON model.
    """

    unit: str = attr.ib(default=NONE, validator=attr.validators.instance_of(str))
    scheme: str = attr.ib(default="Oranges", validator=attr.validators.instance_of(str))

    def to_json_data(self) -> dict[str, Any]:
        is_ratio = self.unit == PERCENTUNIT
        y_axis: dict[str, Any] = {"axisPlacement": "left", "reverse": False, "unit": self.unit}
        calc_y: dict[str, Any] = {"mode": "size", "value": "0.05"} if is_ratio else {}
        panel: dict[str, Any] = self.panel_json(
            {
                "type": "heatmap",
                "fieldConfig": {
                    "defaults": {
                        "unit": self.unit,
                        "custom": {"hideFrom": {"legend": False, "tooltip": False, "viz": False}},
                    },
                    "overrides": [],
                },
                "options": {
                    "calculate": True,
                    "calculation": {"yBuckets": calc_y} if calc_y else {},
                    "cellGap": 1,
                    "color": {
                        "mode": "scheme",
                        "scheme": self.scheme,
                        "fill": "dark-orange",
                        "scale": "exponential",
                        "exponent": 0.5,
                        "steps": 64,
                        "reverse": False,
                    },
                    "exemplars": {"color": "rgba(255,0,255,0.7)"},
                    "legend": {"show": True},
                    "rowsFrame": {"layout": "auto"},
                    "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": True},
                    "yAxis": y_axis,
                },
            }
        )
        return panel


def heatmap(title: str, expr: str, unit: str, description: str = "", scheme: str = "Oranges") -> HeatmapPanel:
    # mypy's attrs plugin sees only this subclass's own fields (grafanalib is untyped)
    return HeatmapPanel(  # type: ignore[call-arg]
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=[target(expr, "{{instance}} GPU {{gpu}}")],
        maxDataPoints=200,
        unit=unit,
        scheme=scheme,
    )


# --- annotations ----------------------------------------------------------------------------------


def event_annotations() -> Annotations:
    """Firing alerts and Xid events, marked on every time series of a dashboard (Grafana draws a
    dashboard's annotations on all its time series panels): the two things an SRE looks for when a
    curve changes. Scoped like the panels, so the build scopes them for the mixin config too."""
    common = {"datasource": DATASOURCE, "enable": True, "hide": False, "step": "60s"}
    return Annotations(
        list=[
            {
                **common,
                "name": "Alerts",
                "iconColor": "red",
                "expr": f'ALERTS{{{SCOPE}, alertstate="firing", instance=~"$node|"}}',
                "titleFormat": "{{alertname}}",
                "textFormat": "{{severity}} on {{instance}} GPU {{gpu}}",
                "tagKeys": "severity",
            },
            {
                **common,
                "name": "Xid events",
                "iconColor": "orange",
                # the recording rule counts the first event of a code too (docs/dashboards.md)
                "expr": f"instance_gpu_xid:gpu_xid_errors:increase10m{{{NODE_GPU}}} > 0",
                "titleFormat": "Xid {{xid}}",
                "textFormat": "{{instance}} GPU {{gpu}}",
                "tagKeys": "xid",
            },
        ]
    )


# --- layout ---------------------------------------------------------------------------------------


@dataclass
class Layout:
    """Places panels left to right in 24 columns, wrapping lines, with row headers between groups.

    Positions only depend on the order panels are added, so the JSON is stable.
    """

    panels: list[Panel] = field(default_factory=list)
    _x: int = 0
    _y: int = 0
    _line_height: int = 0

    def row(self, title: str) -> Layout:
        self._newline()
        # a row's datasource is the panels' own (never null: an empty row would query the default)
        row = RowPanel(title=title, dataSource=DATASOURCE, gridPos=GridPos(h=1, w=24, x=0, y=self._y))
        self.panels.append(row)
        self._y += 1
        return self

    def add(self, panel: Panel, w: int = 12, h: int = 8) -> Layout:
        if not 1 <= w <= 24:
            raise ValueError(f"panel width must be 1..24, got {w}")
        if self._x + w > 24:
            self._newline()
        panel.gridPos = GridPos(h=h, w=w, x=self._x, y=self._y)
        self.panels.append(panel)
        self._x += w
        self._line_height = max(self._line_height, h)
        return self

    def _newline(self) -> None:
        if self._x:
            self._y += self._line_height
        self._x = 0
        self._line_height = 0


def dashboard(
    uid: str, description: str, layout: Layout, variables: Sequence[Template], time_from: str = "now-6h"
) -> Dashboard:
    """A gpulens dashboard with stable ids, links to its siblings and shared conventions.

    Not editable: the dashboards are provisioned from these sources, and edits made in the UI would
    be lost at the next provisioning (copy the dashboard to change it)."""
    return Dashboard(
        title=TITLES[uid],
        uid=uid,
        description=description,
        tags=[TAG],
        timezone="browser",
        refresh="30s",
        schemaVersion=SCHEMA_VERSION,
        graphTooltip=1,
        editable=False,
        annotations=event_annotations(),
        links=dashboard_links(uid),
        templating=Templating(list=list(variables)),
        time=Time(time_from, "now"),
        panels=layout.panels,
    ).auto_panel_ids()
