"""Recommendations: the decision order, the numbers behind them and the memory floor."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.recommend import memory_need, recommend
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.catalog import MODELS, get_model
from tests.analyzer import synth
from tests.analyzer.synth import SynthJob, flat, steady

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"


def recs_for(jobs, th, **kw) -> pd.DataFrame:
    profiles = profiles_from_samples(synth.frame(jobs), synth.STEP, th, **kw)
    return recommend(profiles, th).set_index("job_id")


def test_seed_case_jobs_move_to_mps(th):
    recs = recs_for(synth.seed_case(), th)
    assert set(recs["recommendation"]) == {"mps"}
    for row in recs.itertuples():
        assert 20 <= row.mps_active_thread_percentage <= 30
        assert row.mps_pinned_memory_limit_bytes >= 10e9 + GIB
        assert "threads" in row.reason
        assert row.confidence_level == "high"


def test_busy_job_keeps_its_gpu(th):
    recs = recs_for([SynthJob("busy", "GPU-a", steady(60, 0.85), flat(60, 20 * GIB))], th)
    assert recs.loc["busy", "recommendation"] == "exclusive"
    assert "85 %" in recs.loc["busy", "reason"] or "busy" in recs.loc["busy", "reason"]


def test_idle_allocation_is_reclaimed(th):
    recs = recs_for([SynthJob("idle", "GPU-a", flat(60, 0.0), flat(60, 2 * GIB))], th)
    assert recs.loc["idle", "recommendation"] == "reclaim"
    assert "idle in 100 %" in recs.loc["idle", "reason"]


def test_small_steady_job_on_h100_gets_the_smallest_fitting_mig_slice(th):
    job = SynthJob("inf", "GPU-h", steady(60, 0.06, 0.005), flat(60, 8 * GIB), model=H100)
    row = recs_for([job], th).loc["inf"]
    assert row["recommendation"] == "mig"
    assert row["mig_profile"] == "1g.10gb"
    profile = get_model("H100-80GB").mig_profile("1g.10gb")
    assert profile.memory_bytes >= row["memory_peak_bytes"] + GIB


def test_compute_demand_picks_a_bigger_slice_than_memory_alone(th):
    job = SynthJob("c", "GPU-h", steady(60, 0.35, 0.01), flat(60, 8 * GIB), model=H100)
    row = recs_for([job], th).loc["c"]
    profile = (
        get_model("H100-80GB").mig_profile(row["mig_profile"]) if row["recommendation"] == "mig" else None
    )
    demand = row["sm_active_p95"] * 132 * 1.2
    if profile is not None:
        assert profile.sm_count >= demand
    else:
        assert row["recommendation"] == "mps"
        assert row["mps_active_thread_percentage"] >= 100 * demand / 132


def test_idle_dominated_bursty_job_is_time_sliced(th):
    activity = [0.0] * 45 + [0.6] * 15
    job = SynthJob("nb", "GPU-a", pd.Series(activity).to_numpy(), flat(60, 4 * GIB))
    row = recs_for([job], th).loc["nb"]
    assert row["recommendation"] == "time-slicing"
    assert "idle in 75 %" in row["reason"]


def test_few_samples_mean_insufficient_data(th):
    row = recs_for([SynthJob("short", "GPU-a", flat(4, 0.3), flat(4, GIB))], th).loc["short"]
    assert row["recommendation"] == "insufficient-data"
    assert row["confidence"] == 0.0
    assert "4 samples" in row["reason"]


def test_unknown_model_in_the_data_is_insufficient_data(th):
    job = SynthJob("x", "GPU-x", flat(30, 0.2), flat(30, GIB), model="NVIDIA Imaginary 9000")
    row = recs_for([job], th).loc["x"]
    assert row["recommendation"] == "insufficient-data"
    assert "not in the catalog" in row["reason"]


def test_false_saturation_is_flagged_with_allocator_settings(th):
    job = SynthJob("tf", "GPU-a", steady(60, 0.08, 0.01), flat(60, 38.5 * GIB))
    row = recs_for([job], th).loc["tf"]
    assert row["false_saturation"]
    assert "TF_FORCE_GPU_ALLOW_GROWTH" in row["false_saturation_hint"]


def test_downsize_applies_when_memory_forces_a_whole_card(th):
    jobs = [
        SynthJob("wide", "GPU-h1", steady(60, 0.2, 0.01), flat(60, 68 * GIB), model="NVIDIA H200"),
        SynthJob("small-card", "GPU-a1", steady(60, 0.9, 0.01), flat(60, 10 * GIB), model=H100),
    ]
    recs = recs_for(jobs, th)
    row = recs.loc["wide"]
    assert row["recommendation"] == "downsize-model"
    assert row["target_gpu_model"] == "H100-80GB"
    assert "H100-80GB" in row["reason"]
    assert recs.loc["small-card", "recommendation"] == "exclusive"


def test_no_downsize_without_a_smaller_model_in_the_fleet(th):
    job = SynthJob("wide", "GPU-h1", steady(60, 0.2, 0.01), flat(60, 68 * GIB), model="NVIDIA H200")
    assert recs_for([job], th).loc["wide", "recommendation"] == "exclusive"


def test_thresholds_file_changes_the_decision(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("exclusive:\n  min_activity: 0.1\n")
    custom = load_thresholds(path)
    assert custom.get("exclusive", "min_activity") == 0.1
    recs = recs_for(synth.seed_case(), custom)
    assert set(recs["recommendation"]) == {"exclusive"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope: {a: 1}\n", "unknown section 'nope'"),
        ("mps:\n  max_lod: 1\n", "unknown key mps.max_lod"),
        ("mps:\n  max_load: high\n", "must be a number"),
        ("[1, 2\n", "not valid YAML"),
    ],
)
def test_bad_thresholds_files_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(AnalyzerError, match=message):
        load_thresholds(path)


@settings(max_examples=25, deadline=None)
@given(
    model=st.sampled_from(sorted(MODELS)),
    peak_fraction=st.floats(0.01, 0.95),
    level=st.floats(0.0, 1.0),
)
def test_no_slice_or_mps_limit_is_below_peak_memory_plus_headroom(model, peak_fraction, level):
    th = load_thresholds()
    gpu = MODELS[model]
    peak = peak_fraction * gpu.memory_bytes
    job = SynthJob("j", "GPU-p", steady(40, level, 0.05), flat(40, peak), model=gpu.nvml_name)
    row = recs_for([job], th).loc["j"]
    need = memory_need(peak, th)
    if row["recommendation"] == "mig":
        assert gpu.mig_profile(row["mig_profile"]).memory_bytes >= need
    if row["recommendation"] == "mps":
        assert row["mps_pinned_memory_limit_bytes"] >= need
    if row["recommendation"] in ("mps", "time-slicing", "mig"):
        assert need <= gpu.memory_bytes
