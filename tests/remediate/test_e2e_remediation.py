"""End to end: simulated faults -> exporter -> Prometheus (shipped rules) -> Alertmanager (shipped
config) -> `gpulens remediate` (dry-run).

The `faults` scenario injects Xid 79 on GPU 2 at 15 s (5 s in the copy run here, every later fault
10 s sooner too: until the Xid the test only waits), after which the GPU is lost for 40 s. The
critical GPUXidFallenOffBus alert must reach the webhook with the node and GPU labels, the webhook
must name that node in its dry-run action, and GPULost (a symptom of the same GPU, which also asks
for isolation) must be inhibited by Alertmanager and never reach the webhook.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulens.sim.scenariofile import BUILTIN_DIR
from tests.alerts import rulefiles
from tests.alerts.test_alertmanager import shipped_config_copy
from tests.support.procs import alertmanager, exporter, free_port, prometheus, running

NODE = "gpu-faulty-01"  # the scenario's hostname; Prometheus relabels the instance to it
TOKEN = "e2e-webhook-token"


def _json(url: str) -> Any:  # a JSON document: its shape is what the tests check
    """GET with the webhook's bearer token: /-/state is behind the same credentials as /alerts."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _wait(what: str, probe, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.25)
    raise AssertionError(f"{what} within {timeout:.0f}s")


SOONER_S = 10


def faults_sooner(tmp_path: Path) -> Path:
    """The `faults` scenario with every fault from its Xid 79 (at 15 s) on SOONER_S earlier; the
    driver-not-loaded start (0-2 s) stays first and the timeline's order is unchanged."""
    doc = yaml.safe_load((BUILTIN_DIR / "faults.yaml").read_text())
    for entry in doc["faults"]["timeline"]:
        at = int(entry["at"].removesuffix("s"))
        if at >= 15:
            entry["at"] = f"{at - SOONER_S}s"
    path = tmp_path / "faults-sooner.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
def test_xid79_isolates_its_node_and_the_lost_gpu_symptom_is_inhibited(tmp_path):
    token = tmp_path / "webhook.token"
    token.write_text(TOKEN + "\n")
    port = free_port()
    webhook = f"http://127.0.0.1:{port}"
    remediate_cmd = [
        sys.executable,
        "-m",
        "gpulens.cli",
        "remediate",
        "--backend",
        "slurm",
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--token-file",
        str(token),
    ]
    relabel = {
        "relabel_configs": [
            {
                "source_labels": ["__address__"],
                "regex": r"127\.0\.0\.1:(\d+)",
                "target_label": "instance",
                "replacement": f"{NODE}:$1",
            }
        ]
    }
    with running(remediate_cmd, f"{webhook}/-/healthy", tmp_path / "remediate.log"):
        am_config = shipped_config_copy(
            tmp_path, webhook_url=f"{webhook}/alerts", token_file=token, group_wait="1s"
        )
        with (
            alertmanager(tmp_path, am_config) as am,
            exporter(tmp_path, "--simulate", str(faults_sooner(tmp_path)), "--interval", "1") as target,
        ):
            started = time.monotonic()
            rules = [rulefiles.RECORDING_RULES, rulefiles.ALERT_RULES]
            with prometheus(
                tmp_path, [target], rule_files=rules, alertmanager_url=am, scrape_config=relabel
            ) as prom:

                def actions() -> list[dict]:
                    items: list[dict[str, Any]] = _json(f"{webhook}/-/state")["actions"]
                    return items

                def xid79() -> list[dict]:
                    return [a for a in actions() if a["alertname"] == "GPUXidFallenOffBus"]

                (action, *_) = _wait(
                    "GPUXidFallenOffBus at the webhook", xid79, timeout=90 - (time.monotonic() - started)
                )
                assert (action["node"], action["gpu"], action["kind"]) == (NODE, "2", "isolate_node")
                assert action["result"] == "dry_run"
                assert action["detail"].startswith(
                    f"DRY-RUN slurm: scontrol update NodeName={NODE} State=DRAIN"
                )
                assert "gpulens: GPUXidFallenOffBus gpu 2 GPU-" in action["detail"]

                # the alert itself, as Alertmanager holds it: the right node and GPU labels
                (am_alert,) = [
                    a
                    for a in _json(f"{am}/api/v2/alerts")
                    if a["labels"]["alertname"] == "GPUXidFallenOffBus"
                ]
                assert am_alert["labels"]["instance"] == f"{NODE}:{target.rsplit(':', 1)[1]}"
                assert am_alert["labels"]["gpu"] == "2"
                assert am_alert["labels"]["severity"] == "critical"
                assert am_alert["labels"]["uuid"].startswith("GPU-")

                # GPULost of the same GPU fires in Prometheus but Alertmanager suppresses it
                prom.wait_for('ALERTS{alertname="GPULost",gpu="2",alertstate="firing"}', timeout=60)

                def lost_suppressed() -> list[dict]:
                    return [
                        a
                        for a in _json(f"{am}/api/v2/alerts")
                        if a["labels"]["alertname"] == "GPULost"
                        and a["labels"]["gpu"] == "2"
                        and a["status"]["state"] == "suppressed"
                        and a["status"]["inhibitedBy"]
                    ]

                _wait("GPULost suppressed by inhibition", lost_suppressed, timeout=20)
                time.sleep(3)  # several group intervals (1 s in this copy of the config)
                isolations = {(a["alertname"], a["gpu"]) for a in actions()}

                # every shipped rule evaluated cleanly on real exporter output (no many-to-many joins)
                unhealthy = [
                    (r["name"], r.get("lastError"))
                    for g in prom.get("/api/v1/rules")["groups"]
                    for r in g["rules"]
                    if r.get("health") != "ok"
                ]
    assert unhealthy == []
    assert ("GPULost", "2") not in isolations
    assert all(name != "GPULost" for name, _ in isolations)
