"""End to end, the whole fault loop (issue 18): the `faults` scenario's Xid 79 -> exporter ->
Prometheus (shipped rules) -> Alertmanager (shipped config) -> two `gpulens remediate --apply
--return-to-service` receivers, one on Slurm (the stateful scontrol stand-in), one on Kubernetes
(the API stand-in): each isolates the node, reboots it (the fault's class), waits for the alert to
resolve, checks the GPU's health in that Prometheus through the hold-down and returns the node;
the audit log and the metrics show every step with its time. On Slurm the return diagnostic runs
too: in a maintenance reservation of the node, as a batch job whose `dcgmi` is the simulated
node's (Kubernetes' has its own test, test_e2e_gpu_fence.py).

Scaled for a test that runs in minutes (tests/remediate/e2e_stack.py): the scenario keeps only the
Xid 79 fault of `faults` (earlier, and the GPU lost for less), and the rules' Xid window and
keep_firing_for are 20 s and 5 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.remediate.e2e_stack import (
    NODE,
    _json,
    _text,
    _wait,
    audit,
    monitoring,
    receiver_cmd,
    tokens,
    xid79_only_scenario,
)
from tests.remediate.remediate_support import (
    KubeStandIn,
    kube_api,
    path_with,
    scontrol_calls,
    scontrol_state,
    sim_dcgmi,
    write_fake_scontrol,
)
from tests.support.procs import PROMETHEUS_ENGINES, free_port, running, use_prometheus

STEPS = ["isolated", "action_started", "action_finished", "resolved", "hold_down", "recovered", "returned"]
DIAGNOSED = [*STEPS[:-2], "diagnostic_started", "diagnostic_passed", "returned"]


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
    token, kube_token = tokens(tmp_path)
    bin_dir, record = write_fake_scontrol(tmp_path, stateful=True)
    scenario = xid79_only_scenario(tmp_path)
    sim_dcgmi(bin_dir, scenario)  # the Slurm diagnostic job's dcgmi: the simulated node's
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
    slurm_state, kube_state = tmp_path / "slurm-state", tmp_path / "kube-state"
    urls = [f"http://127.0.0.1:{p}/alerts" for p in (slurm_port, kube_port)]
    with kube_api(stand_in), monitoring(tmp_path, {NODE: scenario}, *urls) as prom:
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
            "off",  # the Kubernetes diagnostic has its own end-to-end test (test_e2e_gpu_fence.py)
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

    for state, steps in ((slurm_state, DIAGNOSED), (kube_state, STEPS)):
        lines = [e for e in audit(state) if e["episode"]["alertname"] == "GPUXidFallenOffBus"]
        assert [e["event"] for e in lines] == steps, state.name
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
        healthy = lines[steps.index("hold_down") + 1]["episode"]["detail"]
        assert "gpu_up 1, no Xid, no pending row remap" in healthy
    assert slurm_open == [] and kube_open == []
    for metrics in (slurm_metrics, kube_metrics):
        assert 'gpulens_remediate_episodes_total{outcome="returned",recovery="reboot_node"} 1.0' in metrics
        assert 'gpulens_remediate_time_to_isolate_seconds_count{recovery="reboot_node"} 1.0' in metrics
        assert 'gpulens_remediate_time_to_recover_seconds_count{recovery="reboot_node"} 1.0' in metrics
        assert 'gpulens_remediate_time_to_return_seconds_count{recovery="reboot_node"} 1.0' in metrics
        assert "gpulens_remediate_isolated_nodes 0.0" in metrics

    # Slurm: drained, rebooted through Slurm, diagnosed in its reservation, resumed after it passed
    done_uuid = [e for e in audit(slurm_state) if e["event"] == "returned"][-1]["episode"]["uuid"]
    commands = [c for c in scontrol_calls(record) if c[0] != "show"]
    assert [c[:2] for c in commands] == [
        ["update", f"NodeName={NODE}"],
        ["reboot", "ASAP"],
        ["create", "reservation"],
        ["update", f"NodeName={NODE}"],
        ["sbatch", "--parsable"],
        ["update", f"NodeName={NODE}"],
        ["delete", f"ReservationName=gpulens-diag-{NODE}"],
        ["update", f"NodeName={NODE}"],
    ]
    assert commands[1][2:] == ["nextstate=DOWN", "reason=gpulens: GPUXidFallenOffBus reboot_node", NODE]
    assert commands[3][2:] == commands[7][2:] == ["State=RESUME"]
    assert commands[4][-1] == "--wrap=gpulens remediate diag --level 2 --gpu 2 --uuid " + done_uuid
    assert commands[5][2:] == ["State=DRAIN", "Reason=gpulens: GPUXidFallenOffBus diagnostic passed"]
    slurm = scontrol_state(tmp_path)
    assert slurm["nodes"][NODE]["State"] == "IDLE" and slurm["reservations"] == {}
    assert [j["ExitCode"] for j in slurm["batch"].values()] == ["0:0"]
    assert 'gpulens_remediate_diagnostics_total{result="passed"} 1.0' in slurm_metrics

    # Kubernetes: cordoned and tainted, a reboot Job pinned to the node, then untainted and uncordoned
    (job,) = stand_in.jobs.values()
    assert job["spec"]["template"]["spec"]["nodeName"] == NODE
    assert job["metadata"]["labels"]["gpulens.io/action"] == "reboot_node"
    node = stand_in.nodes[NODE]
    assert node["spec"] == {"unschedulable": False, "taints": []}
    assert node["status"]["nodeInfo"]["bootID"] != "boot-1"
    assert json.loads(node["metadata"]["annotations"]["gpulens.io/remediation"])["state"] == "returned"
