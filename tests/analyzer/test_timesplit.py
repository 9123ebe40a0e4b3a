"""A time-sliced job's demand is never read below what it measured whole (`analyzer/timesplit.py`):
the exporter's split of a time-sliced GPU's SM activity by kernel time under-reads wide kernels."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer import demand, frames, modes, timesplit
from gpulens.analyzer.pipeline import analyze_profiles
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.analyzer.timesplit import SCALE, SPLIT, WHOLE, WHOLE_PERCENTILE, Whole, WholeFigures, whole_of
from tests.analyzer import synth
from tests.analyzer.synth import SynthJob, flat, steady

A100 = "NVIDIA A100-SXM4-80GB"
GIB = 1024**3


def _last_week(**extra: object) -> dict[str, Any]:
    """A `jobs.json` row of a job measured whole."""
    row: dict[str, Any] = {
        "job_id": "vision/detect-7c9d5f6b8-q4x2z",
        "job_source": "kubernetes",
        "job_namespace": "vision",
        "job_pod": "detect-7c9d5f6b8-q4x2z",
        "gpu_model": A100,
        "gpus": 1,
        "sharing": "exclusive",
        "activity_signal": "sm_active",
        "sizing_percentile": "p95",
        "sm_active_p95": 0.188,
        "sm_active_p99": 0.25,
    }
    return {**row, **extra}


def _profile(
    job_id: str = "vision/detect-7c9d5f6b8-q4x2z", p95: float = 0.115, **extra: object
) -> dict[str, Any]:
    """A profile row of a job time-sliced now."""
    namespace, pod = job_id.split("/")
    row: dict[str, Any] = {
        "job_id": job_id,
        "job_source": "kubernetes",
        "job_namespace": namespace,
        "job_pod": pod,
        "gpu_model": A100,
        "gpus": 1,
        "sharing": "time-slicing",
        "activity_signal": "sm_active_share",
        "sm_active_mean": p95 / 2,
        "sm_active_p50": p95 / 2,
        "sm_active_p95": p95,
        "sm_active_p99": p95 * 1.2,
        "sm_active_max": p95 * 1.5,
    }
    return {**row, **extra}


def _apply(rows: list[dict[str, Any]], whole: WholeFigures) -> pd.DataFrame:
    return timesplit.apply(pd.DataFrame(rows), whole)


def test_a_job_measured_whole_last_week_gives_its_figure_at_its_sizing_percentile():
    (found,) = whole_of([_last_week(sizing_percentile="p99")]).figures
    assert found == Whole("vision/detect-7c9d5f6b8-q4x2z", "vision/detect", A100, "sm_active", "p99", 0.25)


def test_a_time_sliced_job_reads_no_less_than_it_measured_whole():
    out = _apply([_profile(p95=0.115)], whole_of([_last_week()])).iloc[0]
    assert out["sm_active_p95"] == pytest.approx(0.188)
    scale = 0.188 / 0.115
    assert out[SCALE] == pytest.approx(scale)
    assert out["sm_active_mean"] == pytest.approx(0.0575 * scale)
    assert out["sm_active_max"] == pytest.approx(min(1.0, 0.1725 * scale))


def test_its_series_scale_with_it():
    frame = pd.DataFrame([_profile(p95=0.1)])
    series = demand.Series(0, np.array([0.05, 0.1, 0.08], dtype=np.float32))
    demand.attach(frame, demand.Demand(300.0, {"vision/detect-7c9d5f6b8-q4x2z": series}))
    out = demand.of(timesplit.apply(frame, whole_of([_last_week()])))
    assert out is not None
    np.testing.assert_allclose(
        out.sm["vision/detect-7c9d5f6b8-q4x2z"].values, [0.094, 0.188, 0.1504], rtol=1e-5
    )


def test_a_split_that_reads_above_the_whole_figure_stands():
    """The narrow-kernel job's split reads high: it errs on the safe side, and a job may grow."""
    out = _apply([_profile(p95=0.137)], whole_of([_last_week(sm_active_p95=0.06)])).iloc[0]
    assert out["sm_active_p95"] == pytest.approx(0.137)
    assert SCALE not in out or pd.isna(out[SCALE])
    assert out[WHOLE] == pytest.approx(0.06)  # carried all the same, while it stays time-sliced


