"""The dead band (`analyzer/hysteresis.py`): a running MPS setting is kept while the newly sized one
differs from it by noise, unless the cap binds or the memory need outgrows the limit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer import demand, frames, hysteresis, modes
from gpulens.analyzer.hysteresis import Running, Told, at_cap, memory_limit, thread_cap, told_of
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.pipeline import analyze_profiles
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.recommend import memory_need
from gpulens.analyzer.thresholds import load_thresholds
from tests.analyzer import synth
from tests.analyzer.synth import SynthJob, flat, steady

GIB = 1024**3
MIB = 1024**2


def _row(p95: float, percentile: str = "p95", **extra: object) -> dict[str, Any]:
    return {"sizing_percentile": percentile, "sm_active_p95": p95, "sm_active_p99": p95, **extra}


def test_a_cap_within_the_dead_band_that_does_not_bind_is_kept(th):
    kept = thread_cap(16, 19, at_cap(_row(0.133), 0.19, th), th)
    assert kept.value == 19
    assert "keeps its 19 % cap: sized 16 %, within the 5-point dead band" in kept.why
    assert "p95 demand 13 % < 95 % of its 19 % cap" in kept.why


def test_a_cap_sized_beyond_the_dead_band_changes(th):
    assert thread_cap(26, 19, at_cap(_row(0.12), 0.19, th), th) == hysteresis.Kept(26)
    assert thread_cap(12, 19, at_cap(_row(0.09), 0.19, th), th) == hysteresis.Kept(12)


def test_a_binding_cap_is_raised_even_within_the_dead_band(th):
    binding = at_cap(_row(0.213), 0.20, th)
    assert binding.binds
    raised = thread_cap(24, 20, binding, th)
    assert raised.value == 24 and "its 20 % cap binds (p95 demand 21 % >= 95 % of its 20 % cap)" in raised.why


def test_a_cap_its_series_exceeds_too_often_binds_even_under_its_percentile(th):
    """Per-bin demand above the cap in 10 % of the bins (> compute.max_bind_fraction) binds, though
    the row's p95 says otherwise (a row from another window, a rounded figure)."""
    values = np.array([0.1] * 90 + [0.3] * 10, dtype=np.float32)
    binding = at_cap(_row(0.12), 0.2, th, demand.Series(0, values))
    assert binding.binds and binding.over_share == pytest.approx(0.10)
    assert thread_cap(22, 20, binding, th).value == 22


def test_a_latency_sensitive_job_is_judged_at_its_p99(th):
    row = _row(0.10, "p99", sm_active_p99=0.22)
    assert at_cap(row, 0.23, th).binds and not at_cap(_row(0.10), 0.23, th).binds


def test_a_latency_sensitive_clients_cap_is_not_lowered_from_data_measured_under_it(th):
    """Its bursts, clipped by the cap within a step, read short of what it needs: 17 % sized under
    a 30 % cap keeps 30 %; a batch client's is lowered."""
    binding = at_cap(_row(0.14, "p99"), 0.30, th)
    kept = thread_cap(17, 30, binding, th, bursty=True)
    assert kept.value == 30
    assert "keeps its 30 % cap: sized 17 % from data measured under it" in kept.why
    assert "latency-sensitive (sized at its p99 for its bursts)" in kept.why
    assert thread_cap(17, 30, binding, th).value == 17


def test_a_latency_sensitive_clients_binding_cap_is_raised(th):
    assert thread_cap(36, 30, at_cap(_row(0.29, "p99"), 0.30, th), th, bursty=True).value == 36


def test_a_pinned_limit_that_holds_the_need_within_the_dead_band_is_kept(th):
    need = memory_need(10 * GIB, th)
    sized = int(np.ceil(need / MIB) * MIB)
    kept = memory_limit(need, sized, sized + 512 * MIB, th)
    assert kept.value == sized + 512 * MIB and "holds the need of 11.0 GiB" in kept.why


