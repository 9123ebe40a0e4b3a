"""The fault loop (issue 18): isolate -> recovery action of the fault's class -> hold-down -> return
to service, recorded in the audit log and the metrics, resumed after a restart; against the
stateful scontrol stand-in and the Kubernetes API stand-in. Time is a test clock; each reconcile
pass is one `tick()`."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from gpulens.httpclient import Deadline
from gpulens.remediate.kubernetes import LIST_PAGE, TAINT_KEY, KubernetesClient, KubernetesIsolator
from gpulens.remediate.loop import LoopPolicy
from gpulens.remediate.slurm import SlurmIsolator
from tests.remediate.remediate_support import (
    TOKEN,
    Clock,
    KubeStandIn,
    alert,
    deliver,
    get,
    kube_api,
    notification,
    path_with,
    post,
    receiver,
    scontrol_calls,
    scontrol_state,
    write_fake_scontrol,
)

HOLD_DOWN = 600.0


def fault(name: str, recovery: str, status: str = "firing", **labels: str) -> dict[str, Any]:
    kind = "isolate_node" if recovery == "reboot_node" else "isolate_gpu"
    return alert(
        alertname=name,
        instance=labels.pop("instance", "gpu-17:9842"),
        gpu=labels.pop("gpu", "3"),
        remediate=kind,
        recovery=recovery,
        status=status,
        fingerprint=f"fp-{name}",
        starts_at=labels.pop("starts_at", "2026-12-01T10:00:00Z"),
        **labels,
    )


def episodes(remediator) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in remediator.state()["episodes"]}


def audit_events(path) -> list[tuple[str, str]]:
    return [(d["event"], d["episode"]["state"]) for d in map(json.loads, path.read_text().splitlines())]


def _policy(**overrides) -> LoopPolicy:
    return LoopPolicy(**{"hold_down_s": HOLD_DOWN, "action_timeout_s": 30, **overrides})


def test_reboot_class_fault_reboots_holds_down_and_returns_the_node(slurm, tmp_path):
    clock, log = Clock(), tmp_path / "audit.jsonl"
    policy = _policy(return_to_service=True)
    with receiver(SlurmIsolator(), dry_run=False, clock=clock, audit_log=log, policy=policy) as (base, rem):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        rem.reconciler.tick()  # starts the reboot
        clock.now += 120
        rem.reconciler.tick()  # sees the new boot
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node", status="resolved")))
        rem.reconciler.tick()  # hold-down starts
        clock.now += HOLD_DOWN - 1
        rem.reconciler.tick()
        still_out = scontrol_state(tmp_path)["nodes"]["gpu-17"]["State"]
        clock.now += 2
        rem.reconciler.tick()  # healthy through the hold-down: returned
        metrics = get(f"{base}/metrics")[1]
        left = episodes(rem)
    commands = [c[:3] for c in scontrol_calls(slurm) if c[0] != "show"]
    assert commands == [
        ["update", "NodeName=gpu-17", "State=DRAIN"],
        ["reboot", "ASAP", "nextstate=DOWN"],
        ["update", "NodeName=gpu-17", "State=RESUME"],
    ]
    assert still_out.startswith("DOWN")
    assert scontrol_state(tmp_path)["nodes"]["gpu-17"]["State"] == "IDLE"
    assert left == {}
    assert [e for e, _ in audit_events(log)] == [
        "isolated",
        "action_started",
        "action_finished",
        "resolved",
        "hold_down",
        "recovered",
        "returned",
    ]
    (*_, last) = map(json.loads, log.read_text().splitlines())
    done = last["episode"]
    assert last["ts"].endswith("Z")
    assert done["isolated_at"] <= done["action_started_at"] <= done["action_finished_at"]
    assert done["action_finished_at"] <= done["recovered_at"] <= done["returned_at"]
    assert 'gpulens_remediate_episodes_total{outcome="returned",recovery="reboot_node"} 1.0' in metrics
    assert 'gpulens_remediate_time_to_return_seconds_count{recovery="reboot_node"} 1.0' in metrics
    assert "gpulens_remediate_isolated_nodes 0.0" in metrics


def test_reset_class_fault_runs_a_reset_job_and_a_person_returns_the_node(tmp_path):
    clock = Clock()
    node = {"metadata": {"name": "gpu-17", "resourceVersion": "1"}, "spec": {}}
    stand_in = KubeStandIn(nodes={"gpu-17": node})
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url), job_namespace="ops")
        with receiver(isolator, dry_run=False, clock=clock, policy=_policy()) as (base, rem):
            deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu", uuid="GPU-aa")))
            rem.reconciler.tick()  # creates the reset Job
            rem.reconciler.tick()  # the Job succeeded
            deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu", status="resolved")))
            rem.reconciler.tick()
            clock.now += HOLD_DOWN + 1
            rem.reconciler.tick()
            ready = episodes(rem)
            tainted = [t["key"] for t in stand_in.nodes["gpu-17"]["spec"]["taints"]]
            status, answer = post(f"{base}/-/return", {"node": "gpu-17"})
    (job,) = stand_in.jobs.values()
    pod = job["spec"]["template"]["spec"]
    assert (job["metadata"]["namespace"], pod["nodeName"]) == ("ops", "gpu-17")
    assert pod["containers"][0]["command"] == ["nvidia-smi", "-r", "-i", "GPU-aa"]
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert [e["state"] for e in ready.values()] == ["ready"]
    assert tainted == [TAINT_KEY], "without --return-to-service the node waits for a person"
    assert (status, json.loads(answer)["result"]) == (200, "applied")
    assert stand_in.nodes["gpu-17"]["spec"] == {"unschedulable": False, "taints": []}
    annotations = stand_in.nodes["gpu-17"]["metadata"]["annotations"]
    assert "gpulens.io/isolated-at" not in annotations and "gpulens.io/returned-at" in annotations
    assert json.loads(annotations["gpulens.io/remediation"])["state"] == "returned"


def test_kubernetes_reboot_waits_until_the_node_is_drained(tmp_path):
    node = {"metadata": {"name": "gpu-17", "resourceVersion": "1"}, "spec": {}}
    pod = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {"nodeName": "gpu-17"}, "status": {}}
    stand_in = KubeStandIn(nodes={"gpu-17": node}, pods=[pod])
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url))
        with receiver(isolator, dry_run=False, clock=Clock(), policy=_policy()) as (base, rem):
            deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
            rem.reconciler.tick()
            waiting = episodes(rem)
            stand_in.pods.clear()  # the job finished and its pod is gone
            rem.reconciler.tick()  # the reboot Job
            rem.reconciler.tick()  # the node reports a new boot ID
            done = episodes(rem)
    assert [(e["state"], e["detail"]) for e in waiting.values()] == [
        ("isolated", "node gpu-17 still runs 1 pod(s); reboot once drained")
    ]
    (job,) = stand_in.jobs.values()
    assert job["spec"]["template"]["spec"]["hostPID"] is True
    assert [e["state"] for e in done.values()] == ["recovered"]


def test_an_rma_class_fault_is_kept_isolated_with_a_ticket_and_never_returned(slurm, tmp_path):
    clock, log = Clock(), tmp_path / "audit.jsonl"
    policy = _policy(return_to_service=True)
    with receiver(SlurmIsolator(), dry_run=False, clock=clock, audit_log=log, policy=policy) as (base, rem):
        deliver(base, notification(fault("GPURowRemapFailed", "rma")))
        deliver(base, notification(fault("GPURowRemapFailed", "rma", status="resolved")))
        for _ in range(3):
            clock.now += HOLD_DOWN
            rem.reconciler.tick()
        _, asked = post(f"{base}/-/return", {"node": "gpu-17"})
        _, forced = post(f"{base}/-/return", {"node": "gpu-17", "force": True})
        left = episodes(rem)
    (episode,) = left.values()
    assert episode["state"] == "rma"
    assert episode["detail"].startswith("RMA ticket: GPURowRemapFailed on node gpu-17 gpu 3")
    assert [json.loads(a)["result"] for a in (asked, forced)] == ["rejected", "rejected"]
    assert [c[0] for c in scontrol_calls(slurm) if c[0] != "show"] == ["update"]  # the drain only
    assert audit_events(log)[0] == ("ticket", "rma")


def test_a_flapping_node_is_not_returned_twice_within_the_window(slurm, tmp_path):
    clock = Clock()
    policy = _policy(return_to_service=True, flap_window_s=86_400)
    with receiver(SlurmIsolator(), dry_run=False, clock=clock, policy=policy) as (base, rem):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        rem.reconciler.tick()
        rem.reconciler.tick()
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node", status="resolved")))
        rem.reconciler.tick()
        clock.now += HOLD_DOWN + 1
        rem.reconciler.tick()  # returned once
        clock.now += 3600  # faulty again an hour later
        again = fault("GPUXidFallenOffBus", "reboot_node", starts_at="2026-12-01T12:00:00Z")
        deliver(base, notification(again))
        deliver(base, notification({**again, "status": "resolved"}))
        for _ in range(3):
            clock.now += HOLD_DOWN + 1
            rem.reconciler.tick()
        left = episodes(rem)
        metrics = get(f"{base}/metrics")[1]
    (episode,) = left.values()
    assert episode["state"] == "escalated"
    assert "faulty again 3" in episode["detail"]
    resumes = [c for c in scontrol_calls(slurm) if c[:1] == ["update"] and "State=RESUME" in c]
    reboots = [c for c in scontrol_calls(slurm) if c[:1] == ["reboot"]]
    assert (len(resumes), len(reboots)) == (1, 1)
    assert 'gpulens_remediate_episodes_total{outcome="escalated",recovery="reboot_node"} 1.0' in metrics
    assert "gpulens_remediate_isolated_nodes 1.0" in metrics


def test_the_breaker_applies_to_reboots_as_to_isolations(slurm):
    with receiver(SlurmIsolator(), dry_run=False, max_nodes=1, clock=Clock(), policy=_policy()) as (
        base,
        rem,
    ):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node", instance="gpu-1:1")))
        deliver(base, notification(fault("GPULost", "reboot_node", instance="gpu-2:1")))  # opens it
        rem.breaker.reset()
        rem.breaker.commit(rem.breaker.reserve("gpu-9"))  # another node fills the fresh window
        rem.reconciler.tick()
        left = episodes(rem)
    assert [c for c in scontrol_calls(slurm) if c[:1] == ["reboot"]] == []
    (episode,) = left.values()
    assert (episode["node"], episode["state"]) == ("gpu-1", "isolated")
    assert episode["detail"].startswith("circuit breaker open")


def test_dry_run_is_the_default_and_only_describes_the_recovery(slurm):
    with receiver(SlurmIsolator(), clock=Clock(), policy=_policy(return_to_service=True)) as (base, rem):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        for _ in range(3):
            rem.reconciler.tick()
        left = episodes(rem)
    assert scontrol_calls(slurm) == []
    (episode,) = left.values()
    assert episode["state"] == "dry_run"
    assert "then reboot_node: scontrol reboot ASAP nextstate=DOWN" in episode["detail"]


def test_a_restarted_receiver_resumes_its_episodes_from_the_audit_log(slurm, tmp_path):
    clock, log = Clock(), tmp_path / "audit.jsonl"
    with receiver(SlurmIsolator(), dry_run=False, clock=clock, audit_log=log, policy=_policy()) as (
        base,
        rem,
    ):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        rem.reconciler.tick()  # reboot started, then the receiver stops
    with receiver(SlurmIsolator(), dry_run=False, clock=clock, audit_log=log, policy=_policy()) as (
        base,
        rem,
    ):
        resumed = [e["state"] for e in episodes(rem).values()]
        repeat = deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        rem.reconciler.tick()
        after = [e["state"] for e in episodes(rem).values()]
        metrics = get(f"{base}/metrics")[1]
    assert resumed == ["recovering"]
    assert repeat[0]["result"] == "duplicate"
    assert after == ["recovered"]
    assert len([c for c in scontrol_calls(slurm) if c[:1] == ["reboot"]]) == 1
    assert 'gpulens_remediate_episodes_open{state="recovering"} 0.0' in metrics  # not -1
    assert 'gpulens_remediate_episodes_open{state="recovered"} 1.0' in metrics


def test_return_command_asks_the_receiver(slurm, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    clock = Clock()
    with receiver(SlurmIsolator(), dry_run=False, clock=clock, policy=_policy()) as (base, rem):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        command = [sys.executable, "-m", "gpulens.cli", "remediate", "return", "gpu-17"]
        command += ["--url", base, "--token-file", str(token)]
        early = subprocess.run(command, capture_output=True, text=True, timeout=60)
        rem.reconciler.tick()
        rem.reconciler.tick()
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node", status="resolved")))
        rem.reconciler.tick()
        clock.now += HOLD_DOWN + 1
        rem.reconciler.tick()
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert early.returncode == 1
    assert early.stdout == "rejected: node gpu-17 is not ready to return (isolated); --force overrides\n"
    assert (done.returncode, done.stdout) == (0, "applied: scontrol update NodeName=gpu-17 State=RESUME\n")


def test_an_unknown_recovery_label_is_rejected(slurm):
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        body = deliver(base, notification(fault("GPUXidFallenOffBus", "format_disk")))
    assert body[0]["result"] == "rejected"
    assert scontrol_calls(slurm) == []


def test_enough_faulty_gpus_take_the_node_out_whole_and_one_reboot_recovers_them(tmp_path):
    clock = Clock()
    node = {"metadata": {"name": "gpu-17", "resourceVersion": "1"}, "spec": {}, "status": {"nodeInfo": {}}}
    stand_in = KubeStandIn(nodes={"gpu-17": node})
    policy = _policy(return_to_service=True, node_gpu_threshold=2)
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url), drain=True)
        with receiver(isolator, dry_run=False, clock=clock, policy=policy) as (base, rem):
            first = fault("GPUXidResetRequired", "reset_gpu", gpu="1")
            second = fault("GPUXidDoubleBitEccError", "reset_gpu", gpu="5")
            deliver(base, notification(first))
            deliver(base, notification(second))
            opened = sorted((e["alertname"], e["kind"], e["recovery"]) for e in episodes(rem).values())
            for _ in range(3):
                rem.reconciler.tick()
            recovered = sorted(e["state"] for e in episodes(rem).values())
            for raw in (first, second):
                deliver(base, notification({**raw, "status": "resolved"}))
            rem.reconciler.tick()
            rem.reconciler.tick()
            clock.now += HOLD_DOWN + 1
            rem.reconciler.tick()
            left = episodes(rem)
    assert opened == [
        ("GPUNodeFaultyGpus", "isolate_node", "reboot_node"),
        ("GPUXidDoubleBitEccError", "isolate_gpu", "reset_gpu"),
        ("GPUXidResetRequired", "isolate_gpu", "reset_gpu"),
    ]
    (job,) = stand_in.jobs.values()  # one reboot, no reset Jobs
    assert job["metadata"]["labels"]["gpulens.io/action"] == "reboot_node"
    assert recovered == ["recovered", "recovered", "recovered"]
    assert left == {}
    assert stand_in.nodes["gpu-17"]["spec"]["unschedulable"] is False


# --- requeue of the node's jobs with the reboot (--slurm-requeue) ----------------------------------


@pytest.fixture
def slurm_jobs(tmp_path, monkeypatch):
    """The stateful scontrol + squeue stand-in with jobs 101 and 102 running on gpu-17; 103 on gpu-18."""
    bin_dir, record = write_fake_scontrol(
        tmp_path, stateful=True, jobs={"gpu-17": [102, 101], "gpu-18": [103]}
    )
    monkeypatch.setenv("PATH", path_with(bin_dir)["PATH"])
    return record


def test_requeue_asked_for_requeues_the_node_s_jobs_through_slurm_with_the_reboot(slurm_jobs, tmp_path):
    log = tmp_path / "audit.jsonl"
    isolator = SlurmIsolator(requeue=True)
    with receiver(isolator, dry_run=False, clock=Clock(), audit_log=log, policy=_policy()) as (base, rem):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        rem.reconciler.tick()
    calls = [c for c in scontrol_calls(slurm_jobs) if c[0] != "show"]
    assert [c[:2] for c in calls] == [
        ["update", "NodeName=gpu-17"],
        ["reboot", "ASAP"],
        ["squeue", "--noheader"],
        ["requeue", "Incomplete"],
    ]
    assert "--nodelist=gpu-17" in calls[2] and "--format=%A" in calls[2]
    assert calls[3] == ["requeue", "Incomplete", "101,102"]
    state = scontrol_state(tmp_path)
    assert state["requeued"] == ["101", "102"] and state["jobs"] == {"gpu-17": [], "gpu-18": [103]}
    started = [json.loads(line) for line in log.read_text().splitlines()][1]
    assert started["event"] == "action_started"
    assert started["episode"]["detail"].endswith("; requeued 2 job(s): scontrol requeue Incomplete 101,102")


def test_without_requeue_the_jobs_are_left_to_finish_before_the_reboot(slurm_jobs, tmp_path):
    with receiver(SlurmIsolator(), dry_run=False, clock=Clock(), policy=_policy()) as (base, rem):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        rem.reconciler.tick()
    assert [c[0] for c in scontrol_calls(slurm_jobs) if c[0] != "show"] == ["update", "reboot"]
    assert "requeued" not in scontrol_state(tmp_path)


def test_a_job_slurm_will_not_requeue_is_recorded_and_the_reboot_still_goes_ahead(tmp_path, monkeypatch):
    bin_dir, _ = write_fake_scontrol(tmp_path, stateful=True, jobs={"gpu-17": [101]}, no_requeue=[101])
    monkeypatch.setenv("PATH", path_with(bin_dir)["PATH"])
    with receiver(SlurmIsolator(requeue=True), dry_run=False, clock=Clock(), policy=_policy()) as (base, rem):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        rem.reconciler.tick()
        (episode,) = episodes(rem).values()
    assert episode["state"] == "recovering"
    assert "; requeue failed: scontrol requeue Incomplete 101: " in episode["detail"]
    assert "Only batch jobs are accepted" in episode["detail"]


def test_a_job_list_that_is_not_job_ids_is_refused_without_requeuing(tmp_path, monkeypatch):
    bin_dir, record = write_fake_scontrol(tmp_path, stateful=True, jobs={"gpu-17": ["101", "ALL"]})
    monkeypatch.setenv("PATH", path_with(bin_dir)["PATH"])
    with receiver(SlurmIsolator(requeue=True), dry_run=False, clock=Clock(), policy=_policy()) as (base, rem):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        rem.reconciler.tick()
        (episode,) = episodes(rem).values()
    assert "requeue refused: squeue printed 'ALL', not a job id" in episode["detail"]
    assert not [c for c in scontrol_calls(record) if c[:1] == ["requeue"]]


def test_requeue_is_behind_the_breaker_with_the_reboot(slurm_jobs):
    with receiver(
        SlurmIsolator(requeue=True), dry_run=False, max_nodes=1, clock=Clock(), policy=_policy()
    ) as (
        base,
        rem,
    ):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        rem.breaker.reset()
        rem.breaker.commit(rem.breaker.reserve("gpu-9"))  # another node fills the fresh window
        rem.reconciler.tick()
    assert [c[0] for c in scontrol_calls(slurm_jobs) if c[0] != "show"] == ["update"]


def test_a_dry_run_describes_the_requeue_and_runs_nothing(slurm_jobs):
    with receiver(SlurmIsolator(requeue=True), clock=Clock(), policy=_policy()) as (base, rem):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node")))
        rem.reconciler.tick()
        (episode,) = episodes(rem).values()
    assert scontrol_calls(slurm_jobs) == []
    assert episode["state"] == "dry_run"
    assert (
        "; then scontrol requeue Incomplete <the jobs of: squeue --noheader --nodelist=gpu-17 --format=%A "
        "--states=CONFIGURING,RUNNING,STOPPED,SUSPENDED>" in episode["detail"]
    )


# --- state kept on the nodes: a restart without the audit log (an emptyDir lost with the pod) ----


def _kube_receiver(stand_in, clock, log, **policy):
    isolator = KubernetesIsolator(KubernetesClient(stand_in.url), job_namespace="ops")
    return receiver(isolator, dry_run=False, clock=clock, audit_log=log, policy=_policy(**policy))


def test_a_receiver_restarted_with_an_empty_audit_dir_resumes_from_the_node_and_returns_it(tmp_path):
    clock = Clock()
    stand_in = KubeStandIn(
        nodes={"gpu-17": {"metadata": {"name": "gpu-17", "resourceVersion": "1"}, "spec": {}}}
    )
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()  # the new pod's emptyDir: no audit log
    with kube_api(stand_in):
        with _kube_receiver(stand_in, clock, tmp_path / "first" / "audit.jsonl") as (base, rem):
            deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu", uuid="GPU-aa")))
            rem.reconciler.tick()  # creates the reset Job; then the pod is gone
        kept = stand_in.episode_records("gpu-17")
        log = tmp_path / "second" / "audit.jsonl"
        with _kube_receiver(stand_in, clock, log, return_to_service=True) as (base, rem):
            resumed = (rem.resumed, rem.resumed_from, [e["state"] for e in episodes(rem).values()])
            at_start = get(f"{base}/metrics")[1]
            repeat = deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu", uuid="GPU-aa")))
            rem.reconciler.tick()  # the Job it started before the restart succeeded
            after_step = get(f"{base}/metrics")[1]
            deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu", status="resolved")))
            rem.reconciler.tick()  # hold-down starts
            clock.now += HOLD_DOWN + 1
            rem.reconciler.tick()  # ready, and returned
            left = episodes(rem)
    assert [e["state"] for e in kept.values()] == ["recovering"]
    assert resumed == (1, "node annotations", ["recovering"])
    assert 'gpulens_remediate_episodes_open{state="recovering"} 1.0' in at_start
    assert 'gpulens_remediate_episodes_open{state="recovering"} 0.0' in after_step
    assert 'gpulens_remediate_episodes_open{state="recovered"} 1.0' in after_step
    assert repeat[0]["result"] == "duplicate"
    assert len(stand_in.jobs) == 1, "the reset is not started a second time"
    assert left == {}
    assert stand_in.nodes["gpu-17"]["spec"] == {"unschedulable": False, "taints": []}
    assert stand_in.episode_records("gpu-17") == {}, "a returned episode leaves no record behind"
    events = [e for e, _ in audit_events(log)]
    assert events == ["resumed", "action_finished", "resolved", "hold_down", "recovered", "returned"]


def test_the_audit_log_wins_over_the_node_annotations_when_both_exist(tmp_path):
    clock, log = Clock(), tmp_path / "audit.jsonl"
    stand_in = KubeStandIn(
        nodes={"gpu-17": {"metadata": {"name": "gpu-17", "resourceVersion": "1"}, "spec": {}}}
    )
    with kube_api(stand_in):
        with _kube_receiver(stand_in, clock, log) as (base, rem):
            deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu", uuid="GPU-aa")))
        # a stale record on the node (a write that lagged the log) says something else
        key, record = next(iter(stand_in.episode_records("gpu-17").items()))
        stale = {**record, "state": "ready"}
        stand_in.nodes["gpu-17"]["metadata"]["annotations"][key] = json.dumps(stale)
        lists_before = len([r for r in stand_in.of("GET") if r.path.startswith("/api/v1/nodes?")])
        with _kube_receiver(stand_in, clock, log) as (base, rem):
            resumed = (rem.resumed_from, [e["state"] for e in episodes(rem).values()])
        lists_after = len([r for r in stand_in.of("GET") if r.path.startswith("/api/v1/nodes?")])
    assert resumed == ("audit log", ["isolated"])
    assert lists_after == lists_before, "with an audit log the nodes are not listed"


def test_a_dry_run_neither_writes_nor_adopts_node_records(tmp_path):
    record = {
        "id": "fp@1", "node": "gpu-17", "alertname": "GPULost", "kind": "isolate_node",
        "recovery": "reboot_node", "state": "isolated", "detected_at": 1.0,
    }  # fmt: skip
    annotations = {"episodes.gpulens.io/abc": json.dumps(record)}
    node = {"metadata": {"name": "gpu-17", "resourceVersion": "1", "annotations": annotations}, "spec": {}}
    stand_in = KubeStandIn(nodes={"gpu-17": node})
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url))
        with receiver(isolator, clock=Clock(), policy=_policy()) as (base, rem):
            deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node", instance="gpu-17:1")))
            adopted = rem.resumed
    assert adopted == 0 and stand_in.requests == []


def test_unreadable_node_records_are_skipped_and_node_lists_are_paged(tmp_path):
    good = {
        "id": "fp@1", "node": "gpu-2", "alertname": "GPULost", "kind": "isolate_node",
        "recovery": "reboot_node", "state": "isolated", "detected_at": 1.0,
    }  # fmt: skip
    bad = [
        "not json",
        json.dumps({**good, "node": "gpu-9"}),  # another node's episode
        json.dumps({**good, "state": "returned"}),  # closed
        json.dumps({**good, "detected_at": "yesterday"}),
        json.dumps({**good, "recovery": "format_disk"}),
    ]
    nodes = {
        f"gpu-{i}": {"metadata": {"name": f"gpu-{i}", "annotations": {}}, "spec": {}} for i in range(250)
    }
    nodes["gpu-2"]["metadata"]["annotations"]["episodes.gpulens.io/good"] = json.dumps(good)
    for k, value in enumerate(bad):
        nodes["gpu-3"]["metadata"]["annotations"][f"episodes.gpulens.io/bad{k}"] = value
    nodes["gpu-4"]["metadata"]["annotations"]["gpulens.io/returned-at"] = "2026-12-01T10:00:00Z"
    stand_in = KubeStandIn(nodes=nodes)
    with kube_api(stand_in):
        kept = KubernetesIsolator(KubernetesClient(stand_in.url)).recorded(Deadline(30))
    assert [(e.id, e.node, e.state.value) for e in kept.episodes] == [("fp@1", "gpu-2", "isolated")]
    assert kept.skipped == len(bad)
    assert kept.returned == {"gpu-4": 1_796_119_200.0}
    pages = -(-250 // LIST_PAGE)
    assert len([r for r in stand_in.of("GET") if r.path.startswith("/api/v1/nodes?")]) == pages


def test_a_node_whose_calls_hang_does_not_delay_another_nodes_steps(slurm, tmp_path):
    import threading

    clock = Clock()
    isolator = SlurmIsolator()
    hang, entered = threading.Event(), threading.Event()
    can_start = isolator.can_start

    def slow_for_one_node(episode, deadline):
        if episode.node == "gpu-hung":
            entered.set()
            hang.wait(30)
        return can_start(episode, deadline)

    isolator.can_start = slow_for_one_node
    with receiver(isolator, dry_run=False, clock=clock, policy=_policy()) as (base, rem):
        deliver(base, notification(fault("GPUXidFallenOffBus", "reboot_node", instance="gpu-hung:9842")))
        deliver(
            base,
            notification(
                {
                    **fault("GPUXidFallenOffBus", "reboot_node", instance="gpu-17:9842"),
                    "fingerprint": "fp-other",
                }
            ),
        )
        started = rem.reconciler.tick(wait=False)
        assert entered.wait(10)  # gpu-hung's pass is stuck in its orchestrator call
        other = next(e for e in episodes(rem).values() if e["node"] == "gpu-17")
        for _ in range(200):  # a guard, not a bound: gpu-17's step must not wait for gpu-hung
            other = next(e for e in episodes(rem).values() if e["node"] == "gpu-17")
            if other["state"] == "recovering":
                break
            hang.wait(0.05)
        assert other["state"] == "recovering"
        assert "gpu-hung" not in rem.reconciler.tick(wait=False)  # still busy: not started twice
        hang.set()
    assert sorted(started) == ["gpu-17", "gpu-hung"]
    assert ["reboot", "ASAP", "nextstate=DOWN"] in [c[:3] for c in scontrol_calls(slurm)]
