"""Fence one GPU, not its node, where the cluster can (issue 35 item 3): on a Kubernetes cluster that
serves DRA device taints, a GPU-level fault gets a DeviceTaintRule for that GPU (or its MIG devices)
and the node stays schedulable; node-level faults and device-plugin clusters isolate the node as
before. The return deletes the rule; a person deleting it returns the GPU by hand. Against the
Kubernetes API stand-in with DRA; time is a test clock and each reconcile pass one `tick()`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpulens.remediate.dra import DeviceTaints, DraMode
from gpulens.remediate.fencing import FencingKubernetesIsolator
from gpulens.remediate.kubernetes import TAINT_KEY, KubernetesClient
from gpulens.remediate.loop import LoopPolicy
from tests.remediate.remediate_support import (
    DRA_DRIVER,
    Clock,
    KubeStandIn,
    alert,
    deliver,
    get,
    gpu_slice,
    kube_api,
    notification,
    post,
    receiver,
)

HOLD_DOWN = 600.0
NODE = "gpu-17"
UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]


def fault(
    name: str, recovery: str, gpu: int = 3, status: str = "firing", kind: str = "isolate_gpu"
) -> dict[str, Any]:
    return alert(
        alertname=name,
        instance=f"{NODE}:9842",
        gpu=str(gpu),
        remediate=kind,
        recovery=recovery,
        status=status,
        fingerprint=f"fp-{name}-{gpu}",
        starts_at="2026-12-01T10:00:00Z",
        uuid=UUIDS[gpu],
    )


def cluster(dra: bool = True, mig: dict[str, list[str]] | None = None) -> KubeStandIn:
    node = {"metadata": {"name": NODE, "resourceVersion": "1"}, "spec": {}, "status": {"nodeInfo": {}}}
    slices = [gpu_slice(NODE, UUIDS, mig)] if dra else []
    return KubeStandIn(nodes={NODE: node}, dra=dra, resource_slices=slices)


def fencing(stand_in: KubeStandIn, mode: DraMode = DraMode.AUTO) -> FencingKubernetesIsolator:
    client = KubernetesClient(stand_in.url)
    return FencingKubernetesIsolator(client, taints=DeviceTaints(client, mode))


def policy(**overrides) -> LoopPolicy:
    return LoopPolicy(**{"hold_down_s": HOLD_DOWN, "action_timeout_s": 30, **overrides})


def episodes(remediator) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = remediator.state()["episodes"]
    return items


def test_a_reset_class_fault_fences_that_gpu_with_no_execute_and_leaves_the_node_schedulable():
    stand_in = cluster()
    with kube_api(stand_in), receiver(fencing(stand_in), dry_run=False, policy=policy()) as (base, rem):
        (action,) = deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu")))
        (episode,) = episodes(rem)
        metrics = get(f"{base}/metrics")[1]
    (rule,) = stand_in.device_taint_rules.values()
    assert rule["apiVersion"] == "resource.k8s.io/v1beta2"
    assert rule["spec"]["deviceSelector"] == {"driver": DRA_DRIVER, "pool": NODE, "device": "gpu-3"}
    assert rule["spec"]["taint"] == {"key": TAINT_KEY, "value": "GPUXidResetRequired", "effect": "NoExecute"}
    assert stand_in.isolation_patches() == [], "the node is neither cordoned nor tainted"
    assert stand_in.schedulable_devices(NODE) == [f"gpu-{i}" for i in range(8) if i != 3]
    assert action["result"] == "applied" and "7 other GPU(s) in service" in action["detail"]
    assert (episode["fence"], episode["kept_gpus"]) == (rule["metadata"]["name"], 7)
    assert 'gpulens_remediate_isolations_total{scope="gpu"} 1.0' in metrics
    assert 'gpulens_remediate_isolations_total{scope="node"} 0.0' in metrics
    assert "gpulens_remediate_fenced_gpus 1.0" in metrics
    assert "gpulens_remediate_isolated_nodes 0.0" in metrics


@pytest.mark.parametrize(("name", "recovery"), [("GPURowRemapFailed", "rma"), ("GPUCustomFault", "")])
def test_a_fault_whose_action_is_not_a_reset_fences_with_no_schedule(name, recovery):
    stand_in = cluster()
    with kube_api(stand_in), receiver(fencing(stand_in), dry_run=False, policy=policy()) as (base, _rem):
        deliver(base, notification(fault(name, recovery)))
    (rule,) = stand_in.device_taint_rules.values()
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"


def test_a_node_level_fault_isolates_the_node_even_where_gpus_can_be_fenced():
    stand_in = cluster()
    with kube_api(stand_in), receiver(fencing(stand_in), dry_run=False, policy=policy()) as (base, _rem):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node", kind="isolate_node")))
    assert stand_in.device_taint_rules == {}
    assert stand_in.nodes[NODE]["spec"]["unschedulable"] is True
    assert stand_in.schedulable_devices(NODE) == []


@pytest.mark.parametrize(
    ("stand_in", "mode"),
    [(cluster(dra=False), DraMode.AUTO), (cluster(), DraMode.OFF), (cluster(dra=True), DraMode.AUTO)],
    ids=["device-plugin cluster", "fencing off", "gpu not published by a DRA driver"],
)
def test_where_the_gpu_cannot_be_fenced_its_node_is_isolated(stand_in, mode):
    if mode is DraMode.AUTO and stand_in.dra:
        stand_in.resource_slices = [gpu_slice(NODE, UUIDS[:2])]  # GPU 3 is not among them
    with kube_api(stand_in), receiver(fencing(stand_in, mode), dry_run=False, policy=policy()) as (base, rem):
        (action,) = deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu")))
        (episode,) = episodes(rem)
    assert stand_in.device_taint_rules == {}
    assert action["result"] == "applied" and action["detail"].startswith(f"cordoned node {NODE}")
    assert stand_in.nodes[NODE]["spec"]["unschedulable"] is True
    assert episode["fence"] == ""


def test_a_mig_enabled_gpu_is_fenced_through_each_of_its_mig_devices():
    migs = {UUIDS[3]: ["MIG-3a", "MIG-3b"], UUIDS[4]: ["MIG-4a"]}
    stand_in = cluster(mig=migs)
    with kube_api(stand_in), receiver(fencing(stand_in), dry_run=False, policy=policy()) as (base, rem):
        deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu")))
        (episode,) = episodes(rem)
    devices = sorted(r["spec"]["deviceSelector"]["device"] for r in stand_in.device_taint_rules.values())
    assert devices == ["gpu-3", "gpu-3-mig-0", "gpu-3-mig-1"]
    assert sorted(episode["fence"].split(",")) == sorted(stand_in.device_taint_rules)
    assert "gpu-4-mig-0" in stand_in.schedulable_devices(NODE)


def test_a_fenced_gpu_is_reset_held_down_and_returned_by_deleting_its_rule():
    clock, stand_in = Clock(), cluster()
    loop = policy(return_to_service=True)
    with (
        kube_api(stand_in),
        receiver(fencing(stand_in), dry_run=False, clock=clock, policy=loop) as (base, rem),
    ):
        deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu")))
        rem.reconciler.tick()  # the reset Job
        rem.reconciler.tick()  # it succeeded
        deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu", status="resolved")))
        rem.reconciler.tick()  # the hold-down starts
        clock.now += HOLD_DOWN + 1
        rem.reconciler.tick()  # healthy through it: ready
        rem.reconciler.tick()  # returned
        left = episodes(rem)
        metrics = get(f"{base}/metrics")[1]
    (job,) = stand_in.jobs.values()
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-1] == UUIDS[3]
    assert stand_in.device_taint_rules == {}
    assert stand_in.isolation_patches() == [], "the node was never cordoned, so never uncordoned"
    assert left == []
    assert 'gpulens_remediate_episodes_total{outcome="returned",recovery="reset_gpu"} 1.0' in metrics
    assert "gpulens_remediate_fenced_gpus 0.0" in metrics
    kept = [line for line in metrics.splitlines() if line.startswith("gpulens_remediate_healthy_gpus_kept")]
    assert kept == [f"gpulens_remediate_healthy_gpus_kept_seconds_total {7 * (HOLD_DOWN + 1)}"]


def test_a_person_deleting_the_rule_returns_the_gpu_by_hand_and_nothing_more_is_done():
    clock, stand_in = Clock(), cluster()
    loop = policy(return_to_service=True)
    with (
        kube_api(stand_in),
        receiver(fencing(stand_in), dry_run=False, clock=clock, policy=loop) as (base, rem),
    ):
        deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu")))
        stand_in.device_taint_rules.clear()  # kubectl delete devicetaintrule ...
        for _ in range(3):
            rem.reconciler.tick()
            clock.now += HOLD_DOWN
        left = episodes(rem)
        metrics = get(f"{base}/metrics")[1]
    assert stand_in.jobs == {}, "no reset of a GPU a person took back"
    assert left == []
    assert 'gpulens_remediate_episodes_total{outcome="returned_by_hand",recovery="reset_gpu"} 1.0' in metrics
    record = stand_in.nodes[NODE]["metadata"]["annotations"]["gpulens.io/remediation"]
    assert json.loads(record)["state"] == "returned_by_hand"


def test_a_person_returning_the_node_leaves_a_fenced_gpu_fenced():
    """A node-level episode's return by hand (uncordon) is the node's; the GPU's fence is its own."""
    stand_in = cluster()
    with kube_api(stand_in), receiver(fencing(stand_in), dry_run=False, policy=policy()) as (base, rem):
        deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu", gpu=3)))
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node", gpu=5, kind="isolate_node")))
        with stand_in.lock:
            stand_in.nodes[NODE]["spec"] = {"taints": [], "unschedulable": False}  # returned by hand
        rem.reconciler.tick()
        left = episodes(rem)
    assert [(e["alertname"], e["state"]) for e in left] == [("GPUXidResetRequired", "isolated")]
    assert len(stand_in.device_taint_rules) == 1