def test_a_memory_need_above_the_running_limit_raises_it_and_never_below_the_peak(th):
    peak = 10 * GIB
    need = memory_need(peak, th)
    sized = int(np.ceil(need / MIB) * MIB)
    raised = memory_limit(need, sized, int(peak), th)  # the limit it runs under holds only the peak
    assert raised == hysteresis.Kept(sized) and raised.value >= need > peak


def test_a_limit_far_above_the_need_gives_the_memory_back(th):
    need = memory_need(10 * GIB, th)
    sized = int(np.ceil(need / MIB) * MIB)
    assert memory_limit(need, sized, 2 * sized, th) == hysteresis.Kept(sized)


def test_last_weeks_mps_clients_are_read_from_its_jobs(th):
    jobs = [
        {
            "job_id": "a",
            "workload": "ns/a",
            "recommendation": "mps",
            "mps_active_thread_percentage": 19,
            "mps_pinned_memory_limit_bytes": 9 * GIB,
        },
        {"job_id": "b", "recommendation": "exclusive", "mps_active_thread_percentage": None},
        {"job_id": "c", "recommendation": "mps", "mps_active_thread_percentage": 140},
        {"job_id": "d", "recommendation": "mps", "mps_active_thread_percentage": "x"},
    ]
    assert told_of(jobs) == (Told("a", "ns/a", 19, 9 * GIB),)


def test_a_rolled_out_pod_is_followed_by_its_workload(th):
    recs = pd.DataFrame(
        {
            "job_id": ["ml/ranker-7d9f8c6b5-x2x7q", "ml/other-0"],
            "sharing": ["mps", "exclusive"],
            "job_source": ["kubernetes", "kubernetes"],
            "job_namespace": ["ml", "ml"],
            "job_pod": ["ranker-7d9f8c6b5-x2x7q", "other-0"],
        }
    )
    told = (
        Told("ml/ranker-6c9f7d8b5-k2x7q", "ml/ranker", 15, None),
        Told("ml/other-0", "ml/other-0", 20, None),
    )
    found = hysteresis.running_settings(recs, told)
    # other-0 no longer runs under MPS; no cap measured: the ranker runs under what it was told
    assert found == {"ml/ranker-7d9f8c6b5-x2x7q": Running("ml/ranker-7d9f8c6b5-x2x7q", told[0])}
    assert found["ml/ranker-7d9f8c6b5-x2x7q"].thread_percentage == 15


# --- the cap measured (gpu_job_mps_active_thread_ratio) is the one in force ---------------------

TOLD_20 = Told("ml/ranker-0", "ml/ranker-0", 20, 9 * GIB)


def _client(measured: float | None, sized: int = 31, p95: float = 0.15) -> pd.DataFrame:
    """One Kubernetes MPS client told 20 % last week, now sized `sized` %, measured running at
    `measured` % (None: the exporter published no cap)."""
    need = 8 * GIB
    return pd.DataFrame(
        [
            {
                "job_id": "ml/ranker-0",
                "sharing": "mps",
                "job_source": "kubernetes",
                "job_namespace": "ml",
                "job_pod": "ranker-0",
                "mps_thread_cap_now_pct": np.nan if measured is None else measured,
                "recommendation": "mps",
                "mps_active_thread_percentage": sized,
                "mps_pinned_memory_limit_bytes": 9 * GIB,
                "memory_need_bytes": float(need),
                "sizing_percentile": "p95",
                "sm_active_p95": p95,
                "numbers": {"mem_fraction": need / (80 * GIB)},
                "gpu_fraction": sized / 100,
                "reason": "light",
            }
        ]
    )


def test_the_running_cap_is_the_measured_one_before_last_weeks_plan():
    (running,) = hysteresis.running_settings(_client(100 / 3), (TOLD_20,)).values()
    assert running.thread_percentage == pytest.approx(100 / 3)
    assert running.told == TOLD_20 and running.pinned_memory_limit_bytes == 9 * GIB  # not measured


def test_a_measured_cap_is_the_running_cap_without_last_weeks_report():
    assert hysteresis.running_settings(_client(25.0), ()) == {
        "ml/ranker-0": Running("ml/ranker-0", None, 25.0)
    }


