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
