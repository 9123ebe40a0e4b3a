"""Recommendations: the decision order, the numbers behind them and the memory floor."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.recommend import memory_need, mps_settings, recommend, servers_of
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


def test_unknown_model_without_its_memory_total_is_insufficient_data(th):
    job = SynthJob("x", "GPU-x", flat(30, 0.2), flat(30, GIB), model="NVIDIA Imaginary 9000")
    row = recs_for([job], th).loc["x"]
    assert row["recommendation"] == "insufficient-data"
    assert "not in the catalog" in row["reason"] and "gpu_memory_total_bytes" in row["reason"]


IMAGINARY = "NVIDIA Imaginary 9000"


def unknown_model_jobs() -> list[SynthJob]:
    notebook = np.where(np.arange(120) % 10 == 0, 0.6, 0.0)  # idle 90 % of the time, bursts
    return [
        SynthJob("light", "GPU-x1", steady(120, 0.1, 0.01), flat(120, 8 * GIB), model=IMAGINARY),
        SynthJob("light2", "GPU-x2", steady(120, 0.12, 0.01), flat(120, 6 * GIB), model=IMAGINARY),
        SynthJob("big", "GPU-x3", steady(120, 0.1, 0.01), flat(120, 46 * GIB), model=IMAGINARY),
        SynthJob("nb", "GPU-x4", notebook, flat(120, 4 * GIB), model=IMAGINARY),
        SynthJob("busy", "GPU-x5", steady(120, 0.8, 0.01), flat(120, 4 * GIB), model=IMAGINARY),
    ]


def with_memory_total(samples: pd.DataFrame, total: float) -> pd.DataFrame:
    """gpu_memory_total_bytes for every GPU of the frame, as the exporter reports it."""
    info = samples[samples["metric"] == "gpu_info"]
    return pd.concat([samples, info.assign(metric="gpu_memory_total_bytes", value=total)], ignore_index=True)


def test_an_unknown_model_gets_memory_based_advice_with_a_note(th):
    samples = with_memory_total(synth.frame(unknown_model_jobs()), 48 * GIB)
    recs = _recs(samples, th)
    assert dict(recs["recommendation"]) == {
        "light": "mps",
        "light2": "mps",
        "big": "exclusive",  # 46 GiB + headroom does not fit its 48 GiB
        "nb": "time-slicing",
        "busy": "exclusive",
    }
    assert recs["mig_profile"].isna().all()
    for reason in recs["reason"]:
        assert f"GPU model '{IMAGINARY}' is not in the catalog" in reason
        assert "compute limits and MIG profiles are unknown" in reason and "48.0 GiB" in reason
    assert recs.loc["light", "mps_pinned_memory_limit_bytes"] >= 9 * GIB


def test_false_saturation_is_flagged_with_allocator_settings(th):
    job = SynthJob("tf", "GPU-a", steady(60, 0.08, 0.01), flat(60, 38.5 * GIB))
    row = recs_for([job], th).loc["tf"]
    assert row["false_saturation"]
    assert "TF_FORCE_GPU_ALLOW_GROWTH" in row["false_saturation_hint"]


def test_a_busy_job_moves_to_a_model_with_less_memory_and_no_less_compute_than_it_needs(th):
    jobs = [
        SynthJob("wide", "GPU-h1", steady(60, 0.62, 0.01), flat(60, 68 * GIB), model="NVIDIA H200"),
        SynthJob("small-card", "GPU-a1", steady(60, 0.9, 0.01), flat(60, 10 * GIB), model=H100),
    ]
    recs = recs_for(jobs, th)
    row = recs.loc["wide"]
    assert row["recommendation"] == "downsize-model"
    assert row["target_gpu_model"] == "H100-80GB"
    assert "H100-80GB" in row["reason"]
    assert recs.loc["small-card", "recommendation"] == "exclusive"


def test_no_downsize_without_a_smaller_model_in_the_fleet(th):
    job = SynthJob("wide", "GPU-h1", steady(60, 0.62, 0.01), flat(60, 68 * GIB), model="NVIDIA H200")
    assert recs_for([job], th).loc["wide", "recommendation"] == "exclusive"


def test_thresholds_file_changes_the_decision(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("exclusive:\n  min_activity: 0.1\n")
    custom = load_thresholds(path)
    assert custom.exclusive.min_activity == 0.1
    recs = recs_for(synth.seed_case(), custom)
    assert set(recs["recommendation"]) == {"exclusive"}


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


def test_a_bigger_gpu_is_never_a_downsize(th):
    """A100-80GB -> H100-80GB has the same memory and more SMs x clock: not smaller."""
    jobs = [
        SynthJob("a", "GPU-a1", steady(60, 0.7, 0.01), flat(60, 50 * GIB), model="NVIDIA A100-SXM4-80GB"),
        SynthJob("h", "GPU-h1", steady(60, 0.9, 0.01), flat(60, 10 * GIB), model=H100),
    ]
    assert recs_for(jobs, th).loc["a", "recommendation"] == "exclusive"


def test_downsize_targets_come_from_the_fleet_given(th):
    job = SynthJob("wide", "GPU-h1", steady(60, 0.62, 0.01), flat(60, 68 * GIB), model="NVIDIA H200")
    profiles = profiles_from_samples(synth.frame([job]), synth.STEP, th)
    row = recommend(profiles, th, [get_model("H200"), get_model("H100-80GB")]).iloc[0]
    assert row["recommendation"] == "downsize-model" and row["target_gpu_model"] == "H100-80GB"


def test_a_batch_job_is_sized_at_p95_and_the_reason_says_how_often_the_cap_binds(th):
    row = recs_for(synth.seed_case(), th).iloc[0]
    assert row["sizing_percentile"] == "p95" and not row["latency_sensitive"]
    assert "p95 SM activity" in row["reason"] and "binds in at most 5 %" in row["reason"]
    assert row["mps_active_thread_percentage"] / 100 >= row["sm_active_p95"]


def bursty(n: int = 200, base: float = 0.08, burst: float = 0.45, every: int = 30) -> np.ndarray:
    """A service at `base` with a burst to `burst` every `every` samples (about 3 % of them)."""
    values = steady(n, base, 0.005)
    values[::every] = burst
    return values


def test_a_latency_sensitive_job_is_never_capped_below_its_p99(th):
    job = SynthJob("svc", "GPU-a", bursty(), flat(200, 6 * GIB))
    row = recs_for([job], th).loc["svc"]
    assert row["latency_sensitive"] and row["sizing_percentile"] == "p99"
    assert row["sm_active_p95"] < 0.2 < row["sm_active_p99"]
    assert row["recommendation"] in ("mps", "mig")
    if row["recommendation"] == "mps":
        assert row["mps_active_thread_percentage"] / 100 >= row["sm_active_p99"]
    assert "p99" in row["reason"] and "latency-sensitive" in row["reason"]


def test_a_stricter_bind_share_sizes_batch_jobs_at_a_higher_percentile(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("compute:\n  max_bind_fraction: 0.0\n")
    row = recs_for(synth.seed_case(), load_thresholds(path)).iloc[0]
    assert row["sizing_percentile"] == "max"
    assert row["mps_active_thread_percentage"] / 100 >= row["sm_active_max"]


def test_a_duty_cycle_that_bursts_high_is_not_capped_at_its_mean(th):
    """The GenAI pod of the issue: p95 duty cycle 92 % must not get a 35 % MPS cap."""
    activity = np.where(np.arange(100) % 3 == 0, 0.92, 0.1)
    job = SynthJob("pod", "GPU-u", activity, flat(100, 20 * GIB), activity_family="gpu_utilization_ratio")
    row = recs_for([job], th).loc["pod"]
    assert row["activity_signal"] == "utilization"
    assert row["recommendation"] == "exclusive"
    assert "p99 duty cycle 92 %" in row["reason"]


def test_memory_over_half_the_gpu_does_not_force_a_whole_gpu(th):
    job = SynthJob("heavy", "GPU-h", steady(60, 0.05, 0.005) + 0.02, flat(60, 45 * GIB), model=H100)
    row = recs_for([job], th).loc["heavy"]
    assert row["recommendation"] in ("mps", "mig")
    assert "half" not in row["reason"]


def _two_mps_clients() -> list[SynthJob]:
    return [
        SynthJob("heavy", "GPU-m", steady(60, 0.45, 0.01, seed=1), flat(60, 8 * GIB), sharing="mps"),
        SynthJob("light", "GPU-m", steady(60, 0.08, 0.01, seed=2), flat(60, 8 * GIB), sharing="mps"),
    ]


def _recs(samples: pd.DataFrame, th) -> pd.DataFrame:
    return recommend(profiles_from_samples(samples, synth.STEP, th), th).set_index("job_id")


def test_two_mps_clients_with_different_demand_get_different_sizes(th):
    recs = _recs(synth.with_device_shares(synth.frame(_two_mps_clients())), th)
    assert set(recs["activity_signal"]) == {"sm_active_share"}
    assert recs.loc["heavy", "sm_active_p95"] > 0.44 and recs.loc["light", "sm_active_p95"] < 0.12
    heavy, light = (recs.loc[j, "mps_active_thread_percentage"] for j in ("heavy", "light"))
    assert heavy > light + 20
    assert "its share of the GPU's activity" in recs.loc["heavy", "reason"]


def test_a_shared_jobs_demand_takes_its_part_of_what_no_job_accounts_for(th):
    """Shares plus the unattributed remainder add up to the GPU's figure; each job takes the
    remainder in proportion to its share, so the jobs' demands add up to the figure too."""
    samples = synth.with_device_shares(synth.frame(_two_mps_clients()), remainder=0.1)
    recs = _recs(samples, th)
    figure = samples[samples["metric"] == "gpu_sm_active_ratio"]["value"].mean()
    assert recs["sm_active_mean"].sum() == pytest.approx(figure, rel=1e-9)
    shares = samples[samples["metric"] == "gpu_job_sm_utilization_ratio"].groupby("job_id")["value"].mean()
    assert recs.loc["heavy", "sm_active_mean"] > shares["heavy"] > shares["light"]
    assert recs.loc["light", "sm_active_mean"] > shares["light"]


