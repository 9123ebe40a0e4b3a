"""A diagnostic gates every return (issue 35 items 4 and 5): after the recovery and the hold-down
the receiver runs `gpulens remediate diag` in a Job pinned to the node; a pass returns the GPU, a
failure (or a Job that fails without a verdict) keeps it out on the RMA path until a person runs
`return --force`. The Jobs run for real through the stand-in's kubelet: `dcgmi` is the simulated
node's (sim/dcgm/dcgmi.py), answering from a scenario with or without a `diag_fail` fault.
Against the Kubernetes API stand-in with DRA; time is a test clock and each pass one `tick()`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulens.remediate.diagnose import Result, Verdict, read_dcgmi
from gpulens.remediate.loop import LoopPolicy
from gpulens.sim.dcgm.dcgmi import diag_answer
from gpulens.sim.scenario import ScenarioError
from gpulens.sim.scenariofile import BUILTIN_DIR, load_scenario
from tests.remediate.remediate_support import (
    deliver,
    get,
    kube_api,
    notification,
    post,
    receiver,
    run_diagnostic,
    sim_dcgmi,
)
from tests.remediate.test_remediate_fencing import HOLD_DOWN, NODE, UUIDS, Clock, cluster, fault, fencing


def scenario(tmp_path: Path, *faults: dict[str, Any]) -> Path:
    doc = yaml.safe_load((BUILTIN_DIR / "faults.yaml").read_text())
    doc["faults"] = {"timeline": list(faults)}
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def policy(**overrides) -> LoopPolicy:
    return LoopPolicy(
        **{
            "hold_down_s": HOLD_DOWN,
            "action_timeout_s": 30,
            "return_to_service": True,
            "diag_level": 2,
            **overrides,
        }
    )


def through_the_hold_down(base: str, rem, clock: Clock) -> None:
    deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu")))
    rem.reconciler.tick()  # the reset Job
    rem.reconciler.tick()  # it succeeded
    deliver(base, notification(fault("GPUXidResetRequired", "reset_gpu", status="resolved")))
    rem.reconciler.tick()  # the hold-down starts
    clock.now += HOLD_DOWN + 1
    rem.reconciler.tick()  # healthy through it: the diagnostic Job
    rem.reconciler.tick()  # its verdict (and the return, when it passed)


def diag_jobs(stand_in) -> list[dict[str, Any]]:
    return [j for j in stand_in.jobs.values() if j["metadata"]["labels"]["gpulens.io/action"] == "diagnose"]


def test_a_passing_dcgm_diagnostic_returns_the_fenced_gpu(tmp_path):
    clock, stand_in = Clock(), cluster()
    sim_dcgmi(tmp_path / "bin", scenario(tmp_path))
    stand_in.kubelet = run_diagnostic(tmp_path / "bin")
    with (
        kube_api(stand_in),
        receiver(fencing(stand_in), dry_run=False, clock=clock, policy=policy()) as (
            base,
            rem,
        ),
    ):
        through_the_hold_down(base, rem, clock)
        left = rem.state()["episodes"]
        metrics = get(f"{base}/metrics")[1]
    (job,) = diag_jobs(stand_in)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [
        "gpulens",
        "remediate",
        "diag",
        "--level",
        "2",
        "--gpu",
        "3",
        "--uuid",
        UUIDS[3],
    ]
    assert job["spec"]["template"]["spec"]["nodeName"] == NODE
    assert container["securityContext"]["privileged"] is False
    assert left == [] and stand_in.device_taint_rules == {}, "returned: its rule deleted"
    assert 'gpulens_remediate_diagnostics_total{result="passed"} 1.0' in metrics
    assert 'gpulens_remediate_episodes_total{outcome="returned",recovery="reset_gpu"} 1.0' in metrics


def test_a_failing_diagnostic_keeps_the_gpu_fenced_on_the_rma_path(tmp_path):
    clock, stand_in = Clock(), cluster()
    sim_dcgmi(tmp_path / "bin", scenario(tmp_path, {"at": "0s", "gpu": 3, "diag_fail": "memory"}))
    stand_in.kubelet = run_diagnostic(tmp_path / "bin")
    with (
        kube_api(stand_in),
        receiver(fencing(stand_in), dry_run=False, clock=clock, policy=policy()) as (
            base,
            rem,
        ),
    ):
        through_the_hold_down(base, rem, clock)
        for _ in range(3):
            clock.now += HOLD_DOWN
            rem.reconciler.tick()
        (episode,) = rem.state()["episodes"]
        metrics = get(f"{base}/metrics")[1]
    assert episode["state"] == "rma"
    assert episode["diagnostic"].startswith("dcgmi diag -r 2: failed: memory on GPU 3")
    assert "return --force" in episode["detail"]
    assert len(stand_in.device_taint_rules) == 1, "the GPU stays fenced"
    assert len(diag_jobs(stand_in)) == 1, "diagnosed once, then left to a person"
    assert 'gpulens_remediate_diagnostics_total{result="failed"} 1.0' in metrics
    assert 'gpulens_remediate_episodes_total{outcome="rma",recovery="reset_gpu"} 1.0' in metrics
    record = json.loads(stand_in.nodes[NODE]["metadata"]["annotations"]["gpulens.io/remediation"])
    assert record["state"] == "rma"


def test_a_gpu_kept_out_by_its_diagnostic_returns_only_with_force(tmp_path):
    clock, stand_in = Clock(), cluster()
    sim_dcgmi(tmp_path / "bin", scenario(tmp_path, {"at": "0s", "gpu": 3, "diag_fail": "pcie"}))
    stand_in.kubelet = run_diagnostic(tmp_path / "bin")
    loop = policy(return_to_service=False)
    with (
        kube_api(stand_in),
        receiver(fencing(stand_in), dry_run=False, clock=clock, policy=loop) as (base, rem),
    ):
        through_the_hold_down(base, rem, clock)
        refused = post(f"{base}/-/return", {"node": NODE, "force": False})
        forced = post(f"{base}/-/return", {"node": NODE, "force": True})
        left = rem.state()["episodes"]
    assert refused[0] == 200 and json.loads(refused[1])["result"] == "rejected"
    assert json.loads(forced[1])["result"] == "applied"
    assert left == [] and stand_in.device_taint_rules == {}


def test_without_dcgm_the_nvml_check_runs_and_the_audit_log_says_so(tmp_path):
    clock, stand_in = Clock(), cluster()
    verdict = Verdict(Result.PASSED, "nvml", "no pending retired pages or row remap")
    stand_in.kubelet = lambda job: (0, verdict.to_json())
    audit = tmp_path / "audit.jsonl"
    with (
        kube_api(stand_in),
        receiver(fencing(stand_in), dry_run=False, clock=clock, policy=policy(), audit_log=audit) as (
            base,
            rem,
        ),
    ):
        through_the_hold_down(base, rem, clock)
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    (passed,) = [e for e in lines if e["event"] == "diagnostic_passed"]
    assert passed["episode"]["diagnostic"] == "nvml: passed: no pending retired pages or row remap"
    assert [e["event"] for e in lines][-3:] == ["diagnostic_started", "diagnostic_passed", "returned"]


def test_a_diagnostic_job_that_fails_without_a_verdict_is_an_error_and_keeps_the_gpu_out():
    clock, stand_in = Clock(), cluster()
    stand_in.kubelet = lambda job: (137, "")  # killed: no verdict
    with (
        kube_api(stand_in),
        receiver(fencing(stand_in), dry_run=False, clock=clock, policy=policy()) as (
            base,
            rem,
        ),
    ):
        through_the_hold_down(base, rem, clock)
        (episode,) = rem.state()["episodes"]
        metrics = get(f"{base}/metrics")[1]
    assert episode["state"] == "rma" and "without a verdict" in episode["diagnostic"]
    assert 'gpulens_remediate_diagnostics_total{result="error"} 1.0' in metrics


def test_with_the_diagnostic_off_the_gpu_returns_after_the_hold_down_alone():
    clock, stand_in = Clock(), cluster()
    loop = policy(diag_level=0)
    with (
        kube_api(stand_in),
        receiver(fencing(stand_in), dry_run=False, clock=clock, policy=loop) as (base, rem),
    ):
        through_the_hold_down(base, rem, clock)
        left = rem.state()["episodes"]
    assert diag_jobs(stand_in) == [] and left == []


# ---- reading dcgmi's answer; the simulated DCGM's diagnostics -----------------------------------


def test_dcgmi_json_with_a_failed_test_is_a_failed_verdict_naming_test_gpu_and_warning(tmp_path):
    node = load_scenario(scenario(tmp_path, {"at": "0s", "gpu": 1, "diag_fail": "memory"}))
    verdict = read_dcgmi(diag_answer(node, 2, [1], at=5.0), "dcgmi diag -r 2")
    assert verdict.result is Result.FAILED
    assert verdict.detail == "memory on GPU 1: the memory test failed on GPU 1"


def test_the_simulated_dcgm_passes_by_default_and_runs_the_tests_of_the_level(tmp_path):
    node = load_scenario(scenario(tmp_path))
    answer = diag_answer(node, 1, None, at=0.0)
    assert read_dcgmi(answer, "dcgmi diag -r 1").result is Result.PASSED
    names = [t["name"] for c in answer["DCGM GPU Diagnostic"]["test_categories"] for t in c["tests"]]
    assert names == ["software"]


def test_a_diag_fail_fault_fails_only_levels_that_run_its_test(tmp_path):
    node = load_scenario(scenario(tmp_path, {"at": "0s", "gpu": 0, "diag_fail": "diagnostic"}))
    assert read_dcgmi(diag_answer(node, 2, [0], at=1.0), "l2").result is Result.PASSED
    assert read_dcgmi(diag_answer(node, 3, [0], at=1.0), "l3").result is Result.FAILED


def test_a_diag_fail_fault_with_a_duration_ends(tmp_path):
    node = load_scenario(scenario(tmp_path, {"at": "10s", "for": "20s", "gpu": 0, "diag_fail": "pcie"}))
    results = [read_dcgmi(diag_answer(node, 2, [0], at=t), "x").result for t in (5.0, 15.0, 31.0)]
    assert results == [Result.PASSED, Result.FAILED, Result.PASSED]


def test_an_unknown_diag_test_is_a_one_line_error_naming_the_field(tmp_path):
    with pytest.raises(ScenarioError) as raised:
        load_scenario(scenario(tmp_path, {"at": "0s", "gpu": 0, "diag_fail": "memroy"}))
    message = str(raised.value)
    assert "faults.timeline[0].diag_fail" in message and "memory" in message and "\n" not in message


@pytest.mark.parametrize("answer", [{}, {"DCGM GPU Diagnostic": {"test_categories": []}}, ["x"]])
def test_an_answer_that_is_not_dcgmi_json_is_an_error(answer):
    assert read_dcgmi(answer, "dcgmi diag -r 2").result is Result.ERROR


def test_a_termination_message_that_is_not_a_verdict_reads_as_none():
    assert Verdict.from_message("Error: OOMKilled") is None
    assert Verdict.from_message('{"result": "maybe", "check": "x", "detail": ""}') is None
    assert Verdict.from_message(Verdict(Result.FAILED, "nvml", "row remap pending").to_json()) == Verdict(
        Result.FAILED, "nvml", "row remap pending"
    )
