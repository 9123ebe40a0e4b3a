"""The return diagnostic on Slurm (issue 35 item 4): a drained node starts no job, so the receiver
puts the node in a maintenance reservation of its own, resumes it into it, submits `gpulens
remediate diag` with `sbatch --reservation`, and once the job is over drains the node again and
deletes the reservation: a pass then returns the node, a failure keeps it drained with an RMA
reason. Every step re-reads the node: a person deleting the reservation or resuming the node
closes the episode as returned by hand. Against the stateful scontrol / squeue / sbatch stand-in,
whose jobs run `gpulens remediate diag` for real with the simulated node's `dcgmi`; time is a test
clock and each reconcile pass one `tick()`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpulens.remediate.loop import LoopPolicy
from gpulens.remediate.slurm import SlurmIsolator
from tests.remediate.remediate_support import (
    Clock,
    alert,
    deliver,
    get,
    notification,
    path_with,
    receiver,
    scontrol_calls,
    scontrol_state,
    sim_dcgmi,
    write_fake_scontrol,
)
from tests.remediate.test_remediate_diagnostic import scenario

HOLD_DOWN = 600.0
NODE = "gpu-17"
RESERVATION = f"gpulens-diag-{NODE}"


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
    values = {"hold_down_s": HOLD_DOWN, "action_timeout_s": 60, "return_to_service": True, "diag_level": 2}
    return LoopPolicy(**{**values, **overrides})


def through_the_hold_down(base: str, rem, clock: Clock) -> None:
    deliver(base, notification(fault()))
    rem.reconciler.tick()  # scontrol reboot ASAP nextstate=DOWN
    rem.reconciler.tick()  # rebooted (a new BootTime)
    deliver(base, notification(fault("resolved")))
    rem.reconciler.tick()  # the hold-down starts
    clock.now += HOLD_DOWN + 1
    rem.reconciler.tick()  # healthy through it: reservation, resume, sbatch


def after_the_reboot(record: Path) -> list[list[str]]:
    """What the receiver ran after the reboot, reads left out."""
    calls = [c for c in scontrol_calls(record) if c[:2] not in (["show", "node"], ["show", "reservation"])]
    (reboot,) = [i for i, c in enumerate(calls) if c[:1] == ["reboot"]]
    return calls[reboot + 1 :]


def audit(path: Path) -> list[str]:
    return [json.loads(line)["event"] for line in path.read_text().splitlines()]


@pytest.fixture
def slurm_node(tmp_path, monkeypatch):
    """The stateful Slurm stand-in whose jobs find the simulated node's dcgmi (passing by default)."""

    def make(*faults: dict[str, Any], **options: Any) -> Path:  # options: write_fake_scontrol's
        bin_dir, record = write_fake_scontrol(tmp_path, stateful=True, user="gpulens", **options)
        sim_dcgmi(bin_dir, scenario(tmp_path, *faults))
        monkeypatch.setenv("PATH", path_with(bin_dir)["PATH"])
        return record

    return make


def test_a_passing_diagnostic_runs_in_a_reservation_and_the_node_returns(slurm_node, tmp_path):
    record, clock, log = slurm_node(), Clock(), tmp_path / "audit.jsonl"
    isolator = SlurmIsolator(diag_user="gpulens")
    with receiver(isolator, dry_run=False, clock=clock, policy=policy(), audit_log=log) as (base, rem):
        through_the_hold_down(base, rem, clock)
        rem.reconciler.tick()  # the job's verdict: drained again, reservation deleted, returned
        left = rem.state()["episodes"]
        metrics = get(f"{base}/metrics")[1]
    create, resume, sbatch, show_job, drain, delete, back = after_the_reboot(record)
    assert create == [
        "create",
        "reservation",
        f"ReservationName={RESERVATION}",
        "StartTime=now",
        "Duration=UNLIMITED",
        f"Nodes={NODE}",
        "Users=gpulens",
        "Flags=MAINT,IGNORE_JOBS",
    ]
    assert resume == ["update", f"NodeName={NODE}", "State=RESUME"]
    assert sbatch[:2] == ["sbatch", "--parsable"]
    assert f"--reservation={RESERVATION}" in sbatch and f"--nodelist={NODE}" in sbatch
    assert "--exclusive" in sbatch and "--gres=gpu:8" in sbatch, "the whole node, every GPU"
    assert sbatch[-1] == "--wrap=gpulens remediate diag --level 2 --gpu 3 --uuid GPU-3"
    assert show_job[:2] == ["show", "job"]
    assert drain == [
        "update",
        f"NodeName={NODE}",
        "State=DRAIN",
        "Reason=gpulens: GPUXidFallenOffBus diagnostic passed",
    ]
    assert delete == ["delete", f"ReservationName={RESERVATION}"], "drained before the reservation goes"
    assert back == ["update", f"NodeName={NODE}", "State=RESUME"]
    state = scontrol_state(tmp_path)
    assert state["nodes"][NODE]["State"] == "IDLE" and state["reservations"] == {}
    (job,) = state["batch"].values()
    assert (job["JobState"], job["ExitCode"], job["UserId"]) == ("COMPLETED", "0:0", "gpulens")
    assert left == []
    assert audit(log)[-3:] == ["diagnostic_started", "diagnostic_passed", "returned"]
    assert 'gpulens_remediate_diagnostics_total{result="passed"} 1.0' in metrics


