"""Per-job demand series on one bounded time grid: what the packer sums to judge a shared GPU.

A shared GPU (MPS, time-slicing) is judged by the co-located sum of its jobs' per-step demand,
not by the sum of each job's own percentile: two bursty jobs that never burst together share a
GPU; two that burst together do not (issue 31 item 2). Each job keeps one compact series per
figure (SM demand, DRAM activity) on a grid of at most `MAX_BINS` bins over the window: a bin
holds the job's largest per-step value in it, so a sum of bins is never below the sum of the
steps it stands for (exact when a bin is one step, as at a 5 min step over a week).

Bins are whole multiples of the step, and a bin ends at a multiple of its length (bin k covers
(k - 1) x bin_s, k x bin_s]): the alignment of a PromQL subquery `[range:bin_s]`, so the file
path (numpy over a history) and the PromQL paths (`max_over_time` per bin) agree.

The series travel with the profile table in `DataFrame.attrs[ATTR]` (pandas carries attrs
through slicing and `recommend` hands them on): profile rows stay plain columns for JSON and
CSV, and a frame without them (an imported requests trace, older callers) packs by the
percentile sums as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

ATTR = "gpulens.demand"
MAX_BINS = 2016  # a week at a 5 min step: 10,000 jobs x 2,016 float32 bins is ~80 MB at most
# bins over every job's lifetime, per figure: what a PromQL path reads as `[time, "value"]` pairs
# (about 1.7 us each in Python, 20 bytes of JSON), so the series cost ~1 s, not ~8 s, for 10,000
# jobs of a day each at a 5 min step. A fleet with more widens the bin: a bin holds the largest
# step in it, so a co-located sum is only ever overstated (fewer pairs share), never understated.
MAX_JOB_BINS = 600_000
HOUR = 3600.0
LIMIT_SLACK = 1e-6  # a sum rounded in float32 is not over its bound by rounding alone


def bin_seconds(step_s: float, starts: Iterable[float], ends: Iterable[float]) -> float:
    """The bin length for jobs with these starts and ends (in the same order) at `step_s`: whole
    steps, so that the span of all of them holds at most about `MAX_BINS` bins and their lifetimes
    at most `MAX_JOB_BINS` bins together (`job_bins`), preferring a bin that divides an hour or is
    whole hours (a job's active hours are then exact). Both paths derive it from the same per-job
    start and end, so they bin alike."""
    spans = np.array(
        [(s, e) for s, e in zip(starts, ends, strict=True) if not (math.isnan(s) or math.isnan(e))],
        dtype=float,
    ).reshape(-1, 2)
    if not len(spans) or not step_s > 0:
        return float(step_s) if step_s > 0 else 1.0
    steps = round((spans[:, 1].max() - spans[:, 0].min()) / step_s) + 1
    factor = max(1, math.ceil(steps / MAX_BINS))
    while factor < steps and job_bins(spans, step_s * factor) > MAX_JOB_BINS:
        factor += 1
        while factor < steps and not _hour_aligned(step_s * factor) and _hour_aligned(step_s):
            factor += 1
    return float(step_s * factor)


def _hour_aligned(bin_s: float) -> bool:
    return HOUR % bin_s == 0 or bin_s % HOUR == 0


def job_bins(spans: np.ndarray, bin_s: float) -> int:
    """Bins the jobs' lifetimes (rows of start, end) touch together: what their series hold."""
    return int((bin_index(spans[:, 1], bin_s) - bin_index(spans[:, 0], bin_s) + 1).sum())


@dataclass(frozen=True, eq=False)
class Series:
    """One job's per-bin demand: `values[n]` is bin `first + n` (bin k ends at k x bin_s)."""

    first: int
    values: np.ndarray  # float32

    @property
    def last(self) -> int:
        """One past the last bin."""
        return self.first + len(self.values)

    def scaled(self, factor: float) -> Series:
        """On another scale (a MIG slice's activity as a share of the whole GPU), at most 1."""
        if factor == 1.0:
            return self
        return Series(self.first, np.minimum(self.values * np.float32(factor), np.float32(1.0)))


def bin_index(times: np.ndarray, bin_s: float) -> np.ndarray:
    """The bin of each timestamp: the k with (k - 1) x bin_s < t <= k x bin_s."""
    return np.ceil(np.asarray(times, dtype=float) / bin_s - 1e-9).astype(np.int64)


def binned(times: np.ndarray, values: np.ndarray, bin_s: float) -> Series | None:
    """A job's per-step (timestamp, value) as per-bin maxima; bins without a sample hold 0 (the job
    asked nothing of the GPU there that anyone saw). None without a sample."""
    if not len(values):
        return None
    keys = bin_index(times, bin_s)
    order = np.argsort(keys, kind="stable")
    keys, ordered = keys[order], np.asarray(values, dtype=float)[order]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    first = int(keys[0])
    out = np.zeros(int(keys[-1]) - first + 1, dtype=np.float32)
    out[keys[starts] - first] = np.maximum.reduceat(ordered, starts)
    return Series(first, out)


HOUR_S = 3600.0


@dataclass(frozen=True)
class ActiveHours:
    """How many clock hours of a job's lifetime saw it use the GPU at all (activity above zero)."""

    active: int
    hours: int

    @property
    def fraction(self) -> float:
        return self.active / self.hours if self.hours else math.nan


def active_hours(series: Series | None, bin_s: float) -> ActiveHours | None:
    """Clock hours (k - 1) x 3600 < t <= k x 3600 from the job's first bin to its last, and those
    in which a bin holds activity above zero (a bin belongs to the hour its end falls in).

    Read from the per-bin series both sources already agree on (the file path, raw PromQL and the
    recording rules), so the figure needs no query of its own and is the same on every path. An
    hour without a sample (a gap) counts in the lifetime, not as active. None without a series."""
    if series is None or not len(series.values):
        return None
    ends = np.arange(series.first, series.last, dtype=np.int64) * bin_s
    hour = np.ceil(ends / HOUR_S - 1e-9).astype(np.int64)  # non-decreasing: count the changes
    busy = hour[series.values > 0]
    active = 1 + int(np.count_nonzero(np.diff(busy))) if len(busy) else 0
    return ActiveHours(active, 1 + int(np.count_nonzero(np.diff(hour))))


@dataclass(frozen=True, eq=False)
class Demand:
    """Every job's series of one analysis (job_id -> series; a job may lack either)."""

    bin_s: float
    sm: Mapping[str, Series] = field(default_factory=dict)
    dram: Mapping[str, Series] = field(default_factory=dict)
    busy: Mapping[str, Series] = field(default_factory=dict)  # duty cycle: time running kernels

    def __deepcopy__(self, memo: dict[int, Any]) -> Demand:
        # immutable: pandas deep-copies `attrs` on most operations, which must not copy ~80 MB
        return self


def attach(frame: pd.DataFrame, demand: Demand) -> pd.DataFrame:
    frame.attrs[ATTR] = demand
    return frame


def of(frame: pd.DataFrame) -> Demand | None:
    """The series a profile (or recommendation) table carries, if any."""
    found = frame.attrs.get(ATTR)
    return found if isinstance(found, Demand) else None


@dataclass(frozen=True)
class Colocated:
    """What a set of co-located series does together."""

    over_share: float  # the largest share, over the jobs, of a job's bins where the sum is over the limit
    high: float  # the sum at the `quantile`, over the bins where some job runs


def colocated(series: Sequence[Series], limit: float, quantile: float | None = None) -> Colocated:
    """Sum the series bin by bin; per job, the share of its own bins where the sum exceeds `limit`
    (a job that ran one hour beside another is judged on that hour, not diluted over the week);
    with `quantile`, the sum's quantile over the bins where some job runs."""
    if not series:
        return Colocated(0.0, 0.0)
    low = min(s.first for s in series)
    total = np.zeros(max(s.last for s in series) - low, dtype=np.float32)
    for s in series:
        total[s.first - low : s.last - low] += s.values
    over = total > limit + LIMIT_SLACK
    share = 0.0
    if over.any():
        counts = np.concatenate(([0], np.cumsum(over)))
        share = max((counts[s.last - low] - counts[s.first - low]) / len(s.values) for s in series)
    high = 0.0
    if quantile is not None:
        present = np.zeros(len(total), dtype=bool)
        for s in series:
            present[s.first - low : s.last - low] = True
        high = float(np.quantile(total[present], quantile)) if present.any() else 0.0
    return Colocated(float(share), high)


def waits(own: Series, others: Sequence[Series], limit: float) -> float:
    """The share of `own`'s bins in which the `others` summed exceed `limit`: how often a job
    waits for more than that on a GPU it time-shares with them (0 with no others)."""
    if not others or not len(own.values):
        return 0.0
    total = np.zeros(len(own.values), dtype=np.float32)
    for s in others:
        lo, hi = max(s.first, own.first), min(s.last, own.last)
        if lo < hi:
            total[lo - own.first : hi - own.first] += s.values[lo - s.first : hi - s.first]
    return float(np.count_nonzero(total > limit + LIMIT_SLACK)) / len(own.values)
