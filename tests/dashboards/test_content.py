"""What a reader of the dashboards gets besides the queries: a description on every panel, alerts
and Xid events marked on the time series, runbook links from the alert table, no null datasource,
and dashboards that are not editable in place (they are provisioned)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from gpulens.dashboards.build import apply_config, render_all
from gpulens.dashboards.common import RUNBOOK_ALERT_FIELD
from gpulens.dashboards.fleet import build as build_fleet
from gpulens.promscope.config import DEFAULT, MixinConfig
from tests.dashboards.model import dashboards, data_panels, panels

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def walk(node: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """(path, key, value) of every key in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, key, value
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from walk(item, f"{path}/{i}")


def test_every_panel_has_a_description() -> None:
    missing = [ref.name for ref in data_panels() if not ref.panel.get("description", "").strip()]
    assert not missing, missing


def test_no_datasource_is_null_anywhere() -> None:
    for uid, board in dashboards().items():
        nulls = [path for path, key, value in walk(board) if key == "datasource" and value is None]
        assert not nulls, f"{uid}: {nulls}"


def test_rows_use_the_datasource_variable() -> None:
    for uid, board in dashboards().items():
        rows = [p for p in panels(board) if p["type"] == "row"]
        assert rows and all(row["datasource"] == DATASOURCE for row in rows), uid


def test_dashboards_are_not_editable_by_default() -> None:
    assert {uid: board["editable"] for uid, board in dashboards().items()} == dict.fromkeys(
        dashboards(), False
    )


def annotation(board: dict[str, Any], name: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = [a for a in board["annotations"]["list"] if a["name"] == name]
    (found,) = matches
    return found


def test_firing_alerts_and_xid_events_are_marked_on_every_dashboards_time_series() -> None:
    for uid, board in dashboards().items():
        assert any(p["type"] == "timeseries" for p in panels(board)), uid
        alerts, xids = annotation(board, "Alerts"), annotation(board, "Xid events")
        for marker in (alerts, xids):
            assert marker["enable"] and marker["datasource"] == DATASOURCE, uid
            assert 'cluster=~"$cluster"' in marker["expr"] and 'job=~"$job"' in marker["expr"], uid
        assert alerts["expr"].startswith("ALERTS{") and 'alertstate="firing"' in alerts["expr"]
        assert alerts["titleFormat"] == "{{alertname}}"
        assert (
            xids["expr"].startswith("instance_gpu_xid:gpu_xid_errors:increase10m{") and "> 0" in xids["expr"]
        )
        assert xids["titleFormat"] == "Xid {{xid}}"


def alert_table_links(board: dict[str, Any]) -> list[dict[str, Any]]:
    (table,) = [p for p in panels(board) if p["title"] == "Open critical alerts"]
    return [
        link
        for override in table["fieldConfig"]["overrides"]
        if override["matcher"]["options"] == "alertname"
        for prop in override["properties"]
        if prop["id"] == "links"
        for link in prop["value"]
    ]


def test_the_open_alerts_table_links_each_alert_to_its_runbook() -> None:
    (link,) = alert_table_links(dashboards()["gpulens-fleet"])
    assert link["title"] == "Runbook"
    assert link["url"] == DEFAULT.runbook_url(RUNBOOK_ALERT_FIELD)
    assert link["url"].count("${__data.fields.alertname}") == 1


def test_runbook_links_follow_the_mixin_configs_pattern() -> None:
    config = MixinConfig(runbook_url_pattern="https://wiki.example.com/gpu/%s")
    (link,) = alert_table_links(apply_config(build_fleet().to_json_data(), config))
    assert link["url"] == "https://wiki.example.com/gpu/${__data.fields.alertname}"


def test_no_placeholder_survives_the_build() -> None:
    for rendered in render_all():
        assert "__gpulens_runbook_url" not in rendered.text, rendered.uid
        json.loads(rendered.text)
