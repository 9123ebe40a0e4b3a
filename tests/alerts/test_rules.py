"""The shipped alert and recording rules: valid, unit-tested, documented, and on the metric contract."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.alerts import rulefiles
from tests.support.procs import PROMETHEUS_ENGINES, find_binary, use_prometheus

ALERTS = rulefiles.alerts()
ALERT_NAMES = [a.name for a in ALERTS]
CASES = rulefiles.alert_cases()


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=rulefiles.ALERTS_DIR, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
def test_promtool_check_rules_accepts_every_rule_file(engine, monkeypatch):
    use_prometheus(engine, monkeypatch)
    promtool = find_binary("promtool")
    files = (rulefiles.RECORDING_RULES, rulefiles.ANALYZER_RULES, rulefiles.ALERT_RULES)
    result = _run(promtool, "check", "rules", *[str(p) for p in files])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
def test_promtool_unit_tests_pass(engine, monkeypatch):
    use_prometheus(engine, monkeypatch)
    promtool = find_binary("promtool")
    result = _run(promtool, "test", "rules", *[str(p) for p in rulefiles.RULE_TESTS])
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_names_are_unique():
    assert len(ALERT_NAMES) == len(set(ALERT_NAMES))


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_alert_has_a_firing_test(name):
    assert any(c.alertname == name and c.fires for c in CASES), f"no promtool case where {name} fires"


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_alert_has_a_not_firing_test(name):
    assert any(c.alertname == name and not c.fires for c in CASES), f"no promtool case where {name} is silent"


def test_every_tested_alert_exists():
    unknown = {c.alertname for c in CASES} - set(ALERT_NAMES)
    assert not unknown, f"tests name alerts that are not in gpu_alerts.yml: {sorted(unknown)}"


@pytest.mark.parametrize("rule", rulefiles.recordings(), ids=lambda r: r.name)
def test_recording_rule_is_unit_tested(rule):
    exprs = rulefiles.promql_test_exprs()
    covered = any(rule.name in e or _regex_covers(e, rule.name) for e in exprs)
    assert covered, f"{rule.name} has no promql test"


def _regex_covers(expr: str, name: str) -> bool:
    match = re.search(r'__name__=~"([^"]+)"', expr)
    return bool(match and re.fullmatch(match.group(1), name))


@pytest.mark.parametrize("rule", rulefiles.recordings(), ids=lambda r: r.name)
def test_recording_rule_names_follow_level_metric_operations(rule):
    assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule.name), rule.name


@pytest.mark.parametrize("rule", ALERTS, ids=lambda r: r.name)
def test_alert_follows_the_conventions(rule):
    assert re.fullmatch(r"GPU[A-Z][A-Za-z0-9]*", rule.name), "CamelCase name with a GPU prefix"
    assert rule.labels.get("severity") in {"critical", "warning", "info"}
    assert rule.labels.get("scope") in {"node", "gpu", "job"}
    assert rule.labels.get("class") in {"fault", "symptom", "availability", "exporter", "change", "waste"}
    assert rule.labels.get("remediate", "isolate_gpu") in {"isolate_gpu", "isolate_node"}
    assert rule.annotations.get("summary", "").endswith("."), "summary is one sentence"
    assert "{{ $labels.instance }}" in rule.annotations.get("description", ""), "description names the node"
    assert rule.annotations.get("runbook_url") == f"{rulefiles.RUNBOOK_BASE}{rule.name}.md"


@pytest.mark.parametrize("rule", [a for a in ALERTS if a.labels.get("scope") == "gpu"], ids=lambda r: r.name)
def test_gpu_alert_description_names_gpu_and_uuid(rule):
    description = rule.annotations["description"]
    assert "{{ $labels.gpu }}" in description and "{{ $labels.uuid }}" in description


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_alert_has_a_runbook(name):
    runbook = rulefiles.RUNBOOKS / f"{name}.md"
    assert runbook.is_file(), f"missing {runbook.relative_to(rulefiles.REPO)}"
    assert runbook.read_text().startswith(f"# {name}\n")


def test_runbooks_belong_to_alerts():
    orphans = {p.stem for p in rulefiles.RUNBOOKS.glob("*.md")} - set(ALERT_NAMES) - {"README"}
    assert not orphans, f"runbooks without an alert: {sorted(orphans)}"


def test_xid_alerts_use_the_counter_never_a_last_value_gauge():
    for rule in ALERTS:
        if rule.name.startswith("GPUXid"):
            assert "increase(gpu_xid_errors_total" in rule.expr, rule.name
            assert "gpu_xid_last_timestamp_seconds" not in rule.expr, rule.name


def test_remediation_is_only_requested_for_reset_reboot_or_rma_faults():
    remediated = {a.name for a in ALERTS if "remediate" in a.labels}
    assert remediated == {
        "GPUXidResetRequired",
        "GPUXidDoubleBitEccError",
        "GPUXidNvlinkError",
        "GPUXidFallenOffBus",
        "GPUXidAuxPowerDisconnected",
        "GPURowRemapPending",
        "GPURowRemapFailed",
        "GPURetiredPagesPending",
        "GPURetiredPagesLimitReached",
        "GPULost",
        "GPUCountDropped",
    }


def test_referenced_series_exist_in_the_metric_contract():
    contract = rulefiles.contract_metrics()
    recorded = {r.name for r in rulefiles.recordings()}
    known = contract | recorded | rulefiles.PROMETHEUS_SERIES
    for rule in rulefiles.recordings() + ALERTS:
        unknown = rulefiles.referenced_series(rule.expr) - known
        assert not unknown, f"{rule.name} reads series missing from docs/metrics.md: {sorted(unknown)}"


def test_series_extraction_ignores_labels_functions_and_keywords():
    expr = 'max by (instance, gpu_instance) (rate(gpu_x_total{xid=~"13|31"}[5m])) > on (gpu) gpu_y offset 1h'
    assert rulefiles.referenced_series(expr) == {"gpu_x_total", "gpu_y"}


@pytest.mark.parametrize("rule", ALERTS, ids=lambda r: r.name)
def test_runbook_shows_the_current_rule(rule):
    text = (rulefiles.RUNBOOKS / f"{rule.name}.md").read_text()
    match = re.search(r"```promql\n(.*?)\n```", text, re.S)
    assert match, "the runbook quotes the rule's expression"
    assert match.group(1) == rule.expr.strip(), "runbook out of date with gpu_alerts.yml"
    assert f"Severity **{rule.labels['severity']}**" in text
    for section in (
        "## What it means",
        "## NVIDIA's action",
        "## Reset, reboot or RMA",
        "## What to do",
        "## Escalate when",
    ):
        assert section in text


def test_every_remediation_alert_names_its_recovery_class():
    from gpulens.remediate.episodes import Recovery

    classes = {a.name: a.labels.get("recovery") for a in ALERTS if "remediate" in a.labels}
    assert {Recovery(value) for value in classes.values()} <= {
        Recovery.RESET_GPU,
        Recovery.REBOOT_NODE,
        Recovery.RMA,
    }
    # NVIDIA's buckets: RESET_GPU / WORKFLOW_XID_48 / NVLink and pending remaps reset the GPU,
    # RESTART_BM and a GPU gone from the bus need the node rebooted, failed remaps and the
    # retired-pages limit are RMA cases
    assert classes["GPUXidResetRequired"] == classes["GPURowRemapPending"] == "reset_gpu"
    assert classes["GPUXidFallenOffBus"] == classes["GPULost"] == "reboot_node"
    assert classes["GPURowRemapFailed"] == classes["GPURetiredPagesLimitReached"] == "rma"
    assert all("recovery" not in a.labels for a in ALERTS if "remediate" not in a.labels)


@pytest.mark.parametrize("rule", [a for a in ALERTS if "remediate" in a.labels], ids=lambda r: r.name)
def test_runbooks_of_remediated_alerts_say_which_steps_are_automatic(rule):
    text = (rulefiles.RUNBOOKS / f"{rule.name}.md").read_text()
    assert "## Automatic steps (`gpulens remediate`)" in text
    assert f"`recovery={rule.labels['recovery']}`" in text
