"""The generated dashboards: reproducible, complete, modern, linked, and written against the contract."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpulens.dashboards import build as dashboards_build
from gpulens.dashboards.common import RUNBOOK_ALERT_FIELD, SLUGS, UID_FLEET, UID_JOBS, UID_NODE
from gpulens.promscope.config import DEFAULT
from tests.dashboards.model import (
    CONFIGMAP,
    JSON_DIR,
    REPO,
    dashboards,
    data_panels,
    link_urls,
    linked_uid,
    metric_names,
    panels,
)

EXPECTED_UIDS = set(SLUGS)
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
MODERN_PANEL_TYPES = {"row", "timeseries", "stat", "table", "heatmap"}
DEPRECATED_PANEL_TYPES = {
    "graph",
    "singlestat",
    "table-old",
    "grafana-piechart-panel",
    "grafana-worldmap-panel",
}
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "ALERTS"}
# published by the analyzer (`gpulens recommend`), not by the exporter
ANALYZER_METRICS = {"gpulens_recommendation_info", "gpulens_recommendation_confidence"}


def contract_metrics() -> set[str]:
    """Every family named in the first column of docs/metrics.md's table."""
    names: set[str] = set()
    for line in (REPO / "docs" / "metrics.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| ") and not line.startswith("| family") and not line.startswith("|---"):
            first = line.split("|")[1]
            names.update(n.strip() for n in first.split(",") if n.strip())
    return names


def recording_rules() -> set[str]:
    rules = yaml.safe_load((REPO / "alerts" / "recording_rules.yml").read_text(encoding="utf-8"))
    return {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}


# --- reproducible build -----------------------------------------------------------------------------


def test_rendering_twice_gives_identical_bytes() -> None:
    first = dashboards_build.render_all()
    second = dashboards_build.render_all()
    assert [r.text for r in first] == [r.text for r in second]
    assert dashboards_build.render_configmap(first) == dashboards_build.render_configmap(second)


def test_committed_json_and_configmap_equal_a_fresh_build() -> None:
    outcome = dashboards_build.build(check=True)
    assert outcome.changed == [] and outcome.removed == [], (
        f"stale generated files {outcome.changed + outcome.removed}: run `gpulens dashboards build`"
    )


def test_build_writes_every_dashboard_and_then_reports_up_to_date(tmp_path: Path) -> None:
    configmap = tmp_path / "cm.yaml"
    first = dashboards_build.build(tmp_path / "json", configmap)
    # the Grafana JSON and, in perses/, the Perses JSON of the same names; the ConfigMap and the
    # PersesDashboard resources beside it
    assert {p.name for p in first.changed} == {f"{uid}.json" for uid in EXPECTED_UIDS} | {
        "cm.yaml",
        "perses-dashboards.yaml",
    }
    assert len(first.changed) == 2 * len(EXPECTED_UIDS) + 2
    second = dashboards_build.build(tmp_path / "json", configmap)
    assert second.changed == [] and second.removed == []


def test_check_names_edited_and_stale_files_and_build_repairs_them(tmp_path: Path) -> None:
    out = tmp_path / "json"
    dashboards_build.build(out, None)
    edited = out / "gpulens-fleet.json"
    edited.write_text(edited.read_text() + " ", encoding="utf-8")
    stale = out / "old-dashboard.json"
    stale.write_text("{}", encoding="utf-8")
    cmd = [sys.executable, "-m", "gpulens.dashboards", "build", "--out", str(out), "--no-configmap"]
    checked = subprocess.run([*cmd, "--check"], capture_output=True, text=True, check=False)
    assert checked.returncode == 1
    assert "gpulens-fleet.json" in checked.stderr and "old-dashboard.json" in checked.stderr
    subprocess.run(cmd, capture_output=True, check=True)
    assert not stale.exists()
    assert subprocess.run([*cmd, "--check"], capture_output=True, check=False).returncode == 0