def test_the_whole_figure_is_carried_from_week_to_week_while_the_job_stays_time_sliced():
    week2 = _apply([_profile(p95=0.115)], whole_of([_last_week()]))
    carried = week2.assign(sizing_percentile="p95").to_dict("records")  # what jobs.json then holds
    (again,) = whole_of(carried).figures
    assert (again.demand, again.percentile, again.signal) == (pytest.approx(0.188), "p95", "sm_active")
    week3 = _apply([_profile(p95=0.11)], WholeFigures((again,))).iloc[0]
    assert week3["sm_active_p95"] == pytest.approx(0.188)


def test_a_job_rolled_out_under_a_new_pod_name_is_matched_by_its_workload():
    out = _apply([_profile("vision/detect-5f4b8c9d7-zx2lm", p95=0.115)], whole_of([_last_week()])).iloc[0]
    assert out["sm_active_p95"] == pytest.approx(0.188)


def test_a_job_last_weeks_report_had_never_takes_another_jobs_figure_of_its_workload():
    """Two Slurm jobs of one user and name share a workload: the one measured at 3 % last week
    (time-sliced, no whole figure) is not held to the other's whole figure."""
    wide = _last_week(job_id="8820", job_source="slurm", job_user="ann", job_name="nb", job_pod="")
    narrow = {**wide, "job_id": "8821", "sharing": "time-slicing", "activity_signal": "sm_active_share"}
    now = {**_profile(p95=0.03), **{k: narrow[k] for k in ("job_id", "job_source", "job_user", "job_name")}}
    now.update(job_namespace="", job_pod="")
    out = _apply([now], whole_of([wide, narrow])).iloc[0]
    assert out["sm_active_p95"] == pytest.approx(0.03)


def test_each_whole_figure_holds_one_job_of_its_workload():
    rows = [_profile("vision/detect-5f4b8c9d7-bbbbb"), _profile("vision/detect-5f4b8c9d7-ccccc")]
    out = _apply(rows, whole_of([_last_week()]))
    assert sorted(out["sm_active_p95"].round(3)) == [0.115, 0.188]


@pytest.mark.parametrize(
    "now",
    [
        {"gpu_model": "NVIDIA L4"},  # another model: not on the same scale
        {"sharing": "mps"},  # an MPS client: its cap rules (hysteresis.py)
        {"sharing": "exclusive", "activity_signal": "sm_active"},  # whole again: measured afresh
        {"activity_signal": "utilization_share"},  # another signal than it was measured by
        {"gpus": 2},
    ],
)
def test_only_a_one_gpu_time_sliced_job_of_the_same_model_and_signal_is_held(now):
    out = _apply([_profile(p95=0.115, **now)], whole_of([_last_week()])).iloc[0]
    assert out["sm_active_p95"] == pytest.approx(0.115)


@pytest.mark.parametrize(
    "bad",
    [
        {"sm_active_p95": "high"},
        {"sm_active_p95": None},
        {"sm_active_p95": 1.7},
        {"sm_active_p95": -0.1},
        {"sizing_percentile": "p42"},
        {"gpus": "one"},
        {"sharing": "mig"},
        {"activity_signal": "job_sm_utilization"},  # per-process kernel time: not on the SM scale
    ],
)
def test_a_last_week_row_without_a_usable_whole_figure_gives_nothing(bad):
    assert whole_of([_last_week(**bad)]).figures == ()


def test_rows_that_are_not_objects_give_nothing():
    assert whole_of(["detect", 3, None]) == WholeFigures()


def test_the_reason_says_what_the_split_read_and_what_it_was_held_to():
    recs = _apply([_profile(p95=0.115)], whole_of([_last_week()])).assign(reason="light")
    (reason,) = timesplit.explain(recs)["reason"]
    assert reason.startswith("light; time-sliced, its share of the GPU's SM activity")
    assert "read 11.5 % at p95: held to the 18.8 % it measured whole" in reason


