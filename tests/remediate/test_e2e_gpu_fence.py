"""End to end, one GPU fenced instead of its node (issue 35 item 3): an Xid 46 (NVIDIA's RESET_GPU)
on GPU 4 of the simulated node -> exporter -> Prometheus (shipped rules) -> Alertmanager (shipped
config) -> `gpulens remediate --apply --return-to-service` on Kubernetes with DRA (the API
stand-in serves ResourceSlices with the node's GPUs and DeviceTaintRules). The receiver fences GPU 4
alone with a NoExecute DeviceTaintRule while the node stays schedulable and its seven other GPUs
keep taking work, resets it with a Job, holds it down against Prometheus and deletes the rule.

Scaled as test_e2e_fault_loop.py is: the Xid window and keep_firing_for become 20 s and 5 s in a
copy of the rules; routing, inhibition and the rules' logic are the shipped ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpulens.sim.scenario import BUILTIN_DIR
from tests.alerts import rulefiles
from tests.alerts.test_alertmanager import shipped_config_copy
from tests.remediate.remediate_support import DRA_DRIVER, KubeStandIn, gpu_slice, kube_api
from tests.remediate.test_e2e_fault_loop import (
    NODE,
    TOKEN,
    _text,
    _wait,
    audit,
    receiver_cmd,
    scaled_alert_rules,
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

GPU = "4"
STEPS = ["isolated", "action_started", "action_finished", "resolved", "hold_down", "recovered", "returned"]


def xid46_scenario(tmp_path: Path) -> Path:
    """The `faults` node with one fault: Xid 46 (GPU stopped processing: reset the GPU) on GPU 4."""
    doc = yaml.safe_load((BUILTIN_DIR / "faults.yaml").read_text())
    doc["faults"] = {"timeline": [{"at": "15s", "gpu": int(GPU), "xid": 46}]}
    doc["name"] = "faults-xid46"
    path = tmp_path / "faults-xid46.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def fenced(state: Path) -> bool:
    return any(e["event"] == "isolated" for e in audit(state))


def returned(state: Path) -> bool:
    return any(e["event"] == "returned" for e in audit(state))


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES[:1])
def test_an_xid_on_one_gpu_fences_that_gpu_only_and_returns_it_after_its_reset(tmp_path, engine, monkeypatch):
    use_prometheus(engine, monkeypatch)
    token = tmp_path / "webhook.token"
    token.write_text(TOKEN + "\n")
    kube_token = tmp_path / "kube.token"
    kube_token.write_text("sa-token\n")
    node = {"kind": "Node", "metadata": {"name": NODE, "resourceVersion": "1", "annotations": {}}, "spec": {}}
    stand_in = KubeStandIn(nodes={NODE: node}, dra=True)
    port = free_port()
    am_config = shipped_config_copy(
        tmp_path, webhook_url=f"http://127.0.0.1:{port}/alerts", token_file=token, group_wait="1s"
    )
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
    state = tmp_path / "kube-state"
    with (
        kube_api(stand_in),
        alertmanager(tmp_path, am_config) as am,
        exporter(tmp_path, "--simulate", str(xid46_scenario(tmp_path)), "--interval", "1") as target,
    ):
        rules = [rulefiles.RECORDING_RULES, scaled_alert_rules(tmp_path)]
        with prometheus(
            tmp_path, [target], rule_files=rules, alertmanager_url=am, scrape_config=relabel
        ) as prom:
            # the DRA driver publishes the node's GPUs by the UUIDs NVML reports
            ups = _wait(
                "the node's 8 GPUs in Prometheus",
                lambda: len(found := prom.query("gpu_up")) == 8 and found,
                60,
            )
            uuids = [s["metric"]["uuid"] for s in sorted(ups, key=lambda s: int(s["metric"]["gpu"]))]
            stand_in.resource_slices = [gpu_slice(NODE, uuids)]
            cmd = receiver_cmd(port, token, state, prom.base_url, "--backend", "kubernetes")
            cmd += ["--kube-api-url", stand_in.url, "--kube-token-file", str(kube_token)]
            with running(cmd, f"http://127.0.0.1:{port}/-/healthy", tmp_path / "remediate.log"):
                _wait("GPU 4 fenced", lambda: fenced(state) and stand_in.device_taint_rules, 120)
                with stand_in.lock:
                    rules_then = json.loads(json.dumps(stand_in.device_taint_rules))
                    node_then = json.loads(json.dumps(stand_in.nodes[NODE]["spec"]))
                schedulable_then = stand_in.schedulable_devices(NODE)
                _wait("GPU 4 returned to service", lambda: returned(state), 180)
                metrics = _text(f"http://127.0.0.1:{port}/metrics")

    (rule,) = rules_then.values()
    assert rule["spec"]["deviceSelector"] == {"driver": DRA_DRIVER, "pool": NODE, "device": f"gpu-{GPU}"}
    assert rule["spec"]["taint"] == {
        "key": "gpulens.io/gpu-fault",
        "value": "GPUXidResetRequired",
        "effect": "NoExecute",
    }
    assert not node_then.get("unschedulable") and not node_then.get("taints"), "the node stays schedulable"
    assert schedulable_then == [f"gpu-{i}" for i in range(8) if str(i) != GPU], "the other GPUs take work"
    assert stand_in.isolation_patches() == [], "the node was never cordoned or tainted"
    (job,) = stand_in.jobs.values()
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["nvidia-smi", "-r", "-i", uuids[4]]
    assert stand_in.device_taint_rules == {}, "the return deleted the rule"
    lines = audit(state)
    assert [e["event"] for e in lines] == STEPS
    done = lines[-1]["episode"]
    assert (done["gpu"], done["uuid"], done["recovery"], done["kept_gpus"]) == (GPU, uuids[4], "reset_gpu", 7)
    assert "gpu_up 1, no Xid, no pending row remap" in lines[-2]["episode"]["detail"]
    assert 'gpulens_remediate_isolations_total{scope="gpu"} 1.0' in metrics
    assert 'gpulens_remediate_isolations_total{scope="node"} 0.0' in metrics
    assert 'gpulens_remediate_episodes_total{outcome="returned",recovery="reset_gpu"} 1.0' in metrics
    assert "gpulens_remediate_isolated_nodes 0.0" in metrics
    (kept,) = [
        ln
        for ln in metrics.splitlines()
        if ln.startswith("gpulens_remediate_healthy_gpus_kept_seconds_total")
    ]
    assert float(kept.split()[1]) > 0