def test_gpulens_cli_exposes_dashboards_build(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "dashboards",
            "build",
            "--out",
            str(tmp_path),
            "--no-configmap",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert len(list(tmp_path.glob("*.json"))) == len(EXPECTED_UIDS)


def test_missing_configmap_directory_is_one_clear_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.dashboards", "build", "--out", str(tmp_path), "--configmap",
         str(tmp_path / "nope" / "cm.yaml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--configmap" in result.stderr


# --- every dashboard --------------------------------------------------------------------------------


def test_every_expected_dashboard_is_generated_with_a_stable_uid_and_title() -> None:
    boards = dashboards()
    assert set(boards) == EXPECTED_UIDS
    for uid, board in boards.items():
        assert board["title"], uid
        assert (JSON_DIR / f"{uid}.json").exists()
        assert "gpulens" in board["tags"]


@pytest.mark.parametrize("uid", sorted(EXPECTED_UIDS))
def test_dashboard_has_datasource_node_and_gpu_variables(uid: str) -> None:
    variables = {v["name"]: v for v in dashboards()[uid]["templating"]["list"]}
    assert {"datasource", "node", "gpu"} <= set(variables)
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for name in ("node", "gpu"):
        assert variables[name]["datasource"] == DATASOURCE
        assert variables[name]["query"].startswith("label_values(")


def test_jobs_dashboard_selects_one_job_by_job_id() -> None:
    variables = {v["name"]: v for v in dashboards()[UID_JOBS]["templating"]["list"]}
    assert variables["job_id"]["query"].startswith("label_values(gpu_job_info")
    assert variables["job_id"]["multi"] is False


def test_no_panel_uses_a_deprecated_or_unknown_type() -> None:
    for board in dashboards().values():
        for panel in panels(board):
            assert panel["type"] not in DEPRECATED_PANEL_TYPES, panel["title"]
            assert panel["type"] in MODERN_PANEL_TYPES, panel["title"]


def test_every_panel_and_target_queries_the_datasource_variable() -> None:
    for ref in data_panels():
        assert ref.panel["datasource"] == DATASOURCE, ref.name
        assert ref.panel["targets"], ref.name
        for target in ref.panel["targets"]:
            assert target["datasource"] == DATASOURCE, ref.name
            assert target["expr"].strip(), ref.name


def test_every_panel_has_a_unit() -> None:
    for ref in data_panels():
        assert ref.panel["fieldConfig"]["defaults"].get("unit"), ref.name


def test_panels_of_ratio_metrics_are_percentunit_pinned_to_0_1() -> None:
    checked = 0
    for ref in data_panels():
        names = set().union(*(metric_names(e) for e in ref.exprs))
        arithmetic = any(re.search(r"\d\s*\*|\*\s*\d|count|sum\b|time\(\)", e) for e in ref.exprs)
        if names and all(n.endswith("ratio") for n in names) and not arithmetic:
            checked += 1
            defaults = ref.panel["fieldConfig"]["defaults"]
            assert defaults["unit"] == "percentunit", ref.name
            if ref.panel["type"] == "timeseries":
                assert (defaults["min"], defaults["max"]) == (0, 1), ref.name
    assert checked >= 15


def test_rates_use_rate_interval_and_increases_a_deliberate_window() -> None:
    for ref in data_panels():
        for expr in ref.exprs:
            for window in re.findall(r"\brate\([^\[]*\[([^\]]+)\]", expr):
                assert window == "$__rate_interval", ref.name
            for window in re.findall(r"\bincrease\([^\[]*\[([^\]]+)\]", expr):
                assert window in {"$__rate_interval", "$__range", "1h"}, ref.name


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    for uid, board in dashboards().items():
        ids = [p["id"] for p in panels(board)]
        assert len(ids) == len(set(ids)), uid
        cells: set[tuple[int, int]] = set()
        for panel in panels(board):
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (uid, panel["title"])
            area = {
                (x, y)
                for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])
            }
            assert not cells & area, (uid, panel["title"])
            cells |= area


def test_expressions_only_select_contract_metrics_recording_rules_or_prometheus_series() -> None:
    known = contract_metrics() | recording_rules() | PROMETHEUS_OWN | ANALYZER_METRICS
    assert len(contract_metrics()) > 50
    for ref in data_panels():
        for expr in ref.exprs:
            unknown = metric_names(expr) - known
            assert not unknown, f"{ref.name}: {sorted(unknown)} not in docs/metrics.md or recording rules"


def test_recording_rules_are_used_where_they_exist() -> None:
    used = set().union(*(metric_names(e) for ref in data_panels() for e in ref.exprs))
    assert {"instance_gpu:gpu_sm_active:ratio", "instance_gpu:gpu_idle:bool"} <= used
    assert {
        "instance_gpu_job:gpu_job_memory_used:ratio",
        "instance_device:gpu_memory_total_bytes:max",
    } <= used


def test_per_instance_mig_panels_read_gpu_mig_families() -> None:
    sharing = [r for r in data_panels() if r.dashboard == "gpulens-sharing" and "instance" in r.title.lower()]
    assert sharing
    for ref in sharing:
        assert any("gpu_mig_" in e for e in ref.exprs), ref.name


