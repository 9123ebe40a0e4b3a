"""The shipped Alertmanager config: valid, routes label sets to the intended receivers, inhibits symptoms."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alerts import rulefiles
from tests.support.procs import alertmanager, find_binary


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    amtool = find_binary("amtool")
    return subprocess.run([amtool, *args], capture_output=True, text=True, timeout=60)


def test_amtool_check_config_is_clean():
    result = _amtool("check-config", str(rulefiles.ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


ROUTES = [
    # a fault that asks for isolation reaches the webhook and still pages
    (
        {
            "alertname": "GPUXidFallenOffBus",
            "severity": "critical",
            "remediate": "isolate_node",
            "instance": "n1:9842",
            "gpu": "0",
        },
        ["gpulens-remediate", "pager"],
    ),
    (
        {
            "alertname": "GPURowRemapPending",
            "severity": "warning",
            "remediate": "isolate_gpu",
            "instance": "n1:9842",
            "gpu": "3",
        },
        ["gpulens-remediate", "tickets"],
    ),
    (
        {"alertname": "GPUTemperatureCritical", "severity": "critical", "instance": "n1:9842", "gpu": "1"},
        ["pager"],
    ),
    ({"alertname": "GPUNvlinkErrors", "severity": "warning", "instance": "n1:9842", "gpu": "1"}, ["tickets"]),
    # waste goes to the report channel only
    (
        {"alertname": "GPUAllocatedButIdle", "severity": "info", "route": "report", "instance": "n1:9842"},
        ["report"],
    ),
    ({"alertname": "GPUMigLayoutChanged", "severity": "info", "instance": "n1:9842"}, ["blackhole"]),
    # per-node routing: burn-in nodes open tickets instead of paging
    ({"alertname": "GPULost", "severity": "critical", "instance": "burnin-7:9842", "gpu": "0"}, ["tickets"]),
    ({"alertname": "SomethingElse", "instance": "n1:9842"}, ["tickets"]),
]


@pytest.mark.parametrize(
    ("labels", "receivers"), ROUTES, ids=[f"{i}-{r[0]['alertname']}" for i, r in enumerate(ROUTES)]
)
def test_route(labels, receivers):
    result = _amtool(
        "config",
        "routes",
        "test",
        f"--config.file={rulefiles.ALERTMANAGER_CONFIG}",
        *[f"{k}={v}" for k, v in labels.items()],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().split(",") == receivers


def test_notifications_are_grouped_per_node():
    config = yaml.safe_load(rulefiles.ALERTMANAGER_CONFIG.read_text())
    assert config["route"]["group_by"] == ["instance"]


def test_webhook_points_at_the_remediation_default_and_authenticates():
    config = yaml.safe_load(rulefiles.ALERTMANAGER_CONFIG.read_text())
    (receiver,) = [r for r in config["receivers"] if r["name"] == "gpulens-remediate"]
    (webhook,) = receiver["webhook_configs"]
    assert webhook["url"] == "http://127.0.0.1:9843/alerts"
    assert webhook["http_config"]["authorization"]["credentials_file"]


def _post_alerts(base: str, alerts: list[dict[str, Any]]) -> None:
    body = json.dumps([{"labels": a} for a in alerts]).encode()
    request = urllib.request.Request(
        f"{base}/api/v2/alerts", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def _states(base: str, want: dict[tuple[str, str, str], str]) -> dict[tuple[str, str, str], str]:
    """Alert states as Alertmanager lists them, polled until they read `want` or 20 s pass.

    Alertmanager feeds new alerts to its inhibitor asynchronously, so a target can list as
    "active" (not yet "unprocessed") before its source is known; a wrong state is only a
    failure if it still reads so at the deadline."""
    deadline = time.monotonic() + 20
    states: dict[tuple[str, str, str], str] = {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{base}/api/v2/alerts", timeout=10) as response:
            alerts = json.load(response)
        states = {
            (a["labels"]["alertname"], a["labels"]["instance"], a["labels"].get("gpu", "")): a["status"][
                "state"
            ]
            for a in alerts
        }
        if states == want:
            return states
        time.sleep(0.2)
    return states


def shipped_config_copy(
    tmp_path: Path,
    webhook_url: str | None = None,
    token_file: Path | None = None,
    group_wait: str | None = None,
) -> Path:
    """The shipped config with the webhook's URL, token file and group_wait adjusted for a test."""
    config = yaml.safe_load(rulefiles.ALERTMANAGER_CONFIG.read_text())
    (receiver,) = [r for r in config["receivers"] if r["name"] == "gpulens-remediate"]
    webhook = receiver["webhook_configs"][0]
    if webhook_url:
        webhook["url"] = webhook_url
    token = token_file or tmp_path / "token"
    if not token.exists():
        token.write_text("test-token\n")
    webhook["http_config"]["authorization"]["credentials_file"] = str(token)
    if group_wait:
        for route in [config["route"], *config["route"]["routes"]]:
            route["group_wait"] = group_wait
            route["group_interval"] = group_wait
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_inhibition_hides_symptoms_of_a_lost_gpu_and_a_down_exporter(tmp_path):
    config = shipped_config_copy(tmp_path)
    alerts = [
        # n1 GPU 0 fell off the bus: GPULost and its thermal alert are consequences; GPU 1 is not
        {
            "alertname": "GPUXidFallenOffBus",
            "severity": "critical",
            "scope": "gpu",
            "class": "fault",
            "remediate": "isolate_node",
            "instance": "n1:9842",
            "gpu": "0",
        },
        {
            "alertname": "GPULost",
            "severity": "critical",
            "scope": "gpu",
            "class": "availability",
            "remediate": "isolate_node",
            "instance": "n1:9842",
            "gpu": "0",
        },
        {
            "alertname": "GPUThermalSlowdown",
            "severity": "warning",
            "scope": "gpu",
            "class": "symptom",
            "instance": "n1:9842",
            "gpu": "0",
        },
        {
            "alertname": "GPUThermalSlowdown",
            "severity": "warning",
            "scope": "gpu",
            "class": "symptom",
            "instance": "n1:9842",
            "gpu": "1",
        },
        # collectors report failure while a GPU of the node is down
        {
            "alertname": "GPUExporterCollectorFailing",
            "severity": "warning",
            "scope": "node",
            "class": "exporter",
            "instance": "n1:9842",
            "collector": "memory",
        },
        # n2's exporter is down: its GPU alerts are stale
        {
            "alertname": "GPUExporterDown",
            "severity": "warning",
            "scope": "node",
            "class": "exporter",
            "instance": "n2:9842",
        },
        {
            "alertname": "GPURowRemapPending",
            "severity": "warning",
            "scope": "gpu",
            "class": "fault",
            "remediate": "isolate_gpu",
            "instance": "n2:9842",
            "gpu": "3",
        },
        # n3 GPU 2 is lost: its idle-job waste alert is noise, but its Xid fault still goes out
        {
            "alertname": "GPULost",
            "severity": "critical",
            "scope": "gpu",
            "class": "availability",
            "remediate": "isolate_node",
            "instance": "n3:9842",
            "gpu": "2",
        },
        {
            "alertname": "GPUAllocatedButIdle",
            "severity": "info",
            "scope": "job",
            "class": "waste",
            "route": "report",
            "instance": "n3:9842",
            "gpu": "2",
        },
        {
            "alertname": "GPUXidResetRequired",
            "severity": "critical",
            "scope": "gpu",
            "class": "fault",
            "remediate": "isolate_gpu",
            "instance": "n3:9842",
            "gpu": "2",
            "xid": "119",
        },
    ]
    want = {
        ("GPUXidFallenOffBus", "n1:9842", "0"): "active",
        ("GPULost", "n1:9842", "0"): "suppressed",
        ("GPUThermalSlowdown", "n1:9842", "0"): "suppressed",
        ("GPUThermalSlowdown", "n1:9842", "1"): "active",
        ("GPUExporterCollectorFailing", "n1:9842", ""): "suppressed",
        ("GPUExporterDown", "n2:9842", ""): "active",
        ("GPURowRemapPending", "n2:9842", "3"): "suppressed",
        ("GPULost", "n3:9842", "2"): "active",
        ("GPUAllocatedButIdle", "n3:9842", "2"): "suppressed",
        ("GPUXidResetRequired", "n3:9842", "2"): "active",
    }
    with alertmanager(tmp_path, config) as base:
        _post_alerts(base, alerts)
        states = _states(base, want)
    assert states == want