def test_profiles_without_a_match_are_returned_as_given():
    frame = pd.DataFrame([_profile("web/other-5f4b8c9d7-qqqqq")])
    assert timesplit.apply(frame, whole_of([_last_week()])) is frame
    assert WHOLE_PERCENTILE not in timesplit.apply(frame, None)


@settings(max_examples=60, deadline=None)
@given(
    split=st.floats(0.0, 1.0),
    whole=st.floats(0.001, 1.0),
    tail=st.floats(1.0, 3.0),
)
def test_held_demand_never_falls_and_never_exceeds_the_gpu(split, whole, tail):
    """Invariant: held, every activity figure is at least what the split read and at most 1."""
    row = _profile(p95=split, sm_active_p99=min(1.0, split * tail), sm_active_max=min(1.0, split * tail))
    out = _apply([row], whole_of([_last_week(sm_active_p95=whole)])).iloc[0]
    for column in timesplit.ACTIVITY:
        assert row[column] - 1e-12 <= out[column] <= 1.0
    if split > 0:
        assert out["sm_active_p95"] >= min(whole, 1.0) - 1e-9


# ---------------------------------------------------------------- a share with no whole figure


def _shared_gpu_analysis(*jobs: SynthJob, whole: WholeFigures | None = None) -> pd.DataFrame:
    th = load_thresholds()
    samples = synth.with_device_shares(synth.frame(list(jobs)), remainder=0.0)
    profiles = profiles_from_samples(samples, synth.STEP, th)
    return analyze_profiles(profiles, th, "test", with_archetypes=False, whole=whole).recs.set_index("job_id")


def _sliced(job: str, uuid: str, level: float, first_step: int = 0, steps: int = 120) -> SynthJob:
    return SynthJob(
        job,
        uuid,
        steady(steps, level, 0.01),
        flat(steps, 4 * GIB),
        sharing="time_slicing",
        first_step=first_step,
    )


def test_a_job_time_sliced_beside_others_with_no_whole_figure_stays_time_sliced():
    """Its share cannot tell wide kernels from narrow ones: no MPS cap or MIG slice is sized from it."""
    recs = _shared_gpu_analysis(_sliced("render", "GPU-a", 0.2), _sliced("dedup", "GPU-a", 0.1))
    for job in ("render", "dedup"):
        assert recs.loc[job, SPLIT]
        assert recs.loc[job, "recommendation"] == "time-slicing"
        reason = recs.loc[job, "reason"]
        assert "a split of the GPU's activity by kernel time, which cannot tell wide kernels" in reason
        assert "no MPS cap or MIG slice is sized from it, it stays time-sliced" in reason
        assert pd.isna(recs.loc[job, "mps_active_thread_percentage"])


def test_a_job_alone_on_a_time_sliced_gpu_reads_the_gpus_own_figure_and_is_sized():
    recs = _shared_gpu_analysis(_sliced("lone", "GPU-b", 0.15))
    assert SPLIT not in recs
    assert recs.loc["lone", "reason"].startswith("light: p95 SM activity")  # sized for a cap


def test_jobs_that_took_turns_on_a_gpu_never_shared_it():
    recs = _shared_gpu_analysis(
        _sliced("first", "GPU-a", 0.15, steps=50), _sliced("second", "GPU-a", 0.15, 60, 50)
    )
    assert SPLIT not in recs
    assert all(reason.startswith("light: p95 SM activity") for reason in recs["reason"])


def test_a_job_held_to_its_whole_figure_is_sized_from_it():
    whole = WholeFigures((Whole("render", "render", synth.SynthJob.model, "sm_active", "p95", 0.22),))
    recs = _shared_gpu_analysis(_sliced("render", "GPU-a", 0.2), _sliced("dedup", "GPU-a", 0.1), whole=whole)
    assert not recs.loc["render", SPLIT] and recs.loc["dedup", SPLIT]
    assert recs.loc["render", "reason"].startswith("light: p95 SM activity")


def test_a_split_only_job_is_offered_no_other_mode():
    recs = _shared_gpu_analysis(_sliced("render", "GPU-a", 0.2), _sliced("dedup", "GPU-a", 0.1))
    row = next(frames.rows(recs.reset_index().loc[recs.reset_index()["job_id"] == "render"]))
    assert modes.modes_of(row, load_thresholds()) == ()
