"""End to end, one GPU fenced instead of its node (issue 35 item 3): an Xid 46 (NVIDIA's RESET_GPU)
on GPU 4 of the simulated node -> exporter -> Prometheus (shipped rules) -> Alertmanager (shipped
config) -> `gpulens remediate --apply --return-to-service` on Kubernetes with DRA (the API
stand-in serves ResourceSlices with the node's GPUs and DeviceTaintRules). The receiver fences GPU 4
alone with a NoExecute DeviceTaintRule while the node stays schedulable and its seven other GPUs
keep taking work, resets it with a Job, holds it down against Prometheus, runs the return
diagnostic (a Job the stand-in's kubelet runs for real, `dcgmi` being the simulated node's) and,
as it passes, deletes the rule. With a `diag_fail` fault on the same GPU (DCGM's memory test fails
there; NVML shows nothing) the diagnostic fails instead: the rule stays and the episode is `rma`.

Scaled as every fault-loop end-to-end test is (e2e_stack.py): the Xid window and keep_firing_for
become 20 s and 5 s in a copy of the rules; routing, inhibition and the rules' logic are the shipped
ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulens.sim.scenariofile import BUILTIN_DIR
from tests.remediate.e2e_stack import (
    FAULT_AT_S,
    NODE,
    _text,
    _wait,
    audit,
    monitoring,
    receiver_cmd,
    tokens,
)
from tests.remediate.remediate_support import (
    DRA_DRIVER,
    KubeStandIn,
    gpu_slice,
    kube_api,
    run_diagnostic,
    sim_dcgmi,
)
from tests.support.procs import (
    PROMETHEUS_ENGINES,
    free_port,
    running,
    use_prometheus,
)

GPU = "4"
STEPS = [
    "isolated",
    "action_started",
    "action_finished",
    "resolved",
    "hold_down",
    "diagnostic_started",
    "diagnostic_passed",
    "returned",
]


def xid46_scenario(tmp_path: Path) -> Path:
    """The `faults` node with one fault: Xid 46 (GPU stopped processing: reset the GPU) on GPU 4."""
    doc = yaml.safe_load((BUILTIN_DIR / "faults.yaml").read_text())
    doc["faults"] = {"timeline": [{"at": f"{FAULT_AT_S}s", "gpu": int(GPU), "xid": 46}]}
    doc["name"] = "faults-xid46"
    path = tmp_path / "faults-xid46.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def fenced(state: Path) -> bool:
    return any(e["event"] == "isolated" for e in audit(state))


def returned(state: Path) -> bool:
    return any(e["event"] == "returned" for e in audit(state))


@dataclass
class Run:
    """What one run of the loop left: the stand-in, the audit log's directory, the GPUs' UUIDs, the
    DeviceTaintRules and node spec once the GPU was fenced, and the receiver's /metrics at the end."""

    stand_in: KubeStandIn
    state: Path
    uuids: list[str]
    rules_then: dict[str, Any]
    node_then: dict[str, Any]
    schedulable_then: list[str]
    metrics: str


def run_loop(tmp_path: Path, scenario: Path, until: str) -> Run:
    """The scenario's node -> exporter -> Prometheus -> Alertmanager -> the receiver on the DRA
    stand-in, whose kubelet runs diagnostic Jobs with the node's `dcgmi`, until the audit log
    records the event `until`."""
    token, kube_token = tokens(tmp_path)
    node = {"kind": "Node", "metadata": {"name": NODE, "resourceVersion": "1", "annotations": {}}, "spec": {}}
    stand_in = KubeStandIn(nodes={NODE: node}, dra=True)
    stand_in.kubelet = run_diagnostic(sim_dcgmi(tmp_path / "bin", scenario).parent)
    port = free_port()
    state = tmp_path / "kube-state"
    webhook = f"http://127.0.0.1:{port}/alerts"
    with kube_api(stand_in), monitoring(tmp_path, {NODE: scenario}, webhook) as prom:
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
            _wait(f"GPU {GPU} fenced", lambda: fenced(state) and stand_in.device_taint_rules, 120)
            with stand_in.lock:
                rules_then = json.loads(json.dumps(stand_in.device_taint_rules))
                node_then = json.loads(json.dumps(stand_in.nodes[NODE]["spec"]))
            schedulable_then = stand_in.schedulable_devices(NODE)
            _wait(f"the event {until}", lambda: any(e["event"] == until for e in audit(state)), 180)
            metrics = _text(f"http://127.0.0.1:{port}/metrics")
    return Run(stand_in, state, uuids, rules_then, node_then, schedulable_then, metrics)