def test_the_dead_band_keeps_the_measured_running_cap(th):
    """Told 20 %, it runs at the device plugin's 33 %: sized 31 % is within the dead band of the
    cap in force, so 33 % is kept; measured against the plan's 20 % it would have moved to 31 %."""
    kept = hysteresis.apply(_client(100 / 3), (TOLD_20,), th).iloc[0]
    assert kept["mps_active_thread_percentage"] == 33
    assert "keeps its 33 % cap: sized 31 %" in kept["reason"]
    assert "runs at 33 % (the device plugin's 100/3), the plan asked 20 %" in kept["reason"]
    unmeasured = hysteresis.apply(_client(None), (TOLD_20,), th).iloc[0]
    assert unmeasured["mps_active_thread_percentage"] == 31 and unmeasured["reason"] == "light"


def test_a_client_running_at_the_cap_it_was_told_gets_no_note(th):
    out = hysteresis.apply(_client(20.0, sized=21, p95=0.15), (TOLD_20,), th).iloc[0]
    assert out["mps_active_thread_percentage"] == 20 and "runs at" not in out["reason"]


# --- through the analysis: the plan packs and sums Slurm's shares with the kept caps -------------

LEVELS = {"embed": 0.20, "rank": 0.15, "eval": 0.10}
GPUS = {"embed": "GPU-a", "rank": "GPU-a", "eval": "GPU-b"}  # eval alone: the plan moves it beside them


def _clients() -> list[SynthJob]:
    return [
        SynthJob(job, GPUS[job], steady(120, level, 0.01, seed=n), flat(120, 8 * GIB), sharing="mps")
        for n, (job, level) in enumerate(LEVELS.items())
    ]


@pytest.fixture
def clients_profile(th):
    return profiles_from_samples(synth.with_device_shares(synth.frame(_clients())), synth.STEP, th)


def _sized(profiles, th) -> dict[str, tuple[int, int]]:
    recs = analyze_profiles(profiles, th, "test", with_archetypes=False).recs.set_index("job_id")
    return {
        job: (
            int(recs.loc[job, "mps_active_thread_percentage"]),
            int(recs.loc[job, "mps_pinned_memory_limit_bytes"]),
        )
        for job in LEVELS
    }


def _plan_caps(analysis) -> dict[str, int]:
    return {
        c["job_id"]: c["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]
        for entry in analysis.plan.layout
        for c in entry.get("mps_clients", [])
    }


def test_the_plan_places_mps_clients_with_the_caps_they_run_under(clients_profile, th):
    sized = _sized(clients_profile, th)
    running = {job: cap + 3 for job, (cap, _) in sized.items()}  # 3 points off: noise
    told = tuple(Told(job, job, running[job], sized[job][1]) for job in LEVELS)
    analysis = analyze_profiles(clients_profile, th, "test", with_archetypes=False, told=told)
    recs = analysis.recs.set_index("job_id")
    assert {job: int(recs.loc[job, "mps_active_thread_percentage"]) for job in LEVELS} == running
    assert _plan_caps(analysis) == running  # one GPU: Slurm's per-GPU shares sum the kept caps
    assert sum(running.values()) <= 100
    assert recs.loc["eval", "action"] == "change" and recs.loc["embed", "action"] == "keep"
    assert "within the 5-point dead band" in recs.loc["embed", "reason"]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(10, 60),  # sized cap (%)
            st.integers(-5, 5),  # running cap - sized cap: within the dead band
            st.floats(0.0, 0.94),  # demand at the sizing percentile, as a share of the running cap
            st.integers(1, 30),  # memory need (GiB)
            st.floats(0.0, 0.10),  # running limit above the need, as a share of it
        ),
        min_size=1,
        max_size=8,
    )
)
def test_a_fleet_running_within_the_dead_band_without_binding_gets_no_change(jobs):
    th = load_thresholds()
    rows, told = [], []
    for n, (sized, delta, load, need_gib, over) in enumerate(jobs):
        running = max(10, min(100, sized + delta))
        need = need_gib * GIB
        sized_limit = int(np.ceil(need / MIB) * MIB)
        limit = int(sized_limit * (1 + over)) // MIB * MIB
        limit = max(limit, sized_limit)
        job = f"job-{n}"
        rows.append(
            {
                "job_id": job,
                "sharing": "mps",
                "recommendation": "mps",
                "mps_active_thread_percentage": sized,
                "mps_pinned_memory_limit_bytes": sized_limit,
                "memory_need_bytes": float(need),
                "sizing_percentile": "p95",
                "sm_active_p95": load * running / 100,
                "numbers": {"mem_fraction": need / (80 * GIB)},
                "gpu_fraction": sized / 100,
                "reason": "light",
            }
        )
        told.append(Told(job, job, running, limit))
    out = hysteresis.apply(pd.DataFrame(rows), tuple(told), th).set_index("job_id")
    for t in told:
        assert out.loc[t.job_id, "mps_active_thread_percentage"] == t.thread_percentage
        assert out.loc[t.job_id, "mps_pinned_memory_limit_bytes"] == t.pinned_memory_limit_bytes