def test_a_job_is_measured_on_the_same_scale_whole_and_under_mps(th):
    """Moving a job onto a shared GPU must not read as a drop in its demand (issue 30): here NVML
    lists only 80 % of each client's activity, the rest is the GPU's unattributed remainder."""
    demand, neighbour = steady(60, 0.3, 0.01, seed=4), steady(60, 0.2, 0.01, seed=5)
    whole = _recs(synth.frame([SynthJob("job", "GPU-w", demand, flat(60, 8 * GIB))]), th)
    clients = [
        SynthJob("job", "GPU-m", demand * 0.8, flat(60, 8 * GIB), sharing="mps"),
        SynthJob("other", "GPU-m", neighbour * 0.8, flat(60, 8 * GIB), sharing="mps"),
    ]
    shared = synth.with_device_shares(synth.frame(clients), remainder=0.0)
    rest = shared["metric"] == "gpu_job_sm_unattributed_ratio"
    figure = shared["metric"] == "gpu_sm_active_ratio"
    by_time = shared[rest].sort_values("timestamp").index  # one row per step, in step order
    shared.loc[by_time, "value"] = 0.2 * (demand + neighbour)
    shared.loc[shared[figure].sort_values("timestamp").index, "value"] = demand + neighbour
    moved = _recs(shared, th)
    for column in ("sm_active_mean", "sm_active_p95", "sm_active_max"):
        assert moved.loc["job", column] == pytest.approx(whole.loc["job", column], rel=1e-9), column


