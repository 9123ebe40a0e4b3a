"""Read the shipped rule, test and contract files once, for the alert tests."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS_DIR = REPO / "alerts"
ALERT_RULES = ALERTS_DIR / "gpu_alerts.yml"
RECORDING_RULES = ALERTS_DIR / "recording_rules.yml"
ANALYZER_RULES = ALERTS_DIR / "analyzer_rules.yml"  # generated: gpulens.analyzer.sources.rules
RULE_TESTS = sorted((ALERTS_DIR / "tests").glob("*.yml"))
RUNBOOKS = ALERTS_DIR / "runbooks"
ALERTMANAGER_CONFIG = ALERTS_DIR / "alertmanager.yml"
METRICS_DOC = REPO / "docs" / "metrics.md"
RUNBOOK_BASE = "https://github.com/gpulens/gpulens/blob/main/alerts/runbooks/"

# Prometheus' own series that the rules may use besides the gpulens contract.
PROMETHEUS_SERIES = {"up"}


@dataclass(frozen=True)
class Rule:
    group: str
    name: str  # alert name or recorded series
    is_alert: bool
    expr: str
    labels: dict[str, Any]
    annotations: dict[str, Any]
    for_: str | None


def load_rules(path: Path) -> list[Rule]:
    doc = yaml.safe_load(path.read_text())
    rules = []
    for group in doc["groups"]:
        for raw in group["rules"]:
            is_alert = "alert" in raw
            rules.append(
                Rule(
                    group["name"],
                    raw["alert"] if is_alert else raw["record"],
                    is_alert,
                    raw["expr"],
                    raw.get("labels", {}),
                    raw.get("annotations", {}),
                    raw.get("for"),
                )
            )
    return rules


def alerts() -> list[Rule]:
    return [r for r in load_rules(ALERT_RULES) if r.is_alert]


def recordings() -> list[Rule]:
    return load_rules(RECORDING_RULES) + load_rules(ANALYZER_RULES)


@dataclass(frozen=True)
class AlertCase:
    file: str
    alertname: str
    eval_time: str
    fires: bool


def alert_cases() -> list[AlertCase]:
    cases = []
    for path in RULE_TESTS:
        doc = yaml.safe_load(path.read_text())
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.append(
                    AlertCase(
                        path.name, case["alertname"], str(case["eval_time"]), bool(case.get("exp_alerts"))
                    )
                )
    return cases


def promql_test_exprs() -> list[str]:
    exprs = []
    for path in RULE_TESTS:
        doc = yaml.safe_load(path.read_text())
        for test in doc["tests"]:
            exprs += [case["expr"] for case in test.get("promql_expr_test", [])]
    return exprs


def contract_metrics() -> set[str]:
    """Family names in the first column of docs/metrics.md's table."""
    names: set[str] = set()
    for line in METRICS_DOC.read_text().splitlines():
        if not line.startswith("| ") or line.startswith("| family") or line.startswith("|---"):
            continue
        first_cell = line.split("|")[1]
        names.update(n.strip().strip("`") for n in first_cell.split(","))
    return {n for n in names if n}


_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_SELECTOR = re.compile(r"\{[^}]*\}")
_STRING = re.compile(r'"[^"]*"')
_RANGE = re.compile(r"\[[^\]]*\]")
_OFFSET = re.compile(r"\boffset\s+\d+[smhdwy]+")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LANGUAGE = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "time",
    "increase",
    "rate",
    "avg_over_time",
    "max_over_time",
    "min_over_time",
    "changes",
    "printf",
    "humanizeDuration",
}


def referenced_series(expr: str) -> set[str]:
    """Metric names an expression reads (label names, functions and keywords removed)."""
    text = _STRING.sub(" ", expr)
    text = _SELECTOR.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        name = match.group(0)
        rest = text[match.end() :].lstrip()
        if name in _LANGUAGE or rest.startswith("("):
            continue
        names.add(name)
    return names
