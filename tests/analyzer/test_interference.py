"""A shared GPU is judged by the co-located sum of its jobs' per-step demand (issue 31 item 2),
not by the sum of each job's own p95."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer import demand
from gpulens.analyzer.bins import Item
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.packing import pack
from gpulens.analyzer.pipeline import analyze_history, analyze_profiles
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.sources import files
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.sim.history import simulate
from tests.analyzer import synth

STEPS = 240
A100 = "NVIDIA A100-SXM4-40GB"


def bursts(phase: int, level: float = 0.85) -> np.ndarray:
    """Idle but for 10-step bursts at `level`, one period in four (the `phase`-th)."""
    return np.where((np.arange(STEPS) // 10) % 4 == phase, level, 0.0)


def analysis(first: np.ndarray, second: np.ndarray, keep_series: bool = True):
    th = load_thresholds()
    jobs = [
        synth.SynthJob("a", "GPU-a", first, synth.flat(STEPS, 4 * synth.GIB)),
        synth.SynthJob("b", "GPU-b", second, synth.flat(STEPS, 4 * synth.GIB), node="node-2"),
    ]
    profiles = profiles_from_samples(synth.frame(jobs), synth.STEP, th)
    if not keep_series:
        profiles.attrs.clear()
    return analyze_profiles(profiles, th, "test", with_archetypes=False)


def shared(result) -> list[dict[str, Any]]:
    return [e for e in result.plan.layout if e["sharing"] in (Kind.TIME_SLICING, Kind.MPS)]


def test_two_bursty_jobs_that_never_burst_together_share_one_gpu():
    result = analysis(bursts(0), bursts(2))
    assert list(result.recs["sm_active_p95"]) == [0.85, 0.85]  # their p95s add up to 1.7
    [gpu] = shared(result)
    assert sorted(gpu["jobs"]) == ["a", "b"]
    assert gpu["interference"]["basis"] == "co-located series"
    assert gpu["interference"]["sm_over_share"] == 0.0
    assert gpu["interference"]["sm_sum_high"] == 0.85
    assert result.plan.gpus_freed == 1


def test_two_bursty_jobs_that_burst_together_keep_a_gpu_each():
    result = analysis(bursts(0), bursts(0))
    assert shared(result) == []
    assert result.plan.gpus_freed == 0


def test_bursts_that_meet_in_under_the_bind_fraction_of_steps_share():
    # b bursts beside a once in 24 steps (~4 % of a's bins, under compute.max_bind_fraction 5 %)
    second = bursts(2)
    second[5] = 0.85
    result = analysis(bursts(0), second)
    [gpu] = shared(result)
    assert 0 < gpu["interference"]["sm_over_share"] <= 0.05


def test_without_series_the_p95_sum_decides():
    result = analysis(bursts(0), bursts(2), keep_series=False)
    assert shared(result) == []


def test_bins_are_whole_steps_and_hold_their_steps_maximum():
    week = 7 * 86400.0
    assert demand.bin_seconds(300.0, [0.0], [week - 300.0]) == 300.0  # 2016 steps: a bin each
    assert demand.bin_seconds(60.0, [0.0], [week]) == 360.0  # 10,081 steps: 6 a bin
    series = demand.binned(np.array([60.0, 120.0, 180.0, 240.0]), np.array([0.1, 0.5, 0.2, 0.3]), 120.0)
    assert series is not None and series.first == 1
    assert series.values.tolist() == [np.float32(0.5), np.float32(0.3)]


def _item(n: int, first: int, values: list[float], kind: str) -> Item:
    series = demand.Series(first, np.array(values, dtype=np.float32))
    return Item(
        job_id=f"j{n}",
        kind=kind,
        model="A100-40GB",
        start=float(first),
        end=float(first + len(values) - 1),
        gpus=1,
        memory=synth.GIB,
        sm=0.1,
        load=float(np.mean(values)),
        used_hours=1.0,
        p95=float(np.quantile(values, 0.95)),
        source="slurm",
        thread_pct=10 if kind == Kind.MPS else None,
        sm_series=series,
    )


jobs_strategy = st.lists(
    st.tuples(
        st.integers(0, 20),
        st.lists(st.sampled_from([0.0, 0.05, 0.3, 0.6, 0.9]), min_size=5, max_size=40),
    ),
    min_size=2,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(jobs=jobs_strategy, kind=st.sampled_from([Kind.TIME_SLICING.value, Kind.MPS.value]))
def test_a_packed_shared_gpu_exceeds_itself_in_at_most_the_bind_fraction_of_bins(jobs, kind):
    th = load_thresholds()
    items = [_item(n, first, values, kind) for n, (first, values) in enumerate(jobs)]
    limit = th.mps.max_load if kind == Kind.MPS else th.time_slicing.max_interference
    for gpu in pack(items, th):
        series = [i.sm_series for i in gpu.items if i.sm_series is not None]
        if len(series) > 1:
            assert demand.colocated(series, limit).over_share <= th.compute.max_bind_fraction + 1e-12


def test_the_shipped_bursty_pair_shares_one_gpu_by_its_co_located_series(tmp_path):
    simulate("bursty-pair", duration_s=86400.0, out=tmp_path / "h", step_s=300.0, start=1_750_000_200.0)
    result = analyze_history(files.load(str(tmp_path / "h")), load_thresholds(), with_archetypes=False)
    assert result.recs["sm_active_p95"].sum() > 1.0  # the p95 sum alone would keep them apart
    [gpu] = shared(result)
    assert sorted(gpu["jobs"]) == ["8101", "8102"]
    assert gpu["interference"]["basis"] == "co-located series"
    assert 0 < gpu["interference"]["sm_over_share"] <= load_thresholds().compute.max_bind_fraction
    assert result.plan.gpus_freed == 1
