"""The Perses dashboards: converted from the same build as the Grafana JSON, committed, and true to
it (panels, queries, layout, variables, units). tests/dashboards/test_render.py draws them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulens.dashboards import perses
from gpulens.dashboards.build import DEFAULT_PERSES_RESOURCES, build, render_all, render_perses
from tests.dashboards.model import REPO, dashboards, panels

PERSES_DIR = REPO / "dashboards" / "perses"
RESOURCES = REPO / "deploy" / "perses" / "perses-dashboards.yaml"


def converted() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(PERSES_DIR.glob("*.json"))}


def test_committed_perses_files_equal_a_fresh_build() -> None:
    fresh = render_perses(render_all())
    assert {c.filename for c in fresh} == {p.name for p in PERSES_DIR.glob("*.json")}
    for item in fresh:
        assert (PERSES_DIR / item.filename).read_text(encoding="utf-8") == item.text, item.filename
    assert DEFAULT_PERSES_RESOURCES == RESOURCES
    assert RESOURCES.read_text(encoding="utf-8") == perses.render_resources(fresh)


def test_a_build_elsewhere_writes_perses_beside_the_grafana_json_and_the_configmap(tmp_path: Path) -> None:
    configmap = tmp_path / "k8s" / "dashboards-configmap.yaml"
    configmap.parent.mkdir()
    build(tmp_path / "json", configmap)
    assert {p.name for p in (tmp_path / "json" / "perses").glob("*.json")} == {
        p.name for p in PERSES_DIR.glob("*.json")
    }
    assert (tmp_path / "k8s" / "perses-dashboards.yaml").is_file()
    (tmp_path / "json" / "perses" / "gpulens-old.json").write_text("{}")
    outcome = build(tmp_path / "json", configmap, check=True)
    assert outcome.removed == [tmp_path / "json" / "perses" / "gpulens-old.json"]


def test_every_grafana_panel_becomes_a_perses_panel_with_the_same_queries_and_description() -> None:
    for uid, grafana in dashboards().items():
        spec = converted()[uid]["spec"]
        data = [p for p in panels(grafana) if p["type"] != "row"]
        assert len(spec["panels"]) == len(data), uid
        for panel in data:
            mine = spec["panels"][f"panel{panel['id']}"]["spec"]
            assert mine["display"]["name"] == panel["title"]
            assert mine["display"]["description"] == panel["description"]
            queries = [q["spec"]["plugin"]["spec"]["query"] for q in mine["queries"]]
            assert queries == [t["expr"] for t in panel["targets"]], f"{uid} / {panel['title']}"


def test_panel_kinds_map_to_perses_plugins() -> None:
    kinds = {
        "timeseries": "TimeSeriesChart",
        "heatmap": "TimeSeriesChart",
        "stat": "StatChart",
        "table": "Table",
    }
    for uid, grafana in dashboards().items():
        spec = converted()[uid]["spec"]
        for panel in panels(grafana):
            if panel["type"] != "row":
                plugin = spec["panels"][f"panel{panel['id']}"]["spec"]["plugin"]["kind"]
                assert plugin == kinds[panel["type"]], f"{uid} / {panel['title']}"


def test_every_panel_is_placed_once_in_a_grid_per_grafana_row() -> None:
    for uid, grafana in dashboards().items():
        spec = converted()[uid]["spec"]
        rows = [p["title"] for p in grafana["panels"] if p["type"] == "row"]
        assert [layout["spec"]["display"]["title"] for layout in spec["layouts"]] == rows
        refs = [item["content"]["$ref"] for layout in spec["layouts"] for item in layout["spec"]["items"]]
        assert sorted(refs) == sorted(f"#/spec/panels/{key}" for key in spec["panels"])
        for layout in spec["layouts"]:
            for item in layout["spec"]["items"]:
                assert item["y"] >= 0 and item["x"] + item["width"] <= 24


def test_query_variables_become_prometheus_label_values_variables() -> None:
    spec = converted()["gpulens-node"]["spec"]
    variables = {v["spec"]["name"]: v["spec"] for v in spec["variables"]}
    assert list(variables) == ["cluster", "job", "node", "gpu"]  # the datasource variable is dropped
    assert variables["gpu"]["plugin"] == {
        "kind": "PrometheusLabelValuesVariable",
        "spec": {
            "labelName": "gpu",
            "matchers": ['gpu_info{cluster=~"$cluster", job=~".*gpulens.*", job=~"$job", instance=~"$node"}'],
        },
    }
    assert variables["gpu"]["allowAllValue"] and variables["gpu"]["customAllValue"] == ".*"
    assert variables["gpu"]["sort"] == "numerical-asc"
    assert not variables["node"]["allowMultiple"]  # the node dashboard shows one node


def test_units_map_to_perses_formats() -> None:
    assert perses.unit("percentunit", "x") == {"unit": "percent-decimal"}
    assert perses.unit("Bps", "x") == {"unit": "bytes/sec"}
    assert perses.unit("watt", "x") == {"unit": "decimal"}  # Perses 0.52 has no watt


def test_an_unknown_unit_is_one_line_naming_the_panel() -> None:
    with pytest.raises(perses.ConversionError, match=r"^board / Power: unit 'kW' has no Perses mapping"):
        perses.unit("kW", "board / Power")


def test_an_unknown_panel_type_is_one_line_naming_the_panel() -> None:
    board = {
        "uid": "b",
        "panels": [
            {"type": "piechart", "title": "Pie", "id": 1, "gridPos": {"x": 0, "y": 0, "w": 4, "h": 4}}
        ],
    }
    with pytest.raises(perses.ConversionError, match=r"^b / Pie: panel type 'piechart' has no Perses plugin"):
        perses.convert(board)


def test_a_variable_that_is_not_label_values_is_one_line() -> None:
    board = {
        "uid": "b",
        "templating": {"list": [{"name": "x", "type": "query", "query": "query_result(up)"}]},
    }
    with pytest.raises(perses.ConversionError, match=r"^b / variable x: variable query"):
        perses.convert(board)


def test_resources_are_persesdashboards_with_the_dashboard_spec() -> None:
    documents = [d for d in yaml.safe_load_all(RESOURCES.read_text(encoding="utf-8")) if d]
    assert {d["metadata"]["name"] for d in documents} == set(converted())
    for document in documents:
        assert document["apiVersion"] == "perses.dev/v1alpha1" and document["kind"] == "PersesDashboard"
        assert document["metadata"]["namespace"] == "gpulens"
        assert document["spec"] == converted()[document["metadata"]["name"]]["spec"]