def test_shares_on_an_unprofiled_gpu_are_of_its_duty_cycle(th):
    recs = _recs(synth.with_device_shares(synth.frame(_two_mps_clients()), profiled=False), th)
    assert set(recs["activity_signal"]) == {"utilization_share"}
    assert "duty cycle" in recs.loc["heavy", "reason"]


def test_without_per_job_shares_the_gpu_is_split_equally_and_the_reason_says_so(th):
    with_shares = synth.with_device_shares(synth.frame(_two_mps_clients()))
    old = with_shares[with_shares["metric"] != "gpu_job_sm_unattributed_ratio"]  # an older exporter
    recs = _recs(old, th)
    assert set(recs["activity_signal"]) == {"sm_active_equal_split"}
    assert recs.loc["heavy", "sm_active_mean"] == pytest.approx(recs.loc["light", "sm_active_mean"])
    assert all("split equally" in reason and "no per-job shares" in reason for reason in recs["reason"])


def test_a_leak_on_an_unknown_model_is_flagged_too(th):
    job = SynthJob(
        "leaky", "GPU-x1", steady(120, 0.1, 0.01), np.linspace(2 * GIB, 18 * GIB, 120), model=IMAGINARY
    )
    row = _recs(with_memory_total(synth.frame([job]), 48 * GIB), th).loc["leaky"]
    assert row["memory_leak"].startswith("grows 8.")
    assert "; memory leak: grows 8." in row["reason"] and "not in the catalog" in row["reason"]