def test_a_person_returns_a_fenced_gpu_through_the_return_command():
    stand_in = cluster()
    with kube_api(stand_in), receiver(fencing(stand_in), dry_run=False, policy=policy()) as (base, rem):
        deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu")))
        status, answer = post(f"{base}/-/return", {"node": NODE, "force": True})
        left = episodes(rem)
    assert (status, json.loads(answer)["result"]) == (200, "applied")
    assert stand_in.device_taint_rules == {} and left == []


def test_an_unreadable_rule_defers_every_action_on_that_gpu():
    stand_in = cluster()
    with kube_api(stand_in), receiver(fencing(stand_in), dry_run=False, policy=policy()) as (base, rem):
        deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu")))
        stand_in.dra_unavailable = True  # the rule cannot be read now
        rem.reconciler.tick()
        stand_in.dra_unavailable = False
        (waiting,) = episodes(rem)
    assert stand_in.jobs == {}
    assert waiting["state"] == "isolated"
    assert waiting["detail"].startswith(f"the fence of GPU {UUIDS[3]} on node {NODE} cannot be read now")


def test_a_dry_run_describes_the_fence_and_creates_nothing():
    stand_in = cluster()
    with kube_api(stand_in), receiver(fencing(stand_in), dry_run=True, policy=policy()) as (base, _rem):
        (action,) = deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu")))
    assert action["result"] == "dry_run"
    assert f"a DeviceTaintRule {UUIDS[3]}:NoExecute" in action["detail"]
    assert stand_in.device_taint_rules == {} and stand_in.isolation_patches() == []
