"""`gpulens simulate`: the real exporter sampling the simulated node, into a history."""

from __future__ import annotations

import json

import pytest

from gpulens.analyzer.history import read_history
from gpulens.analyzer.pipeline import analyze_history
from gpulens.catalog import get_model
from gpulens.cli import main
from gpulens.sim.history import aligned_start, simulate


@pytest.fixture(scope="module")
def seed_case(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "seed-case"
    meta = simulate("seed-case", duration_s=3 * 3600, out=out, step_s=120, seed=0)
    return out, meta


def test_history_is_aligned_and_complete(seed_case):
    out, meta = seed_case
    history = read_history(out)
    assert meta["steps"] == 91
    assert history.meta["start"] % 120 == 0
    assert history.samples["timestamp"].nunique() == 91
    assert {"gpu_info", "gpu_job_info", "gpu_utilization_ratio", "gpu_job_memory_used_bytes"} <= set(
        history.meta["families"]
    )
    assert (out / "metrics.om").read_text().endswith("# EOF\n")


def test_seed_case_gives_the_textbook_answer(seed_case, th):
    out, _ = seed_case
    analysis = analyze_history(read_history(out), th)
    recs = analysis.recs
    assert len(recs) == 4
    assert set(recs["recommendation"]) == {"mps"}
    assert (recs["memory_peak_bytes"] > 9e9).all() and (recs["memory_peak_bytes"] < 12e9).all()
    plan = analysis.plan
    assert (plan.gpus_before, plan.gpus_after, plan.gpus_freed) == (4, 2, 2)
    assert plan.utilization_after == pytest.approx(2 * plan.utilization_before, rel=0.05)


def test_dgx_h100_jobs_get_sensible_recommendations(tmp_path, th):
    simulate("dgx-h100", duration_s=2 * 3600, out=tmp_path / "dgx", step_s=120, seed=1)
    analysis = analyze_history(read_history(tmp_path / "dgx"), th)
    recs = analysis.recs.set_index("job_id")
    h100 = get_model("H100-80GB")
    assert "mps_server" not in recs.index  # the MPS server is infrastructure, not a job
    assert not (recs["recommendation"] == "insufficient-data").any()
    for job, row in recs.iterrows():
        if row["sharing"] == "mig":  # jobs on slices stay on (valid) slices
            assert row["recommendation"] == "mig", job
            assert h100.mig_profile(row["mig_profile"]).memory_bytes >= row["memory_peak_bytes"]
        lone = "plan: no other job fits beside it" in row["reason"]
        if row["sharing"] == "mps" and not lone:
            assert row["recommendation"] == "mps", job
            assert row["mps_pinned_memory_limit_bytes"] >= row["memory_peak_bytes"]
        if row["sm_active_p95"] >= 0.75 and row["sharing"] == "exclusive":
            assert row["recommendation"] == "exclusive", job
    # the three MPS clients, each capped at its p95/p99 + headroom, sum past 100 %, and the leaking
    # notebook (5113) no longer pairs with one of them: one keeps a GPU of its own
    assert (recs[recs["sharing"] == "mps"]["recommendation"] == "mps").sum() >= 2
    assert recs.loc["5113", "recommendation"] == "exclusive" and recs.loc["5113", "memory_leak"]
    assert analysis.plan.gpus_after <= analysis.plan.gpus_before


def test_simulate_cli_and_bad_scenario(tmp_path, capsys):
    assert main(["simulate", "no-such-scenario", "--duration", "1h", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-scenario" in err
    assert (
        main(["simulate", "seed-case", "--duration", "10m", "--step", "5m", "--out", str(tmp_path / "s")])
        == 0
    )
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["steps"] == 3


def test_start_is_aligned_to_the_step():
    assert aligned_start(3600, 300, now=1_000_123.0) % 300 == 0


MPS_CAPPED = """\
name: mps-capped
node: {hostname: gpu-node-01}
users: {alice: 1001, bob: 1002}
gpus:
  - model: A100-80GB
    mps: {server_pid: 3100}
processes:
  - pid: 4101
    gpu: 0
    kind: mps_client
    name: python
    cmdline: [python, embed.py]
    environ: {CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: "25"}
    job: {slurm: {id: 7101, user: alice, account: nlp, name: embed}}
    start: -1h
    workload: {pattern: constant, memory: 4GiB, sm: 0.1, busy: 0.5}
  - pid: 4102
    gpu: 0
    kind: mps_client
    name: python
    cmdline: [python, rank.py]
    job: {slurm: {id: 7102, user: bob, account: nlp, name: rank}}
    start: -1h
    workload: {pattern: constant, memory: 4GiB, sm: 0.1, busy: 0.5}
"""


def test_a_simulated_history_keeps_each_mps_clients_measured_thread_cap(tmp_path, th):
    """The exporter publishes a client's own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE as
    gpu_job_mps_active_thread_ratio; `gpulens simulate` keeps it, and the profile reads it."""
    (tmp_path / "mps-capped.yaml").write_text(MPS_CAPPED)
    simulate(str(tmp_path / "mps-capped.yaml"), duration_s=600, out=tmp_path / "h", step_s=60, seed=0)
    history = read_history(tmp_path / "h")
    caps = history.samples[history.samples["metric"] == "gpu_job_mps_active_thread_ratio"]
    assert set(caps[caps["job_id"] == "7101"]["value"]) == {0.25}
    jobs = analyze_history(history, th, with_archetypes=False).recs.set_index("job_id")
    assert jobs.loc["7101", "mps_thread_cap_now_pct"] == pytest.approx(25.0)
    # without a cap of its own it runs under the control daemon's, where the exporter sees it
    assert jobs.loc["7102", "mps_thread_cap_now_pct"] != pytest.approx(25.0)


# --- several scenarios, one node each, into one history (a fleet) -----------------------------------

NODE = """\
name: {name}
node: {{hostname: {host}, kubernetes: {{driver: systemd, runtime: containerd, cgroup: v2}}}}
gpus:
  - model: A100-80GB
processes:
  - pid: 5101
    gpu: 0
    cmdline: [python, serve.py]
    job: {{kubernetes: {{namespace: ml, pod: {pod}, container: server}}}}
    start: -1h
    workload: {{pattern: inference, memory: 4GiB, sm: 0.3}}
"""


def _node(tmp_path, name: str, host: str, pod: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(NODE.format(name=name, host=host, pod=pod))
    return str(path)


def _series(history, metric: str, instance: str):
    rows = history.samples[(history.samples["metric"] == metric) & (history.samples["instance"] == instance)]
    return rows.sort_values("timestamp")[["timestamp", "value"]].reset_index(drop=True)


def test_several_scenarios_write_each_nodes_gpus_and_jobs_into_one_history(tmp_path):
    a, b = _node(tmp_path, "a", "gpu-a", "ranker-0"), _node(tmp_path, "b", "gpu-b", "tagger-0")
    meta = simulate([a, b], duration_s=600, out=tmp_path / "h", step_s=60, seed=0)
    history = read_history(tmp_path / "h")
    samples = history.samples
    info = samples[samples["metric"] == "gpu_info"]
    assert info.groupby("instance")["uuid"].nunique().to_dict() == {"gpu-a": 1, "gpu-b": 1}
    jobs = samples[samples["metric"] == "gpu_job_info"]
    assert set(zip(jobs["instance"], jobs["job_id"], strict=True)) == {
        ("gpu-a", "ml/ranker-0"),
        ("gpu-b", "ml/tagger-0"),
    }
    # the same time span, step for step, on both nodes
    steps = info.groupby("instance")["timestamp"].apply(lambda t: tuple(sorted(t)))
    assert steps["gpu-a"] == steps["gpu-b"] and len(steps["gpu-a"]) == meta["steps"] == 11
    assert (history.meta["scenarios"], history.meta["nodes"]) == (["a", "b"], ["gpu-a", "gpu-b"])


def test_each_node_of_a_fleet_runs_under_a_seed_of_its_own(tmp_path):
    # the same node under two hostnames: the same seed would repeat its noise sample for sample
    a, b = _node(tmp_path, "a", "gpu-a", "ranker-0"), _node(tmp_path, "b", "gpu-b", "ranker-0")
    simulate([a, b], duration_s=600, out=tmp_path / "h", step_s=60, seed=0)
    history = read_history(tmp_path / "h")
    one, other = (_series(history, "gpu_utilization_ratio", host) for host in ("gpu-a", "gpu-b"))
    assert len(one) == len(other) == 11 and not one["value"].equals(other["value"])


def test_scenarios_on_the_same_hostname_are_refused_on_one_line(tmp_path, capsys):
    a, b = _node(tmp_path, "a", "gpu-a", "ranker-0"), _node(tmp_path, "b", "gpu-a", "tagger-0")
    code = main(["simulate", a, b, "--duration", "10m", "--step", "5m", "--out", str(tmp_path / "h")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"scenario {b}: node.hostname: expected a hostname no other scenario of the run has" in err
    assert f"found 'gpu-a', the node of {a} too" in err
    assert not (tmp_path / "h").exists()


def test_one_scenario_simulates_as_the_first_node_of_a_fleet_and_keeps_its_meta_keys(tmp_path):
    a, b = _node(tmp_path, "a", "gpu-a", "ranker-0"), _node(tmp_path, "b", "gpu-b", "tagger-0")
    simulate(a, duration_s=600, out=tmp_path / "alone", step_s=60, seed=3)
    simulate(
        [a, b],
        duration_s=600,
        out=tmp_path / "fleet",
        step_s=60,
        seed=3,
        start=read_history(tmp_path / "alone").meta["start"],
    )
    alone, fleet = read_history(tmp_path / "alone"), read_history(tmp_path / "fleet")
    # a one-node history reads as it always did: the run's seed, and its scenario and node named
    assert (alone.meta["scenario"], alone.meta["node"], alone.meta["seed"]) == ("a", "gpu-a", 3)
    assert "scenario" not in fleet.meta and "node" not in fleet.meta
    for metric in ("gpu_utilization_ratio", "gpu_job_sm_utilization_ratio", "gpu_job_memory_used_bytes"):
        assert _series(alone, metric, "gpu-a").equals(_series(fleet, metric, "gpu-a")), metric


LATE_POD = """
name: late-pod
node: {hostname: k8s-late-1, kubernetes: {driver: systemd, runtime: containerd, cgroup: v2}}
gpus: [{model: L40S}]
processes:
  - {pid: 400, gpu: 0, job: {kubernetes: {namespace: batch, pod: embed-0}}, start: -1h,
     workload: {pattern: constant, memory: 6GiB, sm: 0.2}}
  - {pid: 500, gpu: 0, job: {kubernetes: {namespace: batch, pod: transcode-x9z8c}}, start: 5m, end: 2h,
     workload: {pattern: constant, memory: 6GiB, sm: 0.3}}
"""


def test_a_pod_started_during_the_run_is_named_from_its_first_sample(tmp_path):
    """A run samples minutes of node time in milliseconds: the exporter must look for new pods on
    the node's clock, not the wall clock, or a pod started after the first sample (here beside one
    running from the start, whose lookup lists the pods) keeps its UID."""
    scenario = tmp_path / "late.yaml"
    scenario.write_text(LATE_POD)
    simulate(str(scenario), duration_s=3 * 3600, out=tmp_path / "h", step_s=300, seed=0)
    samples = read_history(tmp_path / "h").samples
    jobs = samples[samples["metric"] == "gpu_job_info"]
    assert set(jobs["job_id"]) == {"batch/embed-0", "batch/transcode-x9z8c"}
