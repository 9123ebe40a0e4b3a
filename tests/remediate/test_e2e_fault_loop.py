"""End to end, the whole fault loop (issue 18): the `faults` scenario's Xid 79 -> exporter ->
Prometheus (shipped rules) -> Alertmanager (shipped config) -> two `gpulens remediate --apply
--return-to-service` receivers, one on Slurm (the stateful scontrol stand-in), one on Kubernetes
(the API stand-in): each isolates the node, reboots it (the fault's class), waits for the alert to
resolve, checks the GPU's health in that Prometheus through the hold-down and returns the node;
the audit log and the metrics show every step with its time.

Two things are scaled for a test that runs in minutes: the scenario keeps only the Xid 79 fault of
`faults` (its other faults never clear in the simulator, a pending row remap for one: nothing
resets a simulated GPU, so that node would rightly never return) and does not repeat it; and the
alert rules' 10-minute Xid window and 30-minute keep_firing_for become 20 s and 5 s in a copy, so
the alert resolves about 5 s after the GPU is back. Routing, inhibition and the rules' logic are
the shipped ones.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from gpulens.sim.scenario import BUILTIN_DIR
from tests.alerts import rulefiles
from tests.alerts.test_alertmanager import shipped_config_copy
from tests.remediate.remediate_support import (
    KubeStandIn,
    kube_api,
    path_with,
    scontrol_calls,
    scontrol_state,
    write_fake_scontrol,
)
from tests.support.procs import (
    PROMETHEUS_ENGINES,
    alertmanager,
    exporter,
    free_port,
    prometheus,
    running,
    use_prometheus,
)

NODE = "gpu-faulty-01"  # the scenario's hostname; Prometheus relabels the instance to it
TOKEN = "e2e-loop-token"
STEPS = ["isolated", "action_started", "action_finished", "resolved", "hold_down", "recovered", "returned"]


def _json(url: str) -> object:
    """GET with the webhook's bearer token: /-/state is behind the same credentials as /alerts."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _wait(what: str, probe, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f}s")


def xid79_only_scenario(tmp_path: Path) -> Path:
    doc = yaml.safe_load((BUILTIN_DIR / "faults.yaml").read_text())
    timeline = doc["faults"]["timeline"]
    kept = [e for e in timeline if e.get("xid") == 79 or (e.get("gpu") == 2 and "lost" in e)]
    assert [e["at"] for e in kept] == ["15s", "16s"], "the faults scenario's Xid 79 and lost GPU 2"
    doc["faults"] = {"timeline": kept}
    doc["name"] = "faults-xid79"
    path = tmp_path / "faults-xid79.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def scaled_alert_rules(tmp_path: Path) -> Path:
    text = rulefiles.ALERT_RULES.read_text()
    assert "[10m]" in text and "keep_firing_for: 30m" in text
    text = text.replace("[10m]", "[20s]").replace("offset 10m", "offset 20s")
    text = text.replace("keep_firing_for: 30m", "keep_firing_for: 5s")
    path = tmp_path / "gpu_alerts.yml"
    path.write_text(text)
    return path


def two_webhooks(config: Path, slurm_url: str, kube_url: str) -> None:
    doc = yaml.safe_load(config.read_text())
    (receiver,) = [r for r in doc["receivers"] if r["name"] == "gpulens-remediate"]
    (webhook,) = receiver["webhook_configs"]
    receiver["webhook_configs"] = [{**webhook, "url": slurm_url}, {**webhook, "url": kube_url}]
    config.write_text(yaml.safe_dump(doc))


def receiver_cmd(port: int, token: Path, state: Path, prom: str, *backend: str) -> list[str]:
    state.mkdir()
    return [
        sys.executable,
        "-m",
        "gpulens.cli",
        "remediate",
        *backend,
        "--apply",
        "--return-to-service",
        "--listen",
        f"127.0.0.1:{port}",
        "--token-file",
        str(token),
        "--state-dir",
        str(state),
        "--hold-down",
        "5s",
        "--reconcile-interval",
        "1s",
        "--prometheus",
        prom,
        "--log-level",
        "debug",
    ]