def test_a_failing_diagnostic_drains_the_node_again_with_an_rma_reason(slurm_node, tmp_path):
    record, clock = slurm_node({"at": "0s", "gpu": 3, "diag_fail": "memory"}), Clock()
    isolator = SlurmIsolator(diag_user="gpulens")
    with receiver(isolator, dry_run=False, clock=clock, policy=policy()) as (base, rem):
        through_the_hold_down(base, rem, clock)
        for _ in range(3):
            rem.reconciler.tick()
            clock.now += HOLD_DOWN
        (episode,) = rem.state()["episodes"]
        metrics = get(f"{base}/metrics")[1]
    state = scontrol_state(tmp_path)
    assert state["nodes"][NODE]["State"] == "IDLE+DRAIN"
    assert state["nodes"][NODE]["Reason"] == "gpulens: GPUXidFallenOffBus RMA: diagnostic failed"
    assert state["reservations"] == {}
    assert after_the_reboot(record)[-1] == ["delete", f"ReservationName={RESERVATION}"], "never resumed"
    assert episode["state"] == "rma" and "return --force" in episode["detail"]
    assert episode["diagnostic"].startswith("gpulens remediate diag (Slurm job 1000): failed")
    assert 'gpulens_remediate_diagnostics_total{result="failed"} 1.0' in metrics


def test_a_reservation_deleted_by_a_person_mid_diagnostic_closes_the_episode_by_hand(slurm_node, tmp_path):
    record, clock, log = slurm_node(hold_jobs=True), Clock(), tmp_path / "audit.jsonl"
    isolator = SlurmIsolator(diag_user="gpulens")
    with receiver(isolator, dry_run=False, clock=clock, policy=policy(), audit_log=log) as (base, rem):
        through_the_hold_down(base, rem, clock)
        rem.reconciler.tick()  # the job still runs
        person = ["scontrol", "delete", f"ReservationName={RESERVATION}"]
        subprocess.run(person, check=True, capture_output=True, timeout=60)
        for _ in range(3):
            rem.reconciler.tick()
            clock.now += HOLD_DOWN
        left = rem.state()["episodes"]
    *_, sbatch, show_job, deleted = after_the_reboot(record)
    assert sbatch[0] == "sbatch" and show_job[:2] == ["show", "job"]
    assert deleted == person[1:], "after the person's delete: no drain, no resume, nothing"
    assert left == []
    assert audit(log)[-2:] == ["diagnostic_started", "returned_by_hand"]
    assert scontrol_state(tmp_path)["nodes"][NODE]["State"] == "IDLE", "the person has the node"


# ---- the stand-in refuses what Slurm refuses -----------------------------------------------------


def sbatch(*options: str) -> subprocess.CompletedProcess[str]:
    command = ["sbatch", "--parsable", *options, "--wrap=true"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def job_state(job: str) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, check=True)
    return shown.stdout


def reserve(node: str, user: str = "gpulens") -> None:
    command = ["scontrol", "create", "reservation", "ReservationName=maint", f"Nodes={node}", f"Users={user}"]
    subprocess.run(command, check=True, capture_output=True, timeout=60)


def test_the_stand_in_keeps_a_job_for_a_drained_node_pending(slurm_node):
    slurm_node()
    drain = ["scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=x"]
    subprocess.run(drain, check=True, capture_output=True, timeout=60)
    job = sbatch("--nodelist=n1").stdout.strip()
    assert "JobState=PENDING Reason=ReqNodeNotAvail" in job_state(job)


def test_the_stand_in_keeps_a_job_outside_the_reservation_off_the_reserved_node(slurm_node):
    slurm_node()
    reserve("n1")
    outside = sbatch("--nodelist=n1").stdout.strip()
    inside = sbatch("--nodelist=n1", "--reservation=maint").stdout.strip()
    assert "JobState=PENDING Reason=ReqNodeNotAvail,_Reserved_for_maintenance" in job_state(outside)
    assert "JobState=COMPLETED" in job_state(inside)


@pytest.mark.parametrize(
    ("reserved_for", "node", "refusal"),
    [
        ("someone", "n1", "Access denied to requested reservation"),
        ("gpulens", "n2", "Requested node configuration is not available"),
    ],
)
def test_the_stand_in_refuses_a_job_the_reservation_does_not_admit(slurm_node, reserved_for, node, refusal):
    slurm_node()
    reserve("n1", reserved_for)
    refused = sbatch(f"--nodelist={node}", "--reservation=maint")
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"sbatch: error: Batch job submission failed: {refusal}"