def commands(stand_in: KubeStandIn) -> dict[str, list[str]]:
    """The command of each Job the receiver created, by its gpulens.io/action label."""
    jobs = {j["metadata"]["labels"]["gpulens.io/action"]: j for j in stand_in.jobs.values()}
    assert len(jobs) == len(stand_in.jobs), "one Job per action"
    return {
        action: job["spec"]["template"]["spec"]["containers"][0]["command"] for action, job in jobs.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES[:1])
def test_an_xid_on_one_gpu_fences_that_gpu_only_and_returns_it_after_its_reset(tmp_path, engine, monkeypatch):
    use_prometheus(engine, monkeypatch)
    run = run_loop(tmp_path, xid46_scenario(tmp_path), "returned")
    stand_in, state, uuids, metrics = run.stand_in, run.state, run.uuids, run.metrics
    rules_then, node_then, schedulable_then = run.rules_then, run.node_then, run.schedulable_then

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
    ran = commands(stand_in)
    assert sorted(ran) == ["diagnose", "reset_gpu"], "one reset, then one diagnostic"
    assert ran["reset_gpu"] == ["nvidia-smi", "-r", "-i", uuids[4]]
    assert ran["diagnose"] == [
        "gpulens",
        "remediate",
        "diag",
        "--level",
        "2",
        "--gpu",
        GPU,
        "--uuid",
        uuids[4],
    ]
    assert stand_in.device_taint_rules == {}, "the return deleted the rule"
    lines = audit(state)
    assert [e["event"] for e in lines] == STEPS
    done = lines[-1]["episode"]
    assert (done["gpu"], done["uuid"], done["recovery"], done["kept_gpus"]) == (GPU, uuids[4], "reset_gpu", 7)
    assert "gpu_up 1, no Xid, no pending row remap" in lines[-3]["episode"]["detail"]
    assert lines[-2]["episode"]["diagnostic"].startswith("dcgmi diag -r 2: passed")
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


def diag_fail_scenario(tmp_path: Path) -> Path:
    """The Xid 46 scenario, and GPU 4 fails DCGM's memory test (level 2) all along: NVML shows
    nothing of it, so the alert resolves after the reset; only the diagnostic finds it."""
    path = xid46_scenario(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["faults"]["timeline"].append({"at": "0s", "gpu": int(GPU), "diag_fail": "memory"})
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES[:1])
def test_a_failing_diagnostic_keeps_the_gpu_fenced_on_the_rma_path(tmp_path, engine, monkeypatch):
    use_prometheus(engine, monkeypatch)
    run = run_loop(tmp_path, diag_fail_scenario(tmp_path), "diagnostic_failed")

    lines = audit(run.state)
    assert [e["event"] for e in lines] == [*STEPS[:-2], "diagnostic_failed"]
    failed = lines[-1]["episode"]
    assert (failed["state"], failed["gpu"], failed["uuid"]) == ("rma", GPU, run.uuids[4])
    assert failed["diagnostic"].startswith("dcgmi diag -r 2: failed: memory on GPU 4")
    assert "gpulens remediate return --force" in failed["detail"]
    assert run.stand_in.device_taint_rules.keys() == run.rules_then.keys(), "the GPU stays fenced"
    assert run.stand_in.schedulable_devices(NODE) == run.schedulable_then, "its node's other GPUs still work"
    assert run.stand_in.isolation_patches() == [], "the node was never cordoned or tainted"
    ran = commands(run.stand_in)
    assert ran["diagnose"] == [
        "gpulens",
        "remediate",
        "diag",
        "--level",
        "2",
        "--gpu",
        GPU,
        "--uuid",
        run.uuids[4],
    ]
    assert 'gpulens_remediate_diagnostics_total{result="failed"} 1.0' in run.metrics
    assert 'gpulens_remediate_diagnostics_total{result="passed"} 0.0' in run.metrics
    assert 'gpulens_remediate_episodes_total{outcome="rma",recovery="reset_gpu"} 1.0' in run.metrics
    assert "gpulens_remediate_fenced_gpus 1.0" in run.metrics