def test_an_mps_thread_cap_is_the_sized_demand_rounded_up_to_a_whole_percent(th):
    demand = 0.303 / (1 + th.headroom.compute_ratio)  # 30.3 % once the headroom is added
    assert mps_settings(demand, GIB, th).thread_percentage == 31  # not 35: three fit on one GPU


@given(st.floats(min_value=0.0, max_value=1.0))
def test_an_mps_thread_cap_is_never_below_the_sized_demand_nor_a_percent_above_it(demand):
    th = load_thresholds()
    sized = demand * (1 + th.headroom.compute_ratio) * 100
    pct = mps_settings(demand, GIB, th).thread_percentage
    assert pct >= min(100, sized - 1e-6) and pct >= th.mps.min_thread_percentage
    assert pct <= max(th.mps.min_thread_percentage, sized + 1)


def test_a_live_low_traffic_server_is_never_reclaimed(th):
    # a few % activity in every sample all day: idle by the 5 % rule, but it answers requests
    server = SynthJob("server", "GPU-a", steady(120, 0.02, jitter=0.005), flat(120, 6 * GIB))
    recs = recs_for([server], th)
    assert recs.loc["server", "recommendation"] != "reclaim"
    assert recs.loc["server", "recommendation"] in ("mps", "time-slicing", "mig")


def hourly(active_hours: int, hours: int = 24, level: float = 0.03) -> np.ndarray:
    """5 min steps over `hours` clock hours, zero but for one sample of 3 % SM activity (a request)
    in each of the first `active_hours` hours: every sample idle (under 5 %), median 0."""
    activity = flat(12 * hours, 0.0)
    activity[6 : 12 * active_hours : 12] = level
    return activity


def recs_at_5m(jobs, th) -> pd.DataFrame:
    # first_step=1: the steps from 00:05 to 24:00 fill exactly `hours` clock hours
    profiles = profiles_from_samples(synth.frame(jobs, step=300.0), 300.0, th)
    return recommend(profiles, th).set_index("job_id")


def test_a_server_active_in_most_hours_without_serving_metrics_is_shared_not_reclaimed(th):
    # a request now and then, in every hour: idle by every per-sample figure, but it serves
    server = SynthJob("triton", "GPU-a", hourly(24), flat(288, 6 * GIB), first_step=1)
    row = recs_at_5m([server], th).loc["triton"]
    assert row["sm_active_p50"] == 0 and row["idle_fraction"] >= th.reclaim.min_idle_fraction
    assert row["recommendation"] == "time-slicing"
    assert "active in 24 of 24 hours" in row["reason"] and "never reclaimed, may share" in row["reason"]


