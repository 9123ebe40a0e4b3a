"""The fault loop acts only on what is true now (issue 35): before every action on a node (a reset
or reboot, the return to service) the reconciler re-reads the node and goes ahead only while
gpulens' own isolation is there. A node a person returned by hand closes its episodes as
`returned_by_hand` and gets nothing more; a node that cannot be read gets nothing until it can.
Against the Kubernetes API stand-in and the stateful scontrol stand-in; time is a test clock and
each reconcile pass one `tick()`."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from gpulens.remediate.kubernetes import TAINT_KEY, KubernetesClient, KubernetesIsolator
from gpulens.remediate.loop import LoopPolicy
from gpulens.remediate.slurm import SlurmIsolator
from tests.remediate.remediate_support import (
    Clock,
    KubeStandIn,
    alert,
    deliver,
    get,
    kube_api,
    notification,
    receiver,
    scontrol_calls,
)

HOLD_DOWN = 600.0
NODE = "gpu-17"
BY_HAND = 'gpulens_remediate_episodes_total{outcome="returned_by_hand",recovery="reboot_node"} 1.0'


def fault(status: str = "firing") -> dict[str, Any]:
    return alert(
        alertname="GPUXidFallenOffBus",
        instance=f"{NODE}:9842",
        gpu="3",
        remediate="isolate_node",
        recovery="reboot_node",
        status=status,
        fingerprint="fp-xid79",
        starts_at="2026-12-01T10:00:00Z",
    )


def policy(**overrides) -> LoopPolicy:
    return LoopPolicy(**{"hold_down_s": HOLD_DOWN, "action_timeout_s": 30, **overrides})


def open_episodes(remediator) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = remediator.state()["episodes"]
    return items


def audit(path) -> list[tuple[str, str]]:
    return [(d["event"], d["episode"]["state"]) for d in map(json.loads, path.read_text().splitlines())]


def kube_node(*pods: str) -> KubeStandIn:
    node = {"metadata": {"name": NODE, "resourceVersion": "1"}, "spec": {}, "status": {"nodeInfo": {}}}
    running = [
        {"metadata": {"name": p, "namespace": "ml"}, "spec": {"nodeName": NODE}, "status": {}} for p in pods
    ]
    return KubeStandIn(nodes={NODE: node}, pods=running)


def return_by_hand(stand_in: KubeStandIn, keep_cordon: bool = False) -> None:
    """What a person does (docs/alerts.md): `kubectl taint node NODE gpulens.io/gpu-fault-` and
    `kubectl uncordon NODE` (or only the first, keeping their own cordon)."""
    with stand_in.lock:
        spec = stand_in.nodes[NODE]["spec"]
        spec["taints"] = [t for t in spec.get("taints", []) if t["key"] != TAINT_KEY]
        spec["unschedulable"] = keep_cordon


def test_a_kubernetes_node_returned_by_hand_before_its_pods_end_gets_no_reboot_job(tmp_path):
    clock, log = Clock(), tmp_path / "audit.jsonl"
    stand_in = kube_node("train")
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url))
        with receiver(isolator, dry_run=False, clock=clock, audit_log=log, policy=policy()) as (base, rem):
            deliver(base, notification(fault()))
            rem.reconciler.tick()  # the pod still runs: the reboot waits
            return_by_hand(stand_in)
            stand_in.pods.clear()  # then its last pod ends
            for _ in range(3):
                rem.reconciler.tick()
                clock.now += HOLD_DOWN
            left = open_episodes(rem)
            metrics = get(f"{base}/metrics")[1]
    assert stand_in.jobs == {}, "no reboot Job on a node a person returned"
    assert len(stand_in.isolation_patches()) == 1, "the isolation only: nothing undone or redone"
    assert stand_in.nodes[NODE]["spec"] == {"taints": [], "unschedulable": False}
    assert left == []
    event, state = audit(log)[-1]
    assert (event, state) == ("returned_by_hand", "returned_by_hand")
    last = json.loads(log.read_text().splitlines()[-1])["episode"]
    assert last["detail"].startswith(f"returned by hand: node {NODE} no longer carries gpulens' isolation")
    assert BY_HAND in metrics
    assert "gpulens_remediate_isolated_nodes 0.0" in metrics
    annotations = stand_in.nodes[NODE]["metadata"]["annotations"]
    assert json.loads(annotations["gpulens.io/remediation"])["state"] == "returned_by_hand"
    assert stand_in.episode_records(NODE) == {}, "a closed episode leaves no open record on the node"


def test_a_slurm_node_resumed_by_hand_gets_no_reboot_command(slurm, tmp_path):
    clock, log = Clock(), tmp_path / "audit.jsonl"
    with receiver(SlurmIsolator(), dry_run=False, clock=clock, audit_log=log, policy=policy()) as (base, rem):
        deliver(base, notification(fault()))
        person = ["scontrol", "update", f"NodeName={NODE}", "State=RESUME"]
        subprocess.run(person, check=True, capture_output=True, timeout=60)
        for _ in range(3):
            rem.reconciler.tick()
            clock.now += HOLD_DOWN
        left = open_episodes(rem)
        metrics = get(f"{base}/metrics")[1]
    assert [c for c in scontrol_calls(slurm) if c[:1] == ["reboot"]] == []
    updates = [c[2] for c in scontrol_calls(slurm) if c[:1] == ["update"]]
    assert updates == ["State=DRAIN", "State=RESUME"], "gpulens' drain and the person's resume only"
    assert left == []
    assert audit(log) == [("isolated", "isolated"), ("returned_by_hand", "returned_by_hand")]
    assert BY_HAND in metrics


def test_a_node_that_cannot_be_read_gets_no_action_until_it_can(tmp_path):
    clock, log = Clock(), tmp_path / "audit.jsonl"
    stand_in = kube_node()
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url))
        with receiver(isolator, dry_run=False, clock=clock, audit_log=log, policy=policy()) as (base, rem):
            deliver(base, notification(fault()))
            stand_in.redirect = "http://192.0.2.1"  # the API answers nothing gpulens may act on
            rem.reconciler.tick()
            jobs_unreadable = dict(stand_in.jobs)
            (waiting,) = open_episodes(rem)
            stand_in.redirect = ""
            clock.now += 15
            rem.reconciler.tick()  # readable again, and the isolation is still there
            (started,) = open_episodes(rem)
    assert jobs_unreadable == {}
    assert waiting["state"] == "isolated"
    assert waiting["detail"].startswith(f"the state of node {NODE} cannot be read now: nothing is done")
    (job,) = stand_in.jobs.values()
    assert job["metadata"]["labels"]["gpulens.io/action"] == "reboot_node"
    assert started["state"] == "recovering"
    assert [e for e, _ in audit(log)] == ["isolated", "waiting", "action_started"]


def test_a_node_still_isolated_by_gpulens_is_rebooted(tmp_path):
    stand_in = kube_node()
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url))
        with receiver(isolator, dry_run=False, clock=Clock(), policy=policy()) as (base, rem):
            deliver(base, notification(fault()))
            rem.reconciler.tick()
            (episode,) = open_episodes(rem)
    (job,) = stand_in.jobs.values()
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["systemctl", "reboot"]
    assert episode["state"] == "recovering"
    reads = [i for i, r in enumerate(stand_in.requests) if r.method == "GET" and r.path.endswith(NODE)]
    (post_job,) = [i for i, r in enumerate(stand_in.requests) if r.method == "POST"]
    assert any(i < post_job for i in reads), "the node is read before the Job is created"


def test_a_node_whose_taint_a_person_removed_is_not_uncordoned_by_the_return(tmp_path):
    clock = Clock()
    stand_in = kube_node()
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url))
        pol = policy(return_to_service=True)
        with receiver(isolator, dry_run=False, clock=clock, policy=pol) as (base, rem):
            deliver(base, notification(fault()))
            rem.reconciler.tick()  # reboot Job
            rem.reconciler.tick()  # rebooted
            deliver(base, notification(fault(status="resolved")))
            rem.reconciler.tick()  # hold-down starts
            return_by_hand(stand_in, keep_cordon=True)  # the person keeps their own cordon
            clock.now += HOLD_DOWN + 1
            rem.reconciler.tick()  # ready: the return re-reads the node first
            left = open_episodes(rem)
    assert stand_in.nodes[NODE]["spec"]["unschedulable"] is True, "the person's cordon stays"
    assert len(stand_in.isolation_patches()) == 1, "the isolation only: no return PATCH"
    assert left == []


def test_a_slurm_reboot_that_resumes_the_node_itself_is_still_a_return_not_one_by_hand(slurm, tmp_path):
    clock, log = Clock(), tmp_path / "audit.jsonl"
    isolator = SlurmIsolator(reboot_nextstate="RESUME")
    pol = policy(return_to_service=True)
    with receiver(isolator, dry_run=False, clock=clock, audit_log=log, policy=pol) as (base, rem):
        deliver(base, notification(fault()))
        rem.reconciler.tick()  # reboot ASAP nextstate=RESUME: Slurm resumes the node at boot
        rem.reconciler.tick()  # rebooted
        deliver(base, notification(fault(status="resolved")))
        rem.reconciler.tick()
        clock.now += HOLD_DOWN + 1
        rem.reconciler.tick()
    assert audit(log)[-1] == ("returned", "returned")