def test_power_is_never_summed_over_mig_instance_series() -> None:
    for ref in data_panels():
        for expr in ref.exprs:
            if "gpu_power_watts" in expr and "gpu_mig_" in expr:
                # only the explicit SM-share estimate may combine them, and it divides by the total
                assert "gpu_mig_multiprocessors" in expr and "/ on (instance, gpu)" in expr, ref.name


# --- links ------------------------------------------------------------------------------------------


def test_every_link_resolves_to_a_generated_dashboard_or_a_runbook() -> None:
    runbook = DEFAULT.runbook_url(RUNBOOK_ALERT_FIELD)
    for uid, board in dashboards().items():
        urls = link_urls(board)
        assert urls, uid
        for url in urls:
            assert url == runbook or linked_uid(url) in EXPECTED_UIDS, f"{uid}: {url}"


def test_links_walk_overview_to_node_to_gpu_to_job() -> None:
    boards = dashboards()

    def targets(uid: str) -> list[str]:
        return [u for u in link_urls(boards[uid]) if "var-" in u]

    assert any(linked_uid(u) == UID_NODE and "var-node=" in u for u in targets(UID_FLEET))
    assert any(linked_uid(u) == UID_NODE and "var-gpu=" in u for u in targets(UID_NODE))
    assert any(linked_uid(u) == UID_JOBS and "var-job_id=" in u for u in targets(UID_NODE))
    assert any(linked_uid(u) == UID_JOBS and "var-job_id=" in u for u in targets(UID_FLEET))


def test_dashboard_links_carry_time_range_and_variables() -> None:
    for uid, board in dashboards().items():
        assert {linked_uid(link["url"]) for link in board["links"]} == EXPECTED_UIDS - {uid}
        for link in board["links"]:
            assert link["keepTime"] and link["includeVars"], uid


# --- deployment files -------------------------------------------------------------------------------


def test_configmaps_carry_the_sidecar_label_and_the_exact_dashboards() -> None:
    docs = [d for d in yaml.safe_load_all(CONFIGMAP.read_text(encoding="utf-8")) if d]
    assert len(docs) == len(EXPECTED_UIDS)
    boards = dashboards()
    for doc in docs:
        assert doc["kind"] == "ConfigMap"
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((filename, text),) = doc["data"].items()
        board = json.loads(text)
        assert filename == f"{board['uid']}.json"
        assert board == boards[board["uid"]]
        assert len(text.encode()) < 256 * 1024  # fits kubectl apply's last-applied annotation


def test_grafana_provisioning_points_at_prometheus_and_the_json_directory() -> None:
    base = REPO / "dashboards" / "provisioning"
    datasources = yaml.safe_load((base / "datasources" / "prometheus.yml").read_text(encoding="utf-8"))
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True and source["url"].startswith("http")
    providers = yaml.safe_load((base / "dashboards" / "gpulens.yml").read_text(encoding="utf-8"))
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")


def test_targets_have_unique_ref_ids_and_the_query_type_their_panel_needs() -> None:
    for ref in data_panels():
        ref_ids = [t["refId"] for t in ref.panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), ref.name
        for target in ref.panel["targets"]:
            if ref.panel["type"] == "table":
                assert target["instant"] and target["format"] == "table", ref.name
            elif ref.panel["type"] in {"timeseries", "heatmap"}:
                assert not target["instant"] and target["format"] == "time_series", ref.name


def test_merged_tables_rename_every_value_column() -> None:
    """A merged table names its value columns (`Value #A` ...) instead of showing refIds."""
    for ref in data_panels():
        transformations = ref.panel.get("transformations", [])
        if any(t["id"] == "merge" for t in transformations):
            (organize,) = [t for t in transformations if t["id"] == "organize"]
            shown = {f"Value #{t['refId']}" for t in ref.panel["targets"]}
            hidden = set(organize["options"]["excludeByName"])
            assert shown - hidden <= set(organize["options"]["renameByName"]), ref.name


def test_faulty_xids_are_exactly_the_codes_of_the_critical_xid_alerts() -> None:
    from gpulens.dashboards.common import CRITICAL_XIDS

    rules = yaml.safe_load((REPO / "alerts" / "gpu_alerts.yml").read_text(encoding="utf-8"))
    codes: set[int] = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if (
                rule.get("labels", {}).get("severity") == "critical"
                and "gpu_xid_errors_total" in rule["expr"]
            ):
                for matcher in re.findall(r'xid=~?"([0-9|]+)"', rule["expr"]):
                    codes |= {int(c) for c in matcher.split("|")}
    assert codes and set(CRITICAL_XIDS) == codes