# --- a client recommended another mode keeps its settings for the MPS mode the plan may choose --


def _notebook(measured: float, p99: float = 0.135) -> pd.DataFrame:
    """A latency-sensitive Slurm MPS client recommended time-slicing (idle-dominated), its demand
    read under a `measured` % cap."""
    need = 19 * GIB
    return pd.DataFrame(
        [
            {
                "job_id": "8003",
                "gpu_model": "NVIDIA H100 80GB HBM3",
                "gpus": 1,
                "sharing": "mps",
                "job_source": "slurm",
                "job_user": "carol",
                "job_name": "nb",
                "mps_thread_cap_now_pct": measured,
                "recommendation": "time-slicing",
                "mps_active_thread_percentage": np.nan,
                "mps_pinned_memory_limit_bytes": np.nan,
                "memory_need_bytes": float(need),
                "sm_fraction": p99,
                "sm_demand_sms": p99 * 132 * 1.2,
                "latency_sensitive": True,
                "sizing_percentile": "p99",
                "sm_active_p95": p99 / 2,
                "sm_active_p99": p99,
                "numbers": {"mem_fraction": need / (80 * GIB)},
                "reason": "idle-dominated",
            }
        ]
    )


def test_a_client_recommended_another_mode_keeps_its_cap_for_its_mps_mode(th):
    out = hysteresis.apply(_notebook(30.0), (), th)
    row = out.iloc[0]
    assert row["recommendation"] == "time-slicing" and row["reason"] == "idle-dominated"
    assert row[hysteresis.KEPT_THREADS] == 30
    assert "keeps its 30 % cap: sized 17 % from data measured under it" in row[hysteresis.KEPT_NOTE]
    [mps] = [m for m in modes.modes_of(next(frames.rows(out)), th) if m.kind == Kind.MPS]
    assert (mps.thread_pct, mps.note) == (30, row[hysteresis.KEPT_NOTE])


def test_a_clients_demand_read_under_the_cap_that_clips_it_is_planned_at_what_its_cap_was_sized_from(th):
    """30 % = 25 % demand + 20 % headroom: the plan packs it at 25 %, its series scaled alike."""
    row = hysteresis.apply(_notebook(30.0), (), th).iloc[0]
    assert row["sm_fraction"] == pytest.approx(0.30 / (1 + th.headroom.compute_ratio))
    assert row[hysteresis.CENSORED] == pytest.approx(0.25 / 0.135)


def test_a_clients_binding_cap_is_raised_for_its_mps_mode_and_its_demand_taken_as_read(th):
    row = hysteresis.apply(_notebook(20.0, p99=0.25), (), th).iloc[0]
    assert row[hysteresis.KEPT_THREADS] == 30 and "its 20 % cap binds" in row[hysteresis.KEPT_NOTE]
    assert row["sm_fraction"] == 0.25 and hysteresis.CENSORED not in row
