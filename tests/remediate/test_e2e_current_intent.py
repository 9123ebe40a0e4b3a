"""End to end, the fault loop acts on what is true now and never stalls (issue 35 items 1 and 2): the
`faults` scenario's Xid 79 -> exporter -> Prometheus (shipped rules, scaled) -> Alertmanager
(shipped config) -> `gpulens remediate --apply --return-to-service`.

- On Kubernetes with DRA (the API stand-in), a node isolated with its reboot pending (a pod still
  runs) is returned by a person the way docs/alerts.md says (taint removed, uncordoned), then its
  last pod ends: the episode closes as returned by hand (audit, node annotation, metric) and the
  receiver does nothing more to the node, no reboot Job, through every pass up to the alert's
  resolved notification.
- On Slurm (the stateful scontrol / sbatch stand-in), one node's calls hang once it is drained:
  the other node goes through its whole loop (reboot, hold-down, diagnostic in its reservation,
  return) while they hang, its steps made while a call of the hung node was still waiting (the
  stand-in records which calls were hanging at each call), and the hung node steps on once its
  calls answer again. Order, never wall-clock time, is what is asserted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpulens.remediate.kubernetes import TAINT_KEY
from tests.remediate.e2e_stack import (
    NODE,
    _json,
    _text,
    _wait,
    events,
    monitoring,
    receiver_cmd,
    tokens,
    xid79_only_scenario,
)
from tests.remediate.remediate_support import (
    KubeStandIn,
    gpu_slice,
    kube_api,
    path_with,
    sim_dcgmi,
    write_fake_scontrol,
)
from tests.support.procs import free_port, running

BY_HAND = 'gpulens_remediate_episodes_total{outcome="returned_by_hand",recovery="reboot_node"} 1.0'
HUNG = "gpu-a-hung"  # sorts before NODE: a loop visiting nodes one at a time would meet it first
# Each hung scontrol call of HUNG ends after the receiver's 30 s timeout (SlurmIsolator.timeout_s),
# and HUNG acts on what came meanwhile: its alert must resolve after the first such end (about 30 s
# after the isolation) and NODE be returned (about 8 s after the resolution) before the second
# (about 60 s after it). GPU 2 lost this long puts the resolution about 41 s after the isolation,
# 10 s from either edge.
HUNG_LOST_FOR_S = 37
SLURM_STEPS = [
    "isolated",
    "action_started",
    "action_finished",
    "resolved",
    "hold_down",
    "diagnostic_started",
    "diagnostic_passed",
    "returned",
]


def return_by_hand(stand_in: KubeStandIn) -> None:
    """What a person does (docs/alerts.md): `kubectl taint node NODE gpulens.io/gpu-fault-` and
    `kubectl uncordon NODE`."""
    with stand_in.lock:
        spec = stand_in.nodes[NODE]["spec"]
        spec["taints"] = [t for t in spec.get("taints", []) if t["key"] != TAINT_KEY]
        spec["unschedulable"] = False


def resolved_handled(base: str) -> bool:
    """The receiver has acted on the Xid alert's resolved notification."""
    actions = _json(f"{base}/-/state")["actions"]
    return any(a["alertname"] == "GPUXidFallenOffBus" and a["result"] == "resolved_ignored" for a in actions)


