"""Per-job demand series: the bin both paths share, bounded in what a large fleet reads."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer import demand

STEP = 300.0
WEEK = 7 * 86400.0
T0 = 1_767_225_600.0  # a multiple of an hour


def test_a_small_fleet_is_binned_at_its_step():
    starts = [T0, T0 + 3600.0]
    assert demand.bin_seconds(STEP, starts, [T0 + WEEK - STEP, T0 + 7200.0]) == STEP


def test_a_fleet_whose_lifetimes_exceed_the_budget_gets_the_smallest_hour_aligned_bin_that_holds_them():
    # 10,000 jobs of a day each at a 5 min step hold 2.9 M bins: a 20 min bin holds 730,000, a
    # 25 min one (no divisor of an hour) is skipped, a 30 min one holds 490,000
    jobs = 10_000
    starts = T0 + (np.arange(jobs) % 6) * 86400.0
    ends = starts + 86400.0 - STEP
    bin_s = demand.bin_seconds(STEP, starts, ends)
    assert bin_s == 1800.0
    spans = np.column_stack([starts, ends])
    assert demand.job_bins(spans, bin_s) <= demand.MAX_JOB_BINS < demand.job_bins(spans, 1200.0)


def test_jobs_without_a_span_do_not_count():
    assert demand.bin_seconds(STEP, [float("nan"), T0], [T0, T0 + 3600.0]) == STEP


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2015), st.integers(0, 2015)),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 5000),
)
def test_the_bin_is_whole_steps_and_holds_the_budget_unless_each_job_needs_one(steps, copies):
    spans = np.array([(T0 + min(a, b) * STEP, T0 + max(a, b) * STEP) for a, b in steps] * copies)
    bin_s = demand.bin_seconds(STEP, spans[:, 0], spans[:, 1])
    assert bin_s % STEP == 0
    span_steps = (spans[:, 1].max() - spans[:, 0].min()) / STEP + 1
    assert bin_s / STEP <= max(1.0, span_steps)
    fits = demand.job_bins(spans, bin_s) <= demand.MAX_JOB_BINS
    assert fits or bin_s / STEP >= span_steps - 1 or demand.job_bins(spans, bin_s) <= 2 * len(spans)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.floats(0.0, 1.0, width=32), min_size=12, max_size=12), min_size=2, max_size=5),
    st.sampled_from([1, 2, 3, 4, 6, 12]),
)
def test_a_wider_bin_never_understates_a_co_located_sum(per_job, factor):
    times = T0 + STEP * np.arange(1, 13)
    exact = demand.colocated([demand.binned(times, np.array(v), STEP) for v in per_job], 1.0, 1.0)
    wide = demand.colocated([demand.binned(times, np.array(v), STEP * factor) for v in per_job], 1.0, 1.0)
    assert wide.high >= exact.high - 1e-6
