"""Consolidation plan and the configuration that realises it."""

from __future__ import annotations

import pytest
import yaml

from gpulens.analyzer.emit import context_from_rows, emit
from gpulens.analyzer.pipeline import analyze_profiles
from gpulens.analyzer.plan import build_plan
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.recommend import recommend
from gpulens.catalog import get_model, place_mig_layout
from tests.analyzer import synth
from tests.analyzer.synth import SynthJob, flat, steady

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"


def plan_for(jobs, th):
    recs = recommend(profiles_from_samples(synth.frame(jobs), synth.STEP, th), th)
    return recs, build_plan(recs, th)


def test_seed_case_is_the_textbook_answer(th):
    _, plan = plan_for(synth.seed_case(), th)
    assert (plan.gpus_before, plan.gpus_after, plan.gpus_freed) == (4, 2, 2)
    assert all(entry["sharing"] == "mps" for entry in plan.layout)
    assert plan.utilization_after == pytest.approx(2 * plan.utilization_before, rel=0.01)
    assert sum(len(e["jobs"]) for e in plan.layout) == 4


def test_mig_jobs_are_packed_with_valid_placements(th):
    jobs = [
        SynthJob(f"m{i}", f"GPU-h{i}", steady(60, 0.06, 0.005), flat(60, 8 * GIB), model=H100)
        for i in range(9)
    ]
    recs, plan = plan_for(jobs, th)
    assert set(recs["mig_profile"]) == {"1g.10gb"}
    assert (plan.gpus_before, plan.gpus_after) == (9, 2)  # 7 x 1g.10gb fill one H100
    model = get_model("H100-80GB")
    for entry in plan.layout:
        starts = [(s["profile"], s["start"]) for s in entry["mig_layout"]]
        assert len(place_mig_layout(model, starts)) == len(starts)


def test_sequential_exclusive_jobs_can_reuse_one_gpu(th):
    jobs = [
        SynthJob("early", "GPU-a", steady(30, 0.9, 0.01), flat(30, 20 * GIB)),
        SynthJob("late", "GPU-b", steady(30, 0.9, 0.01), flat(30, 20 * GIB), first_step=40),
    ]
    _, plan = plan_for(jobs, th)
    assert plan.gpus_before == 2 and plan.gpus_after == 1


def test_reclaimed_and_unknown_jobs_are_counted_correctly(th):
    jobs = [
        SynthJob("idle", "GPU-a", flat(60, 0.0), flat(60, GIB)),
        SynthJob("short", "GPU-b", flat(3, 0.5), flat(3, GIB)),
    ]
    _, plan = plan_for(jobs, th)
    assert plan.gpus_before == 2
    assert plan.gpus_after == 1  # the idle GPU is freed; the short job stays where it is
    assert any(e["sharing"] == "unchanged" for e in plan.layout)


def test_emitted_configs_match_the_plan_and_validate(th):
    jobs = synth.seed_case() + [
        SynthJob(f"m{i}", f"GPU-h{i}", steady(60, 0.06, 0.005), flat(60, 8 * GIB), model=H100)
        for i in range(3)
    ]
    recs, plan = plan_for(jobs, th)
    out = emit(plan, context_from_rows(recs.to_dict("records")))  # validated inside
    mig = yaml.safe_load(out.files["mig-parted.yaml"])
    assert mig["version"] == "v1"
    enabled = [d for cfg in mig["mig-configs"].values() for d in cfg if d["mig-enabled"]]
    assert enabled and enabled[0]["mig-devices"] == {"1g.10gb": 3}
    assert "--gres=gpu:1g.10gb:1" in out.files["gres.conf"]
    layout_clients = [c for e in plan.layout for c in e.get("mps_clients", [])]
    assert all(isinstance(c["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], int) for c in layout_clients)


def test_a_job_alone_under_mps_takes_a_free_mig_slice_instead(th):
    jobs = [
        SynthJob(f"m{i}", f"GPU-h{i}", steady(60, 0.06, 0.005), flat(60, 8 * GIB), model=H100)
        for i in range(3)
    ] + [SynthJob("lone", "GPU-x", steady(60, 0.10, 0.01), flat(60, 8 * GIB), model=H100)]
    profiles = profiles_from_samples(synth.frame(jobs), synth.STEP, th)
    assert recommend(profiles, th).set_index("job_id").loc["lone", "recommendation"] == "mps"
    analysis = analyze_profiles(profiles, th, "test")
    row = analysis.recs.set_index("job_id").loc["lone"]
    assert row["recommendation"] == "mig" and row["mig_profile"] == "2g.20gb"
    assert "plan:" in row["reason"]
    assert (analysis.plan.gpus_before, analysis.plan.gpus_after) == (4, 1)