def audit(state: Path) -> list[dict]:
    path = state / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def returned(state: Path) -> bool:
    return any(
        e["event"] == "returned" and e["episode"]["alertname"] == "GPUXidFallenOffBus" for e in audit(state)
    )


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
def test_xid79_is_isolated_rebooted_held_down_and_returned_on_slurm_and_kubernetes(
    tmp_path, engine, monkeypatch
):
    use_prometheus(engine, monkeypatch)
    token = tmp_path / "webhook.token"
    token.write_text(TOKEN + "\n")
    bin_dir, record = write_fake_scontrol(tmp_path, stateful=True)
    kube_token = tmp_path / "kube.token"
    kube_token.write_text("sa-token\n")
    stand_in = KubeStandIn(
        nodes={
            NODE: {
                "kind": "Node",
                "metadata": {"name": NODE, "resourceVersion": "1", "annotations": {}},
                "spec": {},
                "status": {"nodeInfo": {"bootID": "boot-1"}},
            }
        }
    )
    slurm_port, kube_port = free_port(), free_port()
    am_config = shipped_config_copy(
        tmp_path, webhook_url=f"http://127.0.0.1:{slurm_port}/alerts", token_file=token, group_wait="1s"
    )
    two_webhooks(am_config, f"http://127.0.0.1:{slurm_port}/alerts", f"http://127.0.0.1:{kube_port}/alerts")
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
    slurm_state, kube_state = tmp_path / "slurm-state", tmp_path / "kube-state"
    with (
        kube_api(stand_in),
        alertmanager(tmp_path, am_config) as am,
        exporter(tmp_path, "--simulate", str(xid79_only_scenario(tmp_path)), "--interval", "1") as target,
    ):
        rules = [rulefiles.RECORDING_RULES, scaled_alert_rules(tmp_path)]
        with prometheus(
            tmp_path, [target], rule_files=rules, alertmanager_url=am, scrape_config=relabel
        ) as prom:
            slurm_cmd = receiver_cmd(slurm_port, token, slurm_state, prom.base_url, "--backend", "slurm")
            kube_cmd = receiver_cmd(
                kube_port,
                token,
                kube_state,
                prom.base_url,
                "--backend",
                "kubernetes",
                "--kube-api-url",
                stand_in.url,
                "--kube-token-file",
                str(kube_token),
                "--diag",
                "off",  # the return diagnostic has its own end-to-end test (test_e2e_gpu_fence.py)
            )
            with (
                running(
                    slurm_cmd,
                    f"http://127.0.0.1:{slurm_port}/-/healthy",
                    tmp_path / "remediate-slurm.log",
                    env=path_with(bin_dir),
                ),
                running(kube_cmd, f"http://127.0.0.1:{kube_port}/-/healthy", tmp_path / "remediate-kube.log"),
            ):
                _wait(
                    "both nodes returned to service",
                    lambda: returned(slurm_state) and returned(kube_state),
                    180,
                )
                slurm_metrics = _text(f"http://127.0.0.1:{slurm_port}/metrics")
                kube_metrics = _text(f"http://127.0.0.1:{kube_port}/metrics")
                kube_open = _json(f"http://127.0.0.1:{kube_port}/-/state")["episodes"]
                slurm_open = _json(f"http://127.0.0.1:{slurm_port}/-/state")["episodes"]

    for state in (slurm_state, kube_state):
        lines = [e for e in audit(state) if e["episode"]["alertname"] == "GPUXidFallenOffBus"]
        assert [e["event"] for e in lines] == STEPS, state.name
        times = [e["time"] for e in lines]
        assert times == sorted(times)
        assert all(e["ts"].endswith("Z") for e in lines)
        done = lines[-1]["episode"]
        assert (done["node"], done["gpu"], done["recovery"], done["state"]) == (
            NODE,
            "2",
            "reboot_node",
            "returned",
        )
        stamps = [
            done[k]
            for k in ("isolated_at", "action_started_at", "action_finished_at", "recovered_at", "returned_at")
        ]
        assert stamps == sorted(stamps) and done["detected_at"] <= done["isolated_at"]
        assert done["resolved_at"] <= done["recovered_at"]
        assert "gpu_up 1, no Xid, no pending row remap" in lines[-2]["episode"]["detail"]
    assert slurm_open == [] and kube_open == []
    for metrics in (slurm_metrics, kube_metrics):
        assert 'gpulens_remediate_episodes_total{outcome="returned",recovery="reboot_node"} 1.0' in metrics
        assert 'gpulens_remediate_time_to_isolate_seconds_count{recovery="reboot_node"} 1.0' in metrics
        assert 'gpulens_remediate_time_to_recover_seconds_count{recovery="reboot_node"} 1.0' in metrics
        assert 'gpulens_remediate_time_to_return_seconds_count{recovery="reboot_node"} 1.0' in metrics
        assert "gpulens_remediate_isolated_nodes 0.0" in metrics

    # Slurm: drained, rebooted through Slurm, resumed after the hold-down
    commands = [c for c in scontrol_calls(record) if c[0] != "show"]
    assert [c[:2] for c in commands] == [
        ["update", f"NodeName={NODE}"],
        ["reboot", "ASAP"],
        ["update", f"NodeName={NODE}"],
    ]
    assert commands[1][2:] == ["nextstate=DOWN", "reason=gpulens: GPUXidFallenOffBus reboot_node", NODE]
    assert commands[2][2:] == ["State=RESUME"]
    assert scontrol_state(tmp_path)["nodes"][NODE]["State"] == "IDLE"

    # Kubernetes: cordoned and tainted, a reboot Job pinned to the node, then untainted and uncordoned
    (job,) = stand_in.jobs.values()
    assert job["spec"]["template"]["spec"]["nodeName"] == NODE
    assert job["metadata"]["labels"]["gpulens.io/action"] == "reboot_node"
    node = stand_in.nodes[NODE]
    assert node["spec"] == {"unschedulable": False, "taints": []}
    assert node["status"]["nodeInfo"]["bootID"] != "boot-1"
    assert json.loads(node["metadata"]["annotations"]["gpulens.io/remediation"])["state"] == "returned"