def test_a_job_idle_most_hours_with_a_short_burst_is_still_reclaimed(th):
    activity = flat(288, 0.0)
    activity[100:112] = 0.6  # one hour's burst in a day
    job = SynthJob("burst", "GPU-a", activity, flat(288, 6 * GIB), first_step=1)
    row = recs_at_5m([job], th).loc["burst"]
    assert (row["active_hours"], row["lifetime_hours"]) == (2, 24)  # the burst straddles an hour
    assert row["recommendation"] == "reclaim"
    assert row["reason"].startswith("allocated and idle")


def test_a_job_active_in_the_threshold_share_of_its_hours_serves_and_one_hour_less_is_reclaimed(th):
    th = dataclasses.replace(
        th, reclaim=dataclasses.replace(th.reclaim, serving_min_active_hour_fraction=0.5)
    )
    jobs = [
        SynthJob("half", "GPU-a", hourly(12), flat(288, 6 * GIB), first_step=1),
        SynthJob("less", "GPU-b", hourly(11), flat(288, 6 * GIB), first_step=1),
    ]
    recs = recs_at_5m(jobs, th)
    assert recs.loc["half", "recommendation"] != "reclaim"
    assert (
        "active in 12 of 24 hours (>= reclaim.serving_min_active_hour_fraction 50 %, "
        "over at least reclaim.serving_min_hours 6)" in recs.loc["half", "reason"]
    )
    assert recs.loc["less", "recommendation"] == "reclaim"


def test_a_job_active_every_hour_of_a_life_too_short_to_tell_is_no_server(th):
    activity = flat(288, 0.0)
    activity[12:60:12] = 0.03  # a few requests an hour, but alive only 4 hours of the day
    job = SynthJob("short", "GPU-a", activity[:60], flat(60, 6 * GIB), first_step=1)
    row = recs_at_5m([job], th).loc["short"]
    assert row["lifetime_hours"] < th.reclaim.serving_min_hours
    assert row["recommendation"] == "reclaim"


def _quiet_profile(th, sharing: str, served: bool) -> pd.DataFrame:
    """A job whose own activity reads 0 all day (a quiet server's bursts below NVML's 1 % per process
    on a shared GPU), on a GPU shared as `sharing`, found serving last week or not."""
    job = SynthJob("triton", "GPU-a", flat(288, 0.0), flat(288, 6 * GIB), first_step=1)
    profiles = profiles_from_samples(synth.frame([job], step=300.0), 300.0, th)
    return profiles.assign(sharing=sharing, served_last_week=served)


@pytest.mark.parametrize("sharing", ["time_slicing", "mps"])
def test_a_server_found_last_week_stays_one_on_the_gpu_it_now_shares(th, sharing):
    row = recommend(_quiet_profile(th, sharing, served=True), th).set_index("job_id").loc["triton"]
    assert row["recommendation"] != "reclaim" and row["serves"] == "last-week"
    assert "last week's report found it serving" in row["reason"]


def test_a_server_found_last_week_alone_on_its_gpu_again_is_judged_by_its_own_activity(th):
    row = recommend(_quiet_profile(th, "exclusive", served=True), th).set_index("job_id").loc["triton"]
    assert row["recommendation"] == "reclaim" and row["serves"] == ""


def test_a_quiet_shared_job_nobody_found_serving_is_reclaimed(th):
    row = recommend(_quiet_profile(th, "time_slicing", served=False), th).set_index("job_id").loc["triton"]
    assert row["recommendation"] == "reclaim"


def test_last_weeks_servers_are_the_rows_with_evidence_by_job_and_workload():
    jobs = [
        {
            "job_id": "vision/detect-7c9d8b6f5-x7k2p",
            "workload": "k8s vision/detect",
            "serves": "active-hours",
        },
        {"job_id": "batch/embed-0", "workload": "k8s batch/embed-0", "serves": ""},
    ]
    assert servers_of(jobs) == {"vision/detect-7c9d8b6f5-x7k2p", "k8s vision/detect"}
