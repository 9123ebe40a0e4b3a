"""Grafana dashboard JSON (our build) -> Perses dashboards, as JSON and as `PersesDashboard` resources.

Perses (Apache-2.0, CNCF) is what OpenShift and other Perses users run instead of Grafana; shipping
the same dashboards for it costs one conversion of the JSON the build already renders (so the
mixin config applies alike). Perses' own `percli migrate` needs plugin schemas from a registry, so
the conversion is ours. It targets the Perses 0.52 model and its plugins (the versions pinned in
tools/dashboard-render/package.json, which render every converted dashboard in tests/dashboards/
test_render.py):

- time series -> `TimeSeriesChart`; stat -> `StatChart`; table -> `Table` (instant queries, label
  columns hidden and renamed as in Grafana's "organize" transform; Grafana's "merge" -> one row per
  value of the labels every query aggregates by: see `merge_transforms`).
- heatmap -> `TimeSeriesChart`: Perses' `HeatMapChart` (0.3) draws only native histograms, and ours
  bucket plain series per time step.
- variables: `label_values(selector, label)` -> `ListVariable` with `PrometheusLabelValuesVariable`;
  the Grafana `datasource` variable is dropped: every query uses the project's default
  Prometheus datasource.

Not converted (Perses 0.52 has no equivalent): annotations (alerts, Xids), data links (Grafana's
`${__data.fields...}` and `${__url_time_range}` have no Perses counterpart), per-column units and
overrides, and the units in `UNITS` mapped to a plain number.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

API_VERSION = "perses.dev/v1alpha1"  # perses-operator's PersesDashboard (spec = the dashboard spec)
PROJECT = "gpulens"  # the Perses project the dashboards belong to
NAMESPACE = "gpulens"  # deploy/kubernetes/namespace.yaml


@dataclass(frozen=True)
class PersesUnit:
    """A Perses format: its unit and, where Perses shows large numbers shortened, `short_values`."""

    unit: str
    short_values: bool = False
    lost: str = ""  # what the Grafana unit said that Perses cannot (empty when it maps exactly)

    def format(self) -> dict[str, Any]:
        out: dict[str, Any] = {"unit": self.unit}
        if self.short_values:
            out["shortValues"] = True
        return out


# Grafana unit id -> Perses format. Perses 0.52 has no watt, celsius, hertz, per-minute or timestamp
# unit: those show as plain numbers and the panel titles and legends name the unit. Perses shows
# bytes in decimal multiples (kB, MB) where Grafana's `bytes` is IEC (KiB, MiB).
UNITS: dict[str, PersesUnit] = {
    "percentunit": PersesUnit("percent-decimal"),
    "bytes": PersesUnit("bytes", lost="IEC multiples shown as decimal ones"),
    "Bps": PersesUnit("bytes/sec", lost="IEC multiples shown as decimal ones"),
    "s": PersesUnit("seconds"),
    "h": PersesUnit("hours"),
    "short": PersesUnit("decimal", short_values=True),
    "none": PersesUnit("decimal"),
    "watt": PersesUnit("decimal", lost="no watt unit"),
    "celsius": PersesUnit("decimal", lost="no temperature unit"),
    "hertz": PersesUnit("decimal", short_values=True, lost="no frequency unit"),
    "cpm": PersesUnit("decimal", lost="no per-minute unit"),
    "dateTimeAsIso": PersesUnit("decimal", lost="no timestamp unit: shown as Unix seconds"),
}

# Grafana's reducer -> Perses calculation
CALCULATIONS = {"lastNotNull": "last-number", "last": "last", "mean": "mean", "max": "max", "min": "min",
                "sum": "sum", "firstNotNull": "first-number", "first": "first"}  # fmt: skip

# Grafana's named colours (its default palette) as the hex values Perses takes
COLOURS = {"green": "#56a64b", "orange": "#ff9830", "red": "#e02f44", "yellow": "#f2cc0c", "blue": "#3274d9"}

# Grafana's variable sort -> Perses' (1: alphabetical, 3: numerical)
SORTS = {0: "none", 1: "alphabetical-asc", 2: "alphabetical-desc", 3: "numerical-asc", 4: "numerical-desc"}

LABEL_VALUES = re.compile(r"label_values\((.*),\s*(\w+)\)\s*", re.DOTALL)
GRAFANA_TIME = re.compile(r"now-(\d+[smhdw])")


class ConversionError(ValueError):
    """The Grafana JSON has something the converter does not know: one line naming where."""


@dataclass(frozen=True)
class Converted:
    """One dashboard as Perses JSON text (a `Dashboard` resource) and its file name."""

    name: str
    filename: str
    resource: dict[str, Any]

    @property
    def text(self) -> str:
        return json.dumps(self.resource, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def unit(grafana_unit: str | None, where: str) -> dict[str, Any]:
    if grafana_unit is None:
        return UNITS["none"].format()
    if grafana_unit not in UNITS:
        raise ConversionError(
            f"{where}: unit {grafana_unit!r} has no Perses mapping (known: {sorted(UNITS)})"
        )
    return UNITS[grafana_unit].format()


def thresholds(field_config: dict[str, Any]) -> dict[str, Any] | None:
    """Absolute Grafana steps -> Perses thresholds; None for a single base colour (nothing to draw)."""
    grafana_steps = field_config.get("defaults", {}).get("thresholds", {}).get("steps", [])
    levels = [s for s in grafana_steps if s.get("value") is not None]
    if not levels:
        return None
    base = next((s["color"] for s in grafana_steps if s.get("value") is None), "green")
    return {
        "defaultColor": COLOURS.get(base, base),
        "steps": [{"value": s["value"], "color": COLOURS.get(s["color"], s["color"])} for s in levels],
    }


def _queries(panel: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "kind": "TimeSeriesQuery",
            "spec": {
                "plugin": {
                    "kind": "PrometheusTimeSeriesQuery",
                    "spec": {"query": target["expr"], "seriesNameFormat": target.get("legendFormat", "")},
                }
            },
        }
        for target in panel.get("targets", [])
    ]


def _time_series(panel: dict[str, Any], where: str) -> dict[str, Any]:
    field = panel.get("fieldConfig", {})
    defaults = field.get("defaults", {})
    custom = defaults.get("custom", {})
    y_axis: dict[str, Any] = {"format": unit(defaults.get("unit"), where)}
    for key in ("min", "max"):
        if defaults.get(key) is not None:
            y_axis[key] = defaults[key]
    visual: dict[str, Any] = {"display": "bar" if custom.get("drawStyle") == "bars" else "line"}
    if custom.get("stacking", {}).get("mode") == "normal":
        visual["stack"] = "all"
        visual["areaOpacity"] = 0.6
    legend = panel.get("options", {}).get("legend", {})
    spec: dict[str, Any] = {
        "legend": {"position": "bottom", "mode": "table" if legend.get("displayMode") == "table" else "list"},
        "yAxis": y_axis,
        "visual": visual,
    }
    calcs = [CALCULATIONS[c] for c in legend.get("calcs", []) if c in CALCULATIONS]
    if calcs:
        spec["legend"]["values"] = calcs
    drawn = custom.get("thresholdsStyle", {}).get("mode", "off") != "off"
    steps = thresholds(field)
    if drawn and steps:
        spec["thresholds"] = steps
    return {"kind": "TimeSeriesChart", "spec": spec}


def _stat(panel: dict[str, Any], where: str) -> dict[str, Any]:
    field = panel.get("fieldConfig", {})
    calcs = panel.get("options", {}).get("reduceOptions", {}).get("calcs", ["lastNotNull"])
    calc = calcs[0] if calcs else "lastNotNull"
    if calc not in CALCULATIONS:
        raise ConversionError(f"{where}: stat reducer {calc!r} has no Perses calculation")
    spec: dict[str, Any] = {
        "calculation": CALCULATIONS[calc],
        "format": unit(field.get("defaults", {}).get("unit"), where),
    }
    steps = thresholds(field)
    if steps:
        spec["thresholds"] = steps
    if panel.get("options", {}).get("graphMode") == "area":
        spec["sparkline"] = {}
    return {"kind": "StatChart", "spec": spec}


AGGREGATED_BY = re.compile(r"\bby\s*\(([^)]*)\)")


def merge_transforms(exprs: list[str]) -> list[dict[str, Any]]:
    """Grafana's "merge" of several instant queries as Perses transforms.

    Perses suffixes each query's labels with ` #N`; `MergeSeries` would then join rows only where
    every label is equal, so a query with more labels (gpu_info's model, uuid) never meets the
    value-only queries. Instead: merge the ` #N` copies of every label the queries aggregate by, and
    join rows on the labels all of them aggregate by (their first `by (...)`), as Grafana's merge
    joins on the fields the frames share.
    """
    label_sets = []
    for expr in exprs:
        match = AGGREGATED_BY.search(expr)
        if not match:
            return [{"kind": "MergeSeries", "spec": {}}]
        label_sets.append([label.strip() for label in match.group(1).split(",") if label.strip()])
    labels = list(dict.fromkeys(label for labels in label_sets for label in labels))
    shared = [label for label in labels if all(label in s for s in label_sets)]
    if not shared:
        return [{"kind": "MergeSeries", "spec": {}}]
    return [
        *({"kind": "MergeIndexedColumns", "spec": {"column": label}} for label in labels),
        {"kind": "JoinByColumnValue", "spec": {"columns": shared}},
    ]


def _table(panel: dict[str, Any], where: str) -> dict[str, Any]:
    # Perses names the columns of a series' table after its labels, plus `timestamp` and `value`
    # (`value #N` for the N-th query once series are merged); Grafana's are `Time` and `Value`.
    perses_name = {"Time": "timestamp", "Value": "value"}
    columns: dict[str, dict[str, Any]] = {}
    transforms: list[dict[str, Any]] = []
    for transform in panel.get("transformations", []):
        options = transform.get("options", {})
        if transform["id"] == "merge":
            transforms += merge_transforms([t["expr"] for t in panel.get("targets", [])])
        elif transform["id"] == "organize":
            for name, hidden in options.get("excludeByName", {}).items():
                if hidden:
                    columns.setdefault(perses_name.get(name, name), {})["hide"] = True
            for name, header in options.get("renameByName", {}).items():
                if re.fullmatch(r"Value #[A-Z]", name):
                    name = f"value #{ord(name[-1]) - ord('A') + 1}"
                columns.setdefault(perses_name.get(name, name), {})["header"] = header
        else:
            raise ConversionError(
                f"{where}: table transformation {transform['id']!r} has no Perses transform"
            )
    default_unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    for name in ("value", *(n for n in columns if n.startswith("value #"))):
        columns.setdefault(name, {}).setdefault("format", unit(default_unit, where))
    spec: dict[str, Any] = {
        "density": "compact",
        "columnSettings": [{"name": name, **columns[name]} for name in sorted(columns)],
    }
    if transforms:
        spec["transforms"] = transforms
    return {"kind": "Table", "spec": spec}


PANEL_PLUGINS = {"timeseries": _time_series, "heatmap": _time_series, "stat": _stat, "table": _table}


def panel(grafana: dict[str, Any], where: str) -> dict[str, Any]:
    kind = grafana.get("type")
    if kind not in PANEL_PLUGINS:
        raise ConversionError(
            f"{where}: panel type {kind!r} has no Perses plugin (known: {sorted(PANEL_PLUGINS)})"
        )
    display = {"name": grafana.get("title", "")}
    if grafana.get("description"):
        display["description"] = grafana["description"]
    return {
        "kind": "Panel",
        "spec": {
            "display": display,
            "plugin": PANEL_PLUGINS[kind](grafana, where),
            "queries": _queries(grafana),
        },
    }


def variable(grafana: dict[str, Any], where: str) -> dict[str, Any]:
    match = LABEL_VALUES.fullmatch(grafana.get("query", ""))
    if not match:
        raise ConversionError(
            f"{where}: variable query {grafana.get('query')!r} is not label_values(selector, label)"
        )
    selector, label = match.groups()
    spec: dict[str, Any] = {
        "name": grafana["name"],
        "display": {"name": grafana.get("label") or grafana["name"], "hidden": False},
        "allowMultiple": bool(grafana.get("multi")),
        "allowAllValue": bool(grafana.get("includeAll")),
        "sort": SORTS.get(grafana.get("sort", 0), "none"),
        "plugin": {
            "kind": "PrometheusLabelValuesVariable",
            "spec": {"labelName": label, "matchers": [selector]},
        },
    }
    if grafana.get("includeAll"):
        spec["customAllValue"] = grafana.get("allValue") or ".*"
        spec["defaultValue"] = "$__all"
    return {"kind": "ListVariable", "spec": spec}


def _duration(grafana_from: str, where: str) -> str:
    match = GRAFANA_TIME.fullmatch(grafana_from)
    if not match:
        raise ConversionError(f"{where}: time.from {grafana_from!r} is not now-<duration>")
    return match.group(1)


def convert(board: dict[str, Any], project: str = PROJECT) -> Converted:
    """One Grafana dashboard (the build's JSON) as a Perses `Dashboard` resource."""
    name = board.get("uid")
    if not isinstance(name, str) or not re.fullmatch(r"[a-zA-Z0-9_.-]+", name):
        raise ConversionError(f"dashboard uid {name!r} is not a Perses name ([a-zA-Z0-9_.-]+)")
    panels: dict[str, dict[str, Any]] = {}
    layouts: list[dict[str, Any]] = []
    row_y = 0
    items: list[dict[str, Any]] = []
    title: str | None = None

    def close_row() -> None:
        if items or title is not None:
            spec: dict[str, Any] = {"items": list(items)}
            if title is not None:
                spec["display"] = {"title": title, "collapse": {"open": True}}
            layouts.append({"kind": "Grid", "spec": spec})

    for grafana in board.get("panels", []):
        where = f"{name} / {grafana.get('title', grafana.get('id'))}"
        pos = grafana["gridPos"]
        if grafana.get("type") == "row":
            close_row()
            items, title, row_y = [], grafana.get("title", ""), pos["y"] + pos["h"]
            continue
        key = f"panel{grafana['id']}"
        panels[key] = panel(grafana, where)
        items.append(
            {
                "x": pos["x"],
                "y": pos["y"] - row_y,
                "width": pos["w"],
                "height": pos["h"],
                "content": {"$ref": f"#/spec/panels/{key}"},
            }
        )
    close_row()
    variables = [
        variable(v, f"{name} / variable {v.get('name')}")
        for v in board.get("templating", {}).get("list", [])
        if v.get("type") == "query"
    ]
    spec: dict[str, Any] = {
        "display": {"name": board.get("title", name), "description": board.get("description", "")},
        "duration": _duration(board.get("time", {}).get("from", "now-6h"), name),
        "refreshInterval": board.get("refresh") or "0s",
        "variables": variables,
        "panels": panels,
        "layouts": layouts,
    }
    resource = {"kind": "Dashboard", "metadata": {"name": name, "project": project}, "spec": spec}
    return Converted(name=name, filename=f"{name}.json", resource=resource)


RESOURCES_HEADER = """\
# Generated by `gpulens dashboards build` from dashboards/*.py -- do not edit by hand.
# The gpulens dashboards for Perses (perses-operator's PersesDashboard, perses.dev/v1alpha1), the
# same dashboards as the Grafana ConfigMaps. Not in kustomization.yaml: apply it where the Perses
# operator runs (kubectl apply -f), with a Prometheus datasource as the project's default.
"""


def render_resources(converted: list[Converted], namespace: str = NAMESPACE) -> str:
    """A multi-document YAML of `PersesDashboard` resources; each is one line of JSON (valid YAML),
    so the output is byte-stable without a YAML emitter's line folding."""
    docs = []
    for item in converted:
        resource = {
            "apiVersion": API_VERSION,
            "kind": "PersesDashboard",
            "metadata": {
                "name": item.name,
                "namespace": namespace,
                "labels": {
                    "app.kubernetes.io/name": "gpulens-dashboards",
                    "app.kubernetes.io/part-of": "gpulens",
                },
            },
            "spec": item.resource["spec"],
        }
        docs.append(json.dumps(resource, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n")
    return RESOURCES_HEADER + "---\n" + "---\n".join(docs)
