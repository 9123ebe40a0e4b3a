"""A leak that restarts (grow, fall back, grow again: a sawtooth) is a leak with its period.

Over many cycles a sawtooth has no least-squares trend, and its peak before each restart looks
like memory held by a framework that pre-allocates. The profile counts restarts and fits the
growth per cycle (`memory_restarts`, `memory_cycle_slope_bytes_per_hour`, `memory_period_s`);
the recommendation keeps the job alone with the period in its reason, never false saturation.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import read_history
from gpulens.analyzer.pipeline import analyze_history
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.recommend import recommend
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.sim.history import simulate
from tests.analyzer import synth
from tests.analyzer.synth import SynthJob, steady

GIB = 1024**3
HOURS = 10
STEPS = HOURS * 60  # one-minute steps


def sawtooth(period_steps: int = 120, low: float = 4 * GIB, high: float = 38 * GIB) -> np.ndarray:
    """Memory that climbs from `low` to `high` and falls back every `period_steps` steps."""
    return low + (np.arange(STEPS) % period_steps) / period_steps * (high - low)


def recs(th, *memories: tuple[str, np.ndarray]) -> pd.DataFrame:
    jobs = [
        SynthJob(name, f"GPU-{i:04d}", steady(STEPS, 0.1, 0.02, seed=i), memory)
        for i, (name, memory) in enumerate(memories)
    ]
    return recommend(profiles_from_samples(synth.frame(jobs), synth.STEP, th), th).set_index("job_id")


def test_a_sawtooth_is_a_leak_with_its_period_and_restarts(th):
    row = recs(th, ("saw", sawtooth()))
    row = row.loc["saw"]
    assert row["memory_restarts"] == 4
    assert row["memory_period_s"] == pytest.approx(2 * 3600)
    assert row["memory_cycle_slope_bytes_per_hour"] == pytest.approx(17 * GIB)  # 34 GiB per 2 h
    assert row["memory_leak"].startswith("grows 17.0 GiB/h between restarts, period ~2.0 h (4 restarts")
    assert row["recommendation"] == "exclusive"
    assert row["reason"].startswith("memory leak: ") and "restart it on a schedule" in row["reason"]
    for name in ("leak.restart_drop_fraction", "leak.min_growth_fraction", "leak.cycle_window_steps"):
        assert name in row["reason"]


def test_a_sawtooth_that_peaks_near_the_gpus_memory_is_not_false_saturation(th):
    row = recs(th, ("saw", sawtooth(high=38 * GIB))).loc["saw"]
    assert row["memory_peak_bytes"] >= th.false_saturation.min_memory_fraction * 40 * GIB
    assert row["sm_active_mean"] < th.false_saturation.max_mean_activity
    assert not row["false_saturation"] and row["false_saturation_hint"] == ""
    # still sized from its peak: the leak is kept alone, never squeezed below what it reached
    assert row["memory_need_bytes"] >= row["memory_peak_bytes"]


def test_memory_that_holds_the_gpu_without_restarts_is_still_false_saturation(th):
    held = np.full(STEPS, 38 * GIB)
    row = recs(th, ("held", held)).loc["held"]
    assert row["memory_restarts"] == 0 and row["false_saturation"]


def test_a_steady_job_with_noise_has_no_restart_and_no_leak(th):
    noisy = 20 * GIB + np.random.default_rng(1).normal(0, 0.2 * GIB, STEPS)
    row = recs(th, ("noisy", noisy)).loc["noisy"]
    assert row["memory_restarts"] == 0
    assert np.isnan(row["memory_period_s"])
    assert row["memory_leak"] == "" and "leak" not in row["reason"]


def test_one_deliberate_drop_is_a_restart_but_not_a_leak(th):
    drop = np.where(np.arange(STEPS) < STEPS // 2, 30 * GIB, 8 * GIB)
    row = recs(th, ("drop", drop)).loc["drop"]
    assert row["memory_restarts"] == 1
    assert row["memory_cycle_slope_bytes_per_hour"] == 0
    assert row["memory_leak"] == "" and "leak" not in row["reason"]


def test_a_drop_smaller_than_the_restart_fraction_is_not_a_restart(th):
    # 30 -> 20 GiB: a third, under leak.restart_drop_fraction (a half)
    dip = np.where(np.arange(STEPS) < STEPS // 2, 30 * GIB, 20 * GIB)
    assert recs(th, ("dip", dip)).loc["dip", "memory_restarts"] == 0


def test_cycles_that_grow_less_than_the_leak_thresholds_are_not_a_leak(th):
    # each cycle starts at 2 GiB for one step, then climbs from 29 to 30 GiB: 1 GiB a cycle is
    # 3 % of its peak, under leak.min_growth_fraction
    slight = sawtooth(low=29 * GIB, high=30 * GIB)
    slight[np.arange(STEPS) % 120 == 0] = 2 * GIB
    row = recs(th, ("slight", slight)).loc["slight"]
    assert row["memory_restarts"] > 0 and row["memory_leak"] == ""


def test_the_cycle_window_must_hold_two_steps(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("leak:\n  cycle_window_steps: 1\n")
    with pytest.raises(AnalyzerError, match=r"t.yaml: leak.cycle_window_steps must be at least 2, got 1"):
        load_thresholds(path)


def test_a_longer_cycle_window_fits_the_same_growth(th):
    th = dataclasses.replace(th, leak=dataclasses.replace(th.leak, cycle_window_steps=20))
    row = recs(th, ("saw", sawtooth())).loc["saw"]
    assert row["memory_cycle_slope_bytes_per_hour"] == pytest.approx(17 * GIB)


@pytest.fixture(scope="module")
def k8s_day(tmp_path_factory):
    path = tmp_path_factory.mktemp("k8s-a100-mixed") / "history"
    simulate("k8s-a100-mixed", duration_s=86400, out=path, step_s=300, seed=0)
    return analyze_history(read_history(path), load_thresholds(), with_archetypes=False)


def test_the_k8s_a100_mixed_feature_stream_pod_is_a_leak_that_restarts_every_two_hours(k8s_day):
    # GPU 3: memory grows from 6 to 70 GiB over two hours and starts again (sim/scenarios/k8s-a100-mixed.yaml)
    recs = k8s_day.recs.set_index("job_id")
    row = recs.loc["batch/feature-stream-0"]
    assert row["memory_restarts"] == 12
    assert row["memory_period_s"] == pytest.approx(2 * 3600, rel=0.05)
    assert "period ~2.0 h (12 restarts in the window" in row["memory_leak"]
    assert row["recommendation"] == "exclusive" and not row["false_saturation"]
    assert row["finding"].startswith("memory leak")
    others = recs.drop(index="batch/feature-stream-0")
    assert (others["memory_leak"] == "").all() and (others["memory_restarts"] == 0).all()
