"""The plan says what the device plugin will run (issue 30 items 1, 2 and 4): `planasrun.as_run`.

A Kubernetes node's planned MPS that the device plugin cannot run is time-slicing in the plan
itself, and where it does run MPS each client's share is the plugin's `100 // replicas`; Slurm
nodes keep their per-job MPS shares. Two nodes are checked end to end (tests/data/planasrun/):
one whose planned MPS sits beside MIG and a whole trainer, one of whole GPUs only; plan.json,
jobs.json and the summary agree with the ConfigMap.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from gpulens.analyzer import emit as em
from gpulens.analyzer.pipeline import analyze_profiles
from gpulens.analyzer.planasrun import as_run
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.cli import main
from gpulens.sim.applyfiles import apply_plan_files
from gpulens.sim.history import simulate
from tests.analyzer import synth
from tests.analyzer.synth import SynthJob, flat, steady
from tests.analyzer.test_emit import context, mps_gpu, plan, whole_gpu

DATA = Path(__file__).resolve().parents[1] / "data" / "planasrun"
START = 1_750_000_200.0
NO_RECS = pd.DataFrame({"job_id": []})
THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
GIB = 1024**3


def _clients(entry):
    return {c["job_id"]: c for c in entry.get("mps_clients", [])}


# ---------------------------------------------------------------- one node at a time


def test_a_kubernetes_node_of_mps_gpus_alone_keeps_mps_with_the_plugins_share_per_client():
    ctx = context({"k8s-1": 1}, "kubernetes", "abc")
    run = as_run(plan(mps_gpu("g", ("a", 10), ("b", 20), ("c", 30))), NO_RECS, ctx)
    [entry] = run.plan.layout
    assert entry["sharing"] == "mps"
    assert {j: c[THREADS] for j, c in _clients(entry).items()} == {"a": 33, "b": 33, "c": 33}


def test_a_planned_share_below_the_plugins_is_kept_as_the_clients_sized_demand():
    ctx = context({"k8s-1": 1}, "kubernetes", "abc")
    run = as_run(plan(mps_gpu("g", ("a", 10), ("b", 20), ("c", 30))), NO_RECS, ctx)
    [entry] = run.plan.layout
    assert {j: c.get("sized_thread_percentage") for j, c in _clients(entry).items()} == {
        "a": 10,
        "b": 20,
        "c": 30,
    }
    moved = run.plan.moved["a"]
    assert (moved["mps_active_thread_percentage"], moved["mps_sized_thread_percentage"]) == (33, 10)
    assert "33 % of the threads; 10 % is its sized demand" in moved["note"]
    assert [a.what for a in run.adjustments] == ["mps-equal-share"]


def test_emit_writes_the_mps_node_the_plan_describes_and_changes_nothing_more():
    ctx = context({"k8s-1": 1}, "kubernetes", "abc")
    run = as_run(plan(mps_gpu("g", ("a", 10), ("b", 20), ("c", 30))), NO_RECS, ctx)
    out = em.emit(run.plan, ctx, run.adjustments)
    assert "k8s-1 nvidia.com/device-plugin.config=gpulens-mps-3 " in out.files["node-labels.sh"]
    assert [a.what for a in out.adjustments] == ["mps-equal-share"]


def test_mps_beside_a_whole_gpu_is_time_slicing_in_the_plan_with_the_reason_on_each_job():
    ctx = context({"k8s-1": 2}, "kubernetes", "abx")
    run = as_run(plan(mps_gpu("g", ("a", 30), ("b", 30)), whole_gpu("w", "x")), NO_RECS, ctx)
    shared = next(e for e in run.plan.layout if e["gpu"] == "g")
    assert (shared["sharing"], "mps_clients" in shared, shared["replicas"]) == ("time-slicing", False, 2)
    assert (shared["planned_sharing"], shared["adjustment"]) == ("mps", "mps-beside-whole")
    for job in "ab":
        assert run.plan.moved[job]["recommendation"] == "time-slicing"
        assert run.plan.moved[job]["mps_active_thread_percentage"] is None
        assert "also runs whole GPUs" in run.plan.moved[job]["note"]


def test_clients_planned_above_the_equal_split_make_the_plan_time_slice_their_node():
    ctx = context({"k8s-1": 2}, "kubernetes", "abc")
    run = as_run(plan(mps_gpu("g", ("a", 55), ("b", 20), ("c", 10))), NO_RECS, ctx)
    assert [e["sharing"] for e in run.plan.layout] == ["time-slicing"]
    assert {run.plan.moved[j]["recommendation"] for j in "abc"} == {"time-slicing"}
    assert [a.what for a in run.adjustments] == ["mps-equal-split"]


def test_a_client_that_needs_more_than_the_plugins_memory_split_makes_the_plan_time_slice_its_node():
    """The plugin's MPS daemon pins each client to total / replicas (20 GiB of an A100-40GB for two)
    and a client can only lower its own limit: a client that needs 30 GiB would fail to allocate."""
    gpu = mps_gpu("g", ("a", 30), ("b", 30))
    gpu["mps_clients"][0]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = 30 * GIB
    run = as_run(plan(gpu), NO_RECS, context({"k8s-1": 1}, "kubernetes", "ab"))
    assert [e["sharing"] for e in run.plan.layout] == ["time-slicing"]
    [adjustment] = run.adjustments
    assert (adjustment.what, adjustment.jobs) == ("mps-memory-split", ("a",))
    assert "pins each of 2 clients to 20480 MiB of memory (total / replicas)" in adjustment.message


def test_clients_within_the_plugins_memory_split_keep_mps():
    run = as_run(plan(mps_gpu("g", ("a", 30), ("b", 30))), NO_RECS, context({"k8s-1": 1}, "kubernetes", "ab"))
    assert [e["sharing"] for e in run.plan.layout] == ["mps"]


def test_mps_beside_a_time_sliced_gpu_is_time_sliced_too_and_says_so():
    sliced = {"gpu": "t", "model": "A100-SXM4-40GB", "sharing": "time-slicing", "jobs": ["c", "d"]}
    ctx = context({"k8s-1": 2}, "kubernetes", "abcd")
    run = as_run(plan(mps_gpu("g", ("a", 30), ("b", 30)), sliced), NO_RECS, ctx)
    assert [e["sharing"] for e in run.plan.layout] == ["time-slicing", "time-slicing"]
    assert [a.what for a in run.adjustments] == ["mps-beside-time-slicing"]


def test_emit_of_the_plan_as_run_finds_no_mps_left_to_downgrade():
    ctx = context({"k8s-1": 2}, "kubernetes", "abx")
    run = as_run(plan(mps_gpu("g", ("a", 30), ("b", 30)), whole_gpu("w", "x")), NO_RECS, ctx)
    out = em.emit(run.plan, ctx, run.adjustments)
    assert [a.what for a in out.adjustments] == ["mps-beside-whole", "shared-node"]
    assert "nvidia.com/device-plugin.config=gpulens-time-slicing-2 " in out.files["node-labels.sh"]


def test_a_time_sliced_job_gets_its_memory_need_as_its_gpu_fraction():
    recs = pd.DataFrame(
        {"job_id": ["a", "b"], "memory_need_bytes": [4e9, 8e9], "device_memory_bytes": [40e9, 40e9]}
    )
    ctx = context({"k8s-1": 2}, "kubernetes", "abx")
    run = as_run(plan(mps_gpu("g", ("a", 30), ("b", 30)), whole_gpu("w", "x")), recs, ctx)
    assert (run.plan.moved["a"]["gpu_fraction"], run.plan.moved["b"]["gpu_fraction"]) == (0.1, 0.2)


def test_slurm_nodes_keep_their_per_job_mps_shares():
    layout = plan(mps_gpu("g", ("a", 10), ("b", 20), ("c", 30)), whole_gpu("w", "x"))
    run = as_run(layout, NO_RECS, context({"node-7": 2}, "slurm", "abcx"))
    assert (run.plan, run.adjustments) == (layout, ())
    assert {j: c[THREADS] for j, c in _clients(run.plan.layout[0]).items()} == {"a": 10, "b": 20, "c": 30}


def _light_pods_beside_a_trainer(n: int) -> list[SynthJob]:
    """`n` light pods on whole A100s and a busy trainer on another, all on one Kubernetes node."""
    jobs = [
        SynthJob(
            f"pod-{i}", f"GPU-{i}", steady(60, 0.03, 0.005, seed=i), flat(60, 3 * GIB), source="kubernetes"
        )
        for i in range(n)
    ]
    trainer = SynthJob(
        "trainer", "GPU-t", steady(60, 0.9, 0.01, seed=99), flat(60, 30 * GIB), source="kubernetes"
    )
    return [*jobs, trainer]


def test_a_node_that_cannot_run_mps_is_packed_by_the_limits_of_what_it_runs():
    # six light pods fit one GPU as MPS clients; beside the trainer's whole GPU the plugin would
    # time-slice that GPU, six replicas where time-slicing allows four: the plan packs them as
    # the node can run them (here, MIG slices of one GPU)
    th = load_thresholds()
    profiles = profiles_from_samples(synth.frame(_light_pods_beside_a_trainer(6)), synth.STEP, th)
    plan = analyze_profiles(profiles, th, "test", with_archetypes=False).plan
    sharing = {e["sharing"] for e in plan.layout}
    time_sliced = [e for e in plan.layout if e["sharing"] == "time-slicing"]
    assert "mps" not in sharing
    assert all(len(e["jobs"]) <= th.time_slicing.max_replicas for e in time_sliced)
    assert plan.gpus_after == 2


# ---------------------------------------------------------------- whole reports, end to end


def _report(root: Path, scenario: Path) -> Path:
    simulate(str(scenario), duration_s=86400.0, out=root / "history", step_s=300.0, start=START)
    assert main(["report", "--history", str(root / "history"), "--out", str(root / "report")]) == 0
    return root / "report"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """The report of a node whose planned MPS GPU sits beside MIG and a whole trainer."""
    return _report(tmp_path_factory.mktemp("mixed"), DATA / "mps-beside-mig.yaml")


@pytest.fixture(scope="module")
def mps_only(tmp_path_factory) -> Path:
    """The report of a node of whole GPUs whose plan packs four pods as MPS clients on one."""
    return _report(tmp_path_factory.mktemp("mps"), DATA / "mps-only.yaml")


def _node_config(report: Path, node: str) -> dict[str, Any]:
    """The device-plugin config node-labels.sh selects for `node`."""
    labels = (report / "config" / "node-labels.sh").read_text()
    key = re.search(rf"kubectl label node {node} nvidia.com/device-plugin.config=(\S+)", labels)
    assert key is not None, labels
    configmap = yaml.safe_load((report / "config" / "device-plugin-configmap.yaml").read_text())
    config: dict[str, Any] = yaml.safe_load(configmap["data"][key[1]])
    return config


def _shared(report: Path) -> list[dict[str, Any]]:
    """The GPUs plan.json shares (MPS or time-slicing)."""
    layout = json.loads((report / "plan.json").read_text())["layout"]
    return [e for e in layout if e["sharing"] in ("mps", "time-slicing")]


def _jobs(report: Path) -> dict[str, dict[str, Any]]:
    return {j["job_id"]: j for j in json.loads((report / "jobs.json").read_text())["jobs"]}


def test_a_node_with_mig_and_a_whole_gpu_is_time_sliced_in_plan_json_as_in_its_configmap(mixed):
    assert list(_node_config(mixed, "k8s-mixed-1")["sharing"]) == ["timeSlicing"]
    shared = _shared(mixed)
    assert shared and {(e["sharing"], "mps_clients" in e) for e in shared} == {("time-slicing", False)}


def test_its_sharers_are_time_slicing_in_jobs_json_with_the_reason(mixed):
    jobs = _jobs(mixed)
    sharers = [jobs[j] for e in _shared(mixed) for j in e["jobs"]]
    assert len(sharers) == 4
    assert {(j["recommendation"], j["proposed_mode"]) for j in sharers} == {("time-slicing", "time-slicing")}
    assert {j["mps_active_thread_percentage"] for j in sharers} == {None}
    assert all("time-sliced, not MPS" in j["reason"] for j in sharers)


def test_its_summary_proposes_no_mps(mixed):
    summary = (mixed / "summary.md").read_text()
    table = summary.split("## Actions", 1)[1].split("\n## ", 1)[0]
    assert "→ time-slicing" in table
    assert "→ mps" not in table
    nodes = summary.split("## Changes per node", 1)[1].split("\n## ", 1)[0]
    assert "| time-slicing:" in nodes
    assert "| mps:" not in nodes


def test_a_node_of_mps_gpus_alone_gives_each_client_100_over_replicas_in_plan_json(mps_only):
    replicas = _node_config(mps_only, "k8s-mps-1")["sharing"]["mps"]["resources"][0]["replicas"]
    [entry] = _shared(mps_only)
    assert (entry["sharing"], replicas) == ("mps", 4)
    assert {c["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for c in entry["mps_clients"]} == {100 // replicas}


def test_its_jobs_carry_the_plugins_share_as_cap_and_their_own_as_sized_demand(mps_only):
    jobs = _jobs(mps_only)
    [entry] = _shared(mps_only)
    for client in entry["mps_clients"]:
        job = jobs[client["job_id"]]
        assert job["mps_active_thread_percentage"] == 25
        assert job["mps_sized_thread_percentage"] == client["sized_thread_percentage"] < 25
        assert "mps 25 % threads" in job["change"]


def _week2(scenario: str, week1: Path, root: Path) -> Path:
    """Week 1's plan applied, the node simulated a week later, reported with `--previous`."""
    applied = root / "week2.yaml"
    apply_plan_files(str(DATA / scenario), week1, applied)
    simulate(str(applied), duration_s=86400.0, out=root / "history", step_s=300.0, start=START + 7 * 86400)
    report = root / "report"
    argv = ["report", "--history", str(root / "history"), "--out", str(report), "--previous", str(week1)]
    assert main(argv) == 0
    return report


@pytest.mark.slow
def test_a_node_running_its_mps_plan_gets_no_change_and_still_shows_the_plugins_share(mps_only, tmp_path):
    report = _week2("mps-only.yaml", mps_only, tmp_path)
    jobs = _jobs(report).values()
    assert ({j["action"] for j in jobs}, (report / "config").exists()) == ({"keep"}, False)
    assert {j["mps_active_thread_percentage"] for j in jobs} == {25}


@pytest.mark.slow
def test_a_node_running_its_time_sliced_plan_beside_mig_gets_no_change(mixed, tmp_path):
    # measured time-sliced, its jobs' MPS demand moves by a few points; the plan must not then
    # fit the MIG pods onto the time-sliced GPU it would not have planned them on last week
    report = _week2("mps-beside-mig.yaml", mixed, tmp_path)
    jobs = _jobs(report).values()
    assert ({j["action"] for j in jobs}, (report / "config").exists()) == ({"keep"}, False)