@pytest.mark.slow
def test_a_manual_return_in_the_middle_of_an_episode_stops_every_later_action(tmp_path):
    token, kube_token = tokens(tmp_path)
    node = {
        "kind": "Node",
        "metadata": {"name": NODE, "resourceVersion": "1", "annotations": {}},
        "spec": {},
        "status": {"nodeInfo": {"bootID": "boot-1"}},
    }
    pod = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {"nodeName": NODE}, "status": {}}
    stand_in = KubeStandIn(nodes={NODE: node}, pods=[pod], dra=True)
    stand_in.resource_slices = [gpu_slice(NODE, [f"GPU-{i}" for i in range(8)])]
    port = free_port()
    base, state = f"http://127.0.0.1:{port}", tmp_path / "kube-state"
    with (
        kube_api(stand_in),
        monitoring(tmp_path, {NODE: xid79_only_scenario(tmp_path)}, f"{base}/alerts") as prom,
    ):
        cmd = receiver_cmd(port, token, state, prom.base_url, "--backend", "kubernetes")
        cmd += ["--kube-api-url", stand_in.url, "--kube-token-file", str(kube_token)]
        with running(cmd, f"{base}/-/healthy", tmp_path / "remediate.log"):
            _wait("the reboot waiting for the node's pod", lambda: "waiting" in events(state), 120)
            return_by_hand(stand_in)
            with stand_in.lock:
                stand_in.pods.clear()  # then its last pod ends
            _wait("the episode closed as returned by hand", lambda: "returned_by_hand" in events(state), 60)
            # passes go on every second until the alert resolves (its Xid window): nothing is done
            _wait("the alert's resolved notification acted on", lambda: resolved_handled(base), 120)
            metrics = _text(f"{base}/metrics")
            left = _json(f"{base}/-/state")["episodes"]

    assert events(state) == ["isolated", "waiting", "returned_by_hand"]
    assert stand_in.jobs == {}, "no reboot Job on a node a person returned"
    assert len(stand_in.isolation_patches()) == 1, "the isolation only: nothing undone or redone"
    assert stand_in.nodes[NODE]["spec"] == {"taints": [], "unschedulable": False}
    assert stand_in.device_taint_rules == {}, "a node-level fault fences no GPU"
    annotations = stand_in.nodes[NODE]["metadata"]["annotations"]
    assert json.loads(annotations["gpulens.io/remediation"])["state"] == "returned_by_hand"
    assert stand_in.episode_records(NODE) == {}
    assert left == []
    assert BY_HAND in metrics
    assert "gpulens_remediate_isolated_nodes 0.0" in metrics


def during(record: Path) -> list[dict[str, Any]]:
    """The stand-in's calls, each with the nodes that had a call hanging at that moment."""
    path = Path(f"{record}.during")
    return [json.loads(line) for line in path.read_text().splitlines()]


def steps_of(record: Path, node: str) -> list[dict[str, Any]]:
    """The calls that change `node` (reads left out)."""
    named = {f"NodeName={node}", f"Nodes={node}", f"--nodelist={node}", node}
    return [d for d in during(record) if d["call"][0] not in ("show",) and named & set(d["call"])]


@pytest.mark.slow
def test_a_node_whose_calls_hang_does_not_delay_another_nodes_steps(tmp_path):
    token, _ = tokens(tmp_path)
    release = tmp_path / "release-the-hung-node"
    bin_dir, record = write_fake_scontrol(tmp_path, stateful=True, hang={HUNG: str(release)})
    scenario = xid79_only_scenario(tmp_path, lost_for_s=HUNG_LOST_FOR_S)
    sim_dcgmi(bin_dir, scenario)  # the diagnostic job's dcgmi: the simulated node's
    port = free_port()
    base, state = f"http://127.0.0.1:{port}", tmp_path / "slurm-state"
    with monitoring(tmp_path, {HUNG: scenario, NODE: scenario}, f"{base}/alerts") as prom:
        cmd = receiver_cmd(port, token, state, prom.base_url, "--backend", "slurm")
        with running(cmd, f"{base}/-/healthy", tmp_path / "remediate.log", env=path_with(bin_dir)):
            try:
                _wait(f"{NODE} returned", lambda: "returned" in events(state, NODE), 240)
                hung_then = events(state, HUNG)
                released_then = release.exists()
            finally:
                release.touch()
            stepped = lambda: "action_started" in events(state, HUNG)  # noqa: E731
            _wait(f"{HUNG} stepping on once its calls answer", stepped, 120)

    assert events(state, NODE) == SLURM_STEPS
    assert not released_then
    assert hung_then[0] == "isolated" and set(hung_then) <= {"isolated", "waiting"}, (
        f"{HUNG} took no step while its calls hung"
    )
    node_steps = steps_of(record, NODE)
    assert [d["call"][0] for d in node_steps][:2] == ["update", "reboot"]
    assert any(HUNG in d["hanging"] for d in node_steps), f"{NODE}'s steps went on while {HUNG}'s calls hung"
