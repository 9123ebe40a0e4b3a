"""Per-job GPU profiles: one row per job with what it was given and what it used.

Two sources feed the same assembly step (`build_profiles`):

- `stats_from_samples` reduces a history's long table with pandas;
- `gpulens.analyzer.sources.prometheus` computes the same reductions inside PromQL.

Both hand over three small identity tables (job series, GPUs, MIG instances) and a per-job dict
of aggregates (`JobStats`), so the rules that turn them into a profile live here once.

Reductions follow jobstats/jobscope: activity is averaged (plus p50/p95/max, idle fraction and
burstiness = stddev / mean), memory is peaked (plus p95). Per step, a multi-GPU job's activity is
the mean over its GPUs and its memory the maximum per GPU, because the per-GPU peak is what has
to fit a slice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpulens.analyzer import demand, signals
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import LABELS
from gpulens.analyzer.thresholds import Thresholds
from gpulens.catalog import CatalogError, GpuModel, get_model, model_for_nvml_name

STAT_KEYS = ("mean", "p50", "p95", "p99", "max", "count", "stddev", "idle")

PROFILE_COLUMNS = (
    "job_id",
    "instance",
    "job_source",
    "job_user",
    "job_name",
    "job_namespace",
    "job_pod",
    "job_container",
    "team",
    "gpu_model",
    "gpu_model_known",
    "gpus",
    "uuids",
    "sharing",
    "mig_profile_now",
    # the MPS thread cap it runs under now, in percent (`thread_caps_now`): NaN where not measured
    "mps_thread_cap_now_pct",
    "device_sms",
    "device_memory_bytes",
    "gpu_share",
    "start",
    "end",
    "duration_s",
    "samples",
    "coverage",
    "activity_signal",
    "sm_active_mean",
    "sm_active_p50",
    "sm_active_p95",
    "sm_active_p99",
    "sm_active_max",
    "idle_fraction",
    "burstiness",
    "active_hours",  # clock hours with activity above zero (`demand.active_hours`), of ...
    "lifetime_hours",  # ... the hours from the job's first step to its last
    "memory_signal",
    "memory_peak_bytes",
    "memory_p95_bytes",
    "memory_trend_bytes_per_hour",
    "memory_restarts",
    "memory_cycle_slope_bytes_per_hour",
    "memory_period_s",
    "dram_active_p95",
    "duty_cycle_p95",  # the time it runs kernels (`signals.BUSY`): what a time-sliced neighbour waits for
    "tensor_active_mean",
    "gpu_hours_allocated",
    "gpu_hours_used",
    "gpu_hours_idle",
)


@dataclass
class JobStats:
    """Aggregates of one job over the window (the same numbers from pandas or PromQL)."""

    start: float = math.nan
    end: float = math.nan
    samples: int = 0
    gpus: int = 0
    activity_signal: str = ""
    activity: dict[str, float] = field(default_factory=dict)  # STAT_KEYS
    memory_signal: str = ""
    memory_peak: float = math.nan
    memory_p95: float = math.nan
    memory_slope: float = math.nan  # least-squares slope of the per-step memory, bytes per second
    memory_restarts: float = (
        math.nan
    )  # steps whose memory fell under (1 - leak.restart_drop_fraction) x the last
    memory_cycle_slope: float = math.nan  # median slope of leak.cycle_window_steps windows, bytes per second
    memory_restart_span: float = math.nan  # seconds from the first restart to the last
    dram_p95: float = math.nan
    busy_p95: float = math.nan  # p95 of its per-step duty cycle (`signals.BUSY`)
    busy_signal: str = ""  # the BUSY signal it came from (the PromQL path asks its series by it)
    tensor_mean: float = math.nan
    # the MPS active-thread cap it runs under at the end of the window, a ratio (`thread_caps_now`)
    thread_cap: float = math.nan
    # per-bin maxima of the per-step activity and DRAM activity (`demand`): what the packer sums
    sm_bins: demand.Series | None = None
    dram_bins: demand.Series | None = None
    busy_bins: demand.Series | None = None


@dataclass(frozen=True)
class FleetGpu:
    """One GPU of the inventory (`gpu_info` over the window), whether or not a job ran on it."""

    uuid: str
    model: str  # catalog key (or the reported name when the catalog does not know it)
    node: str


@dataclass
class Identity:
    """The small label tables both sources produce."""

    series: pd.DataFrame  # job_id, uuid, gpu_instance, IDENTITY_LABELS
    gpus: pd.DataFrame  # uuid, model, instance
    migs: pd.DataFrame  # uuid, gpu_instance, mig_profile
    # uuid -> gpu_memory_total_bytes: the memory of a GPU whose model the catalog does not know
    memory_totals: dict[str, float] = field(default_factory=dict)


def reduce_series(
    values: np.ndarray, idle_below: float, quantiles: Sequence[float] | np.ndarray | None = None
) -> dict[str, float]:
    """The activity reductions, defined as PromQL defines them (linear quantiles, population stddev).

    `quantiles`: the p50, p95 and p99 of `values` when already computed (`segment_quantiles` does
    all jobs at once)."""
    if values.size == 0:
        return {}
    p50, p95, p99 = np.quantile(values, [0.5, 0.95, 0.99]) if quantiles is None else quantiles
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p95": float(p95),
        "p99": float(p99),
        "max": float(values.max()),
        "count": float(values.size),
        "stddev": float(values.std()),
        "idle": float((values < idle_below).mean()),
    }


def segment_quantiles(segments: Sequence[np.ndarray], qs: Sequence[float]) -> np.ndarray:
    """[len(qs), len(segments)]: np.quantile's default (linear) quantiles of each non-empty
    segment, bit for bit: the same virtual index `(n - 1) * q`, neighbours and `_lerp` (which
    interpolates from the upper neighbour when the weight is at least 0.5).

    One pass over all jobs instead of one np.quantile call each (about 150 us per call: seconds
    for 10,000 jobs); `reduce_series` stays the definition, tests check the two agree.
    """
    lengths = np.array([len(v) for v in segments], dtype=np.intp)
    out = np.empty((len(qs), len(segments)))
    if not len(segments):
        return out
    ordered = np.concatenate([np.sort(v) for v in segments]).astype(float, copy=False)
    starts = np.cumsum(lengths) - lengths
    last = lengths - 1
    for i, q in enumerate(qs):
        virtual = last * float(q)
        below = np.floor(virtual)
        top = virtual >= last  # np.quantile takes the largest value there
        prev = starts + np.where(top, last, below.astype(np.intp))
        nxt = starts + np.where(top, last, below.astype(np.intp) + 1)
        a, b = ordered[prev], ordered[nxt]
        t = virtual - below
        diff = b - a
        lerp = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
        out[i] = np.where(top, b, lerp)
    return out


def _by_family(samples: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Split the long table once by family (repeated string filters over millions of rows are slow)."""
    return {str(name): frame for name, frame in samples.groupby("metric", sort=False, observed=True)}


def _family(fams: dict[str, pd.DataFrame], name: str, like: pd.DataFrame) -> pd.DataFrame:
    return fams.get(name, like.iloc[0:0])


def _first_rows(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """Positions of the rows `frame[columns].drop_duplicates()` keeps (first of each combination).

    One int64 key from the columns' codes (re-coded when it would overflow) and one hash pass:
    pandas' multi-column duplicated widened every code column and cost seconds on 3 M rows.
    """
    key = np.zeros(len(frame), dtype=np.int64)
    bound = 1
    for column in columns:
        codes, names = _codes(frame[column])
        width = len(names) + 1  # code -1 (missing) becomes 0
        if bound * width >= 2**62:
            key, uniques = pd.factorize(key)
            key, bound = key.astype(np.int64), len(uniques)
        key = key * width + (codes.astype(np.int64) + 1)
        bound *= width
    return np.flatnonzero(~pd.Series(key).duplicated().to_numpy())


def _identity_from_samples(fams: dict[str, pd.DataFrame], like: pd.DataFrame) -> Identity:
    info = _family(fams, "gpu_job_info", like)
    cols = ["job_id", "uuid", "gpu_instance", *signals.IDENTITY_LABELS]
    # plain strings from here on: categorical order is dictionary order, not the lexical order
    # the Prometheus path sorts by
    # dedupe on the categoricals' codes first (millions of rows), then convert the few distinct rows
    series = info[cols].iloc[_first_rows(info, cols)].astype(str).drop_duplicates().reset_index(drop=True)
    gpu_info = _family(fams, "gpu_info", like).sort_values("timestamp")
    gpus = gpu_info.drop_duplicates("uuid", keep="last")[["uuid", "model", "instance"]].astype(str)
    mig_info = _family(fams, "gpu_mig_instance_info", like).sort_values("timestamp")
    migs = mig_info.drop_duplicates(["uuid", "gpu_instance"], keep="last")
    migs = migs[["uuid", "gpu_instance", "mig_profile"]].astype(str)
    totals = _family(fams, "gpu_memory_total_bytes", like)
    totals = totals[totals["value"] > 0].groupby("uuid", observed=True)["value"].max()
    memory = {str(u): float(v) for u, v in totals.items()}
    return Identity(series, gpus.reset_index(drop=True), migs.reset_index(drop=True), memory)


# a job seen with several kinds takes the one that shares most: the exporter labels a time-sliced
# GPU `exclusive` at steps where one job runs on it, and the exclusive table's device signals
# would give the job its neighbours' activity at the steps they share
_KIND_ORDER = {"shared": 0, "mig": 1, "exclusive": 2}


def job_kinds(series: pd.DataFrame) -> dict[str, str]:
    """job_id -> signal table kind, from the job's series: shared where any of them is shared,
    else MIG where any is a MIG instance, else exclusive."""
    out: dict[str, str] = {}
    for row in series[["job_id", "sharing", "gpu_instance"]].itertuples():
        kind = signals.job_kind(row.sharing, row.gpu_instance)
        if row.job_id not in out or _KIND_ORDER[kind] < _KIND_ORDER[out[row.job_id]]:
            out[row.job_id] = kind
    return dict(sorted(out.items()))


def _signal_steps(
    samples: dict[str, pd.DataFrame], info: pd.DataFrame, signal: signals.Signal, jobs: list[str], how: str
) -> pd.DataFrame:
    """Per (job_id, timestamp) value of one signal for the given jobs (NaN and negatives dropped)."""
    fam = _family(samples, signal.family, info)
    fam = fam[fam["value"] >= 0]
    if signal.scope == "job":
        rows = fam[fam["job_id"].isin(jobs)][["job_id", "timestamp", "value"]]
    elif signal.scope == "job_share":
        rows = _share_rows(samples, info, fam, signal.figure)
        rows = rows[rows["job_id"].isin(jobs)]
    elif signal.scope == "gpu_share":
        sharers = info.groupby(["uuid", "timestamp"], observed=True).size().rename("n").reset_index()
        device = fam[["uuid", "timestamp", "value"]].merge(sharers, on=["uuid", "timestamp"])
        device = device.assign(value=device["value"] / device["n"])[["uuid", "timestamp", "value"]]
        left = info[info["job_id"].isin(jobs)][["job_id", "uuid", "timestamp"]]
        rows = left.merge(device, on=["uuid", "timestamp"])[["job_id", "timestamp", "value"]]
    else:
        keys = ["uuid", "timestamp"] if signal.scope == "gpu" else ["uuid", "gpu_instance", "timestamp"]
        left = info[info["job_id"].isin(jobs)][["job_id", *keys]]
        rows = left.merge(fam[[*keys, "value"]], on=keys, how="inner")[["job_id", "timestamp", "value"]]
    if rows.empty:
        return rows
    return rows.groupby(["job_id", "timestamp"], sort=True, observed=True)["value"].agg(how).reset_index()


def _present(
    samples: dict[str, pd.DataFrame], like: pd.DataFrame, family: str, keys: list[str]
) -> pd.DataFrame:
    """The distinct `keys` of a family's valid (non-negative) samples."""
    fam = _family(samples, family, like)
    return fam[fam["value"] >= 0][keys].drop_duplicates()


def _share_rows(
    samples: dict[str, pd.DataFrame], like: pd.DataFrame, shares: pd.DataFrame, figure: str
) -> pd.DataFrame:
    """Per-job demand on a shared GPU at the steps whose GPU published the remainder and whose
    figure is `figure` (SM activity where the GPU has it at that step, else its utilization),
    on the scale of the whole GPU's figure: the job's share plus its part of the unattributed
    remainder, in proportion to its share (split equally where no job has a share that step).
    Where the figure is SM activity and a client of the GPU publishes an MPS thread cap at that
    step, the remainder goes by room under the caps instead (`_room_split`).

    So a job is measured the same way whole (it gets the whole figure) and shared (the jobs of a
    GPU add up to the figure): moving it onto a shared GPU does not read as a drop in demand, and
    the plan made from its shared weeks proposes no move back (issue 30, "a fixed point").
    `shares` holds every job's rows, not only the ones asked for: a GPU's sum needs them all.
    """
    keys = ["uuid", "gpu_instance", "timestamp"]
    rest = _family(samples, signals.UNATTRIBUTED, like)
    rest = rest[rest["value"] >= 0][[*keys, "value"]].drop_duplicates(keys).rename(columns={"value": "rest"})
    rows = shares[["job_id", *keys, "value"]].merge(rest, on=keys)
    profiled = _present(samples, like, signals.PROFILED_FIGURE, ["uuid", "timestamp"])
    marked = rows.merge(profiled, on=["uuid", "timestamp"], how="left", indicator=True)
    found = marked["_merge"] == "both"
    rows = marked[found if figure == signals.PROFILED_FIGURE else ~found]
    if rows.empty:
        return rows[["job_id", "timestamp", "value"]]
    by_step = rows.groupby(keys, observed=True, sort=False)["value"]
    total = by_step.transform("sum").to_numpy(dtype=float)
    count = by_step.transform("size").to_numpy(dtype=float)
    value = rows["value"].to_numpy(dtype=float)
    remainder = rows["rest"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(total > 0, value * (total + remainder) / total, remainder / count)
    if figure == signals.PROFILED_FIGURE:
        capped, part = _room_split(samples, like, rows)
        scaled = np.where(capped, value + part, scaled)
    return pd.DataFrame(
        {"job_id": rows["job_id"].to_numpy(), "timestamp": rows["timestamp"].to_numpy(), "value": scaled}
    )


def _room_split(
    samples: dict[str, pd.DataFrame], like: pd.DataFrame, rows: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray]:
    """(whether the row's GPU has a capped MPS client at that step, the row's part of the
    remainder there): each client's room under its cap (`signals.THREAD_CAP`; 1 where it
    publishes none, 0 for the MPS server's row), cap - share and at least 0, takes the remainder
    in proportion to it, up to the room; what no client has room for stays unattributed
    (`promexpr.capped_share_expr` mirrors it).

    Under caps the exporter gives a client at most its busy time x its cap (docs/attribution.md),
    so what the GPU did beyond its clients' bounds (a bursty neighbour read over one second) cannot
    be the capped clients': split by share, a client already at its cap took most of it and read
    as binding its cap. Only on SM activity: a cap bounds the SMs a client uses, not its time.
    """
    keys = ["uuid", "gpu_instance", "timestamp"]
    caps = _family(samples, signals.THREAD_CAP, like)
    caps = caps[caps["value"] > 0]
    if caps.empty:  # no capped client anywhere (the common case): nothing to merge
        return np.zeros(len(rows), dtype=bool), np.zeros(len(rows))
    caps = caps.groupby(["job_id", *keys], observed=True, sort=False)["value"].max().rename("cap")
    capped_steps = caps.reset_index()[keys].drop_duplicates()
    ids = rows[["job_id", *keys]].reset_index(drop=True)
    marked = ids.merge(capped_steps, on=keys, how="left", indicator=True)
    capped = (marked["_merge"] == "both").to_numpy()
    cap = ids.merge(caps.reset_index(), on=["job_id", *keys], how="left")["cap"].to_numpy(dtype=float)
    room = np.maximum(np.where(np.isnan(cap), 1.0, cap) - rows["value"].to_numpy(dtype=float), 0.0)
    room[(ids["job_id"] == signals.MPS_SERVER_JOB).to_numpy()] = 0.0  # runs no kernels of its own
    room_total = pd.Series(room).groupby([ids[k] for k in keys], observed=True, sort=False).transform("sum")
    room_total = room_total.to_numpy(dtype=float)
    remainder = rows["rest"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        part = np.where(room_total > 0, room * np.minimum(1.0, remainder / room_total), 0.0)
    return capped, part


def slope(times: np.ndarray, values: np.ndarray) -> float:
    """Least-squares slope of values over times (per second), as PromQL's `deriv` defines it:
    NaN under two samples, exactly 0 for a constant series."""
    if values.size < 2:
        return math.nan
    if np.all(values == values[0]):
        return 0.0
    x = times - times.mean()
    return float((x * (values - values.mean())).sum() / (x * x).sum())


def cycle_stats(
    segments: Sequence[tuple[np.ndarray, np.ndarray]], step_s: float, drop_fraction: float, window: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(restarts, seconds from the first restart to the last, median short-window slope per second)
    of each job's (timestamps, memory).

    What the PromQL paths compute at every step of the window, so both give the same numbers:
    - a restart is a step whose memory is under `(1 - drop_fraction)` x the larger of its own and
      the step before's (`last_over_time < bool k * max_over_time` over two steps);
    - for a job that restarts, a window is the `window` steps ending at a step with a sample (its
      samples of them, at least two); its slope is `slope` (`deriv`), and the job's figure is the
      median (linear, as `quantile_over_time(0.5, ...)`) over its windows. Short windows that hold a
      restart are a minority while a cycle is longer than twice the window, so the median is the
      growth between restarts. A job without a restart gets NaN: the growth per cycle means
      nothing there (`recommend.cycle_leak` reads it only after a restart), and the windows of
      every job's samples took ~0.8 GB for 20 M samples.
    Samples are neighbours within a window when they are less than the window (in steps) apart:
    a gap in the data is a gap in the window, as it is for the subqueries.
    """
    count = len(segments)
    restarts = np.zeros(count)
    slopes = np.full(count, math.nan)
    first, last = np.full(count, np.inf), np.full(count, -np.inf)
    if not count:
        return restarts, last - first, slopes
    _, times, values, job = _flattened(segments)
    keep = 1.0 - drop_fraction
    # a restart: the step before is of the same job, not across a gap, and held much more
    drop = np.zeros(len(values), dtype=bool)
    if len(values) > 1:
        drop[1:] = (
            (job[1:] == job[:-1])
            & (times[1:] - times[:-1] < 1.5 * step_s)
            & (values[1:] < keep * np.maximum(values[:-1], values[1:]))
        )
    restarts = np.bincount(job[drop], minlength=count).astype(float)
    np.minimum.at(first, job[drop], times[drop])
    np.maximum.at(last, job[drop], times[drop])
    span = np.where(restarts > 0, last - first, math.nan)
    restarted = np.flatnonzero(restarts > 0)
    if len(restarted):
        slopes[restarted] = _window_slopes([segments[int(j)] for j in restarted], step_s, window)
    return restarts, span, slopes


def _flattened(
    segments: Sequence[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lengths, times, values, job index per sample) of the jobs' (timestamps, memory), end to end."""
    lengths = np.array([len(v) for _, v in segments], dtype=np.intp)
    times = np.concatenate([t for t, _ in segments]).astype(float, copy=False)
    values = np.concatenate([v for _, v in segments]).astype(float, copy=False)
    return lengths, times, values, np.repeat(np.arange(len(segments)), lengths)


def _window_slopes(
    segments: Sequence[tuple[np.ndarray, np.ndarray]], step_s: float, window: int
) -> np.ndarray:
    """Each job's median least-squares slope over its `window`-step windows (`cycle_stats`)."""
    count = len(segments)
    slopes = np.full(count, math.nan)
    lengths, times, values, job = _flattened(segments)
    rows = np.arange(len(values))
    # column d: the sample d positions back, when it is of the same job and within the window
    ts = np.full((len(values), window), math.nan)
    vs = np.full((len(values), window), math.nan)
    for d in range(window):
        back = rows - d
        ok = back >= 0
        ok[ok] = (job[back[ok]] == job[ok]) & (times[ok] - times[back[ok]] < (window - 0.5) * step_s)
        ts[ok, d], vs[ok, d] = times[back[ok]], values[back[ok]]
    n = (~np.isnan(vs)).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        x = ts - np.nanmean(ts, axis=1, keepdims=True)
        y = vs - np.nanmean(vs, axis=1, keepdims=True)
        slope_of = np.nansum(x * y, axis=1) / np.nansum(x * x, axis=1)
    constant = np.nanmax(vs, axis=1) == np.nanmin(vs, axis=1)
    slope_of = np.where(constant, 0.0, slope_of)
    cuts = np.cumsum(lengths)[:-1]
    per_job = [s[ok] for s, ok in zip(np.split(slope_of, cuts), np.split(n >= 2, cuts), strict=True)]
    sampled = [j for j in range(count) if len(per_job[j])]
    if sampled:
        slopes[sampled] = segment_quantiles([per_job[j] for j in sampled], (0.5,))[0]
    return slopes


def _split_by_job(steps: pd.DataFrame) -> list[tuple[str, np.ndarray]]:
    """(job_id, values) per job of a frame sorted by job_id: slices, not a groupby per job."""
    return [(job, values) for job, _, values in _split_by_job_times(steps)]


def _split_by_job_times(steps: pd.DataFrame) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(job_id, timestamps, values) per job of a frame sorted by job_id and timestamp."""
    if steps.empty:
        return []
    keys = steps["job_id"]
    codes = (
        keys.cat.codes.to_numpy() if isinstance(keys.dtype, pd.CategoricalDtype) else pd.factorize(keys)[0]
    )
    values = steps["value"].to_numpy(dtype=float)
    times = steps["timestamp"].to_numpy(dtype=float)
    bounds = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(codes)]))
    jobs = keys.to_numpy()
    return [(str(jobs[a]), times[a:b], values[a:b]) for a, b in zip(starts, ends, strict=True)]


def _codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(integer code per row, -1 for a missing value; the values the codes stand for)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy(), column.cat.categories.to_numpy(dtype=object)
    codes, uniques = pd.factorize(column)
    return codes, np.asarray(uniques, dtype=object)


def _segments(
    job_codes: np.ndarray, job_names: np.ndarray, times: np.ndarray, values: np.ndarray
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(job_id, timestamps, values) per job of rows sorted by job code and timestamp."""
    if not len(job_codes):
        return []
    bounds = np.flatnonzero(job_codes[1:] != job_codes[:-1]) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(job_codes)]))
    return [
        (str(job_names[job_codes[a]]), times[a:b], values[a:b]) for a, b in zip(starts, ends, strict=True)
    ]


def _signal_segments(
    samples: dict[str, pd.DataFrame], info: pd.DataFrame, signal: signals.Signal, jobs: list[str], how: str
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """`_split_by_job_times(_signal_steps(...))`, with the common cases in numpy.

    A `job` or `gpu` signal is joined and sorted on integer codes, where pandas' merge and
    groupby over millions of rows cost seconds. Where a job has several rows at one step (a
    multi-GPU job, a duplicated series) and the step's value is a mean, those jobs go through
    `_signal_steps` itself, so the summation order, and so the result, is pandas' bit for bit.
    """
    if signal.scope not in ("job", "gpu"):
        return _split_by_job_times(_signal_steps(samples, info, signal, jobs, how))
    fam = _family(samples, signal.family, info)
    fam = fam[fam["value"] >= 0]
    if fam.empty:
        return []
    if signal.scope == "job":
        job_codes, job_names = _codes(fam["job_id"])
        times = fam["timestamp"].to_numpy(dtype=float)
        values = fam["value"].to_numpy(dtype=float)
    else:
        job_codes, job_names = _codes(info["job_id"])
        left_uuids, uuid_names = _codes(info["uuid"])
        right_uuids, right_names = _codes(fam["uuid"])
        # the family's uuids in the info frame's codes (-1: a GPU no job ran on)
        mapped = pd.Index(uuid_names).get_indexer(right_names)
        right_uuids = np.where(right_uuids >= 0, mapped[right_uuids], -1)
        right_times = fam["timestamp"].to_numpy(dtype=float)
        ok = right_uuids >= 0
        right_uuids, right_times = right_uuids[ok], right_times[ok]
        right_values = fam["value"].to_numpy(dtype=float)[ok]
        stamps = np.unique(right_times)
        key = right_uuids.astype(np.int64) * len(stamps) + np.searchsorted(stamps, right_times)
        order = np.argsort(key, kind="stable")
        key = key[order]
        if len(key) > 1 and (key[1:] == key[:-1]).any():  # a GPU with two series of the family
            return _split_by_job_times(_signal_steps(samples, info, signal, jobs, how))
        left_times = info["timestamp"].to_numpy(dtype=float)
        at = np.minimum(np.searchsorted(stamps, left_times), max(len(stamps) - 1, 0))
        found = (left_uuids >= 0) & (len(stamps) > 0)
        if len(stamps):
            found &= stamps[at] == left_times
        left_key = left_uuids.astype(np.int64) * len(stamps) + at
        where = np.minimum(np.searchsorted(key, left_key), max(len(key) - 1, 0))
        if len(key):
            found &= key[where] == left_key
        else:
            found[:] = False
        job_codes = job_codes[found]
        times = left_times[found]
        values = right_values[order][where[found]]
    pending = set(jobs)  # np.isin over object arrays compares every pair
    wanted = np.fromiter((str(name) in pending for name in job_names), dtype=bool, count=len(job_names))
    keep = (job_codes >= 0) & ~np.isnan(times)
    keep[keep] = wanted[job_codes[keep]]
    job_codes, times, values = job_codes[keep], times[keep], values[keep]
    order = np.lexsort((times, job_codes))
    job_codes, times, values = job_codes[order], times[order], values[order]
    same = (job_codes[1:] == job_codes[:-1]) & (times[1:] == times[:-1])
    if not same.any():
        return _segments(job_codes, job_names, times, values)
    if how != "max":
        several = np.unique(job_codes[1:][same])
        slow = {str(job_names[c]) for c in several}
        fast = ~np.isin(job_codes, several)
        done = _segments(job_codes[fast], job_names, times[fast], values[fast])
        steps = _signal_steps(samples, info, signal, sorted(slow), how)
        return done + _split_by_job_times(steps)
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    return _segments(job_codes[starts], job_names, times[starts], np.maximum.reduceat(values, starts))


def _chain_steps(
    samples: dict[str, pd.DataFrame],
    info: pd.DataFrame,
    chain: dict[str, tuple[signals.Signal, ...]],
    kinds: dict[str, str],
    how: str,
) -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    """job_id -> (signal name, per-step values, their timestamps) from the first signal of its
    chain that has data."""
    out: dict[str, tuple[str, np.ndarray, np.ndarray]] = {}
    for kind, chain_signals in chain.items():
        pending = [job for job, k in kinds.items() if k == kind]
        for signal in chain_signals:
            if not pending:
                break
            for job, times, values in _signal_segments(samples, info, signal, pending, how):
                out[job] = (signal.name, values, times)
            pending = [job for job in pending if job not in out]
    return out


def thread_caps_now(frame: pd.DataFrame | None) -> dict[str, float]:
    """job_id -> the MPS active-thread cap it runs under (`signals.THREAD_CAP`), as a ratio: each of
    its series' last sample in the window, the largest of them (what the PromQL paths ask:
    `promqueries.thread_caps`). A job without a positive one is left out.

    The cap in force, not the one a plan asked for: on Kubernetes the device plugin's control
    daemon gives every client 100/replicas whatever the client was told."""
    if frame is None or frame.empty:
        return {}
    keys = [c for c in ("job_id", "instance", "uuid", "gpu_instance") if c in frame]
    last = frame.sort_values("timestamp", kind="stable").drop_duplicates(keys, keep="last")
    last = last[last["value"] > 0]
    caps = last.groupby("job_id", observed=True)["value"].max()
    return {str(job): float(cap) for job, cap in caps.items()}


def family_columns() -> dict[str, list[str]]:
    """Family -> the label columns the file path reads from it (everything else is never loaded)."""
    signal_labels = ["job_id", "uuid", "gpu_instance"]
    out = {
        "gpu_job_info": ["job_id", "uuid", "gpu_instance", *signals.IDENTITY_LABELS],
        "gpu_info": ["uuid", "model", "instance", "gpu"],  # gpu: the index emit's files name
        "gpu_mig_instance_info": ["uuid", "gpu_instance", "mig_profile"],
        "gpu_memory_total_bytes": ["uuid"],  # the memory of models the catalog does not know
        signals.THREAD_CAP: signal_labels,
    }
    for table in (signals.ACTIVITY, signals.MEMORY, signals.DRAM, signals.BUSY, signals.TENSOR):
        for chain in table.values():
            for signal in chain:
                out.setdefault(signal.family, signal_labels)
                if signal.scope == "job_share":
                    out.setdefault(signals.UNATTRIBUTED, signal_labels)
                    out.setdefault(signals.PROFILED_FIGURE, signal_labels)
    return out


def stats_from_samples(
    samples: pd.DataFrame, thresholds: Thresholds, step_s: float
) -> tuple[Identity, dict[str, JobStats]]:
    """Reduce a history's samples to per-job aggregates (the file path; `step_s`: its step)."""
    missing = [label for label in LABELS if label not in samples]
    if missing:
        samples = samples.assign(**dict.fromkeys(missing, ""))
    return stats_from_families(_by_family(samples), thresholds, step_s, samples.iloc[0:0])


def stats_from_families(
    fams: dict[str, pd.DataFrame], thresholds: Thresholds, step_s: float, like: pd.DataFrame | None = None
) -> tuple[Identity, dict[str, JobStats]]:
    """The same reduction from per-family frames (`family_columns()` at least); `like` = empty frame."""
    if like is None:
        like = pd.DataFrame(
            {
                c: pd.Series(dtype=float if c in ("timestamp", "value") else object)
                for c in ("timestamp", "metric", "value", *LABELS)
            }
        )
    fams = dict(fams)
    samples = like
    if "gpu_job_info" in fams:
        jobs = fams["gpu_job_info"]
        fams["gpu_job_info"] = jobs[jobs["job_source"] != signals.SYSTEM_SOURCE]
    info = _family(fams, "gpu_job_info", samples)
    if info.empty:
        raise AnalyzerError("no gpu_job_info samples in the window: there are no jobs to profile")
    identity = _identity_from_samples(fams, samples)
    kinds = job_kinds(identity.series)
    idle_below = thresholds.activity.idle_below
    stats: dict[str, JobStats] = {}
    per_step = info.groupby(["job_id", "timestamp"], observed=True).size().rename("n").reset_index()
    per_job = per_step.groupby("job_id", sort=False, observed=True).agg(
        start=("timestamp", "min"), end=("timestamp", "max"), samples=("timestamp", "size"), gpus=("n", "max")
    )
    for job, start, end, samples, gpus in per_job.itertuples():
        stats[str(job)] = JobStats(start=float(start), end=float(end), samples=int(samples), gpus=int(gpus))
    activity = _chain_steps(fams, info, signals.ACTIVITY, kinds, "mean")
    quantiles = segment_quantiles([values for _, values, _ in activity.values()], (0.5, 0.95, 0.99))
    bin_s = demand.bin_seconds(step_s, per_job["start"], per_job["end"])
    for i, (job, (name, values, times)) in enumerate(activity.items()):
        stats[job].activity_signal = name
        stats[job].activity = reduce_series(values, idle_below, quantiles[:, i])
        stats[job].sm_bins = demand.binned(times, values, bin_s)
    memory = _chain_steps(fams, info, signals.MEMORY, kinds, "max")
    p95 = segment_quantiles([values for _, values, _ in memory.values()], (0.95,))[0]
    for i, (job, (name, values, times)) in enumerate(memory.items()):
        stats[job].memory_signal = name
        stats[job].memory_peak = float(values.max())
        stats[job].memory_p95 = float(p95[i])
        stats[job].memory_slope = slope(times, values)
    leak = thresholds.leak
    restarts, spans, cycle_slopes = cycle_stats(
        [(times, values) for _, values, times in memory.values()],
        step_s,
        leak.restart_drop_fraction,
        leak.cycle_window_steps,
    )
    for i, job in enumerate(memory):
        stats[job].memory_restarts = float(restarts[i])
        stats[job].memory_restart_span = float(spans[i])
        stats[job].memory_cycle_slope = float(cycle_slopes[i])  # NaN without a restart
    dram = _chain_steps(fams, info, signals.DRAM, kinds, "mean")
    p95 = segment_quantiles([values for _, values, _ in dram.values()], (0.95,))[0]
    for i, (job, (_, values, times)) in enumerate(dram.items()):
        stats[job].dram_p95 = float(p95[i])
        stats[job].dram_bins = demand.binned(times, values, bin_s)
    busy = _chain_steps(fams, info, signals.BUSY, kinds, "mean")
    p95 = segment_quantiles([values for _, values, _ in busy.values()], (0.95,))[0]
    for i, (job, (name, values, times)) in enumerate(busy.items()):
        stats[job].busy_signal = name
        stats[job].busy_p95 = float(p95[i])
        stats[job].busy_bins = demand.binned(times, values, bin_s)
    for job, (_, values, _) in _chain_steps(fams, info, signals.TENSOR, kinds, "mean").items():
        stats[job].tensor_mean = float(values.mean())
    for job, cap in thread_caps_now(fams.get(signals.THREAD_CAP)).items():
        if job in stats:
            stats[job].thread_cap = cap
    return identity, stats


def period(st: JobStats, duration: float) -> float:
    """The mean cycle of a job whose memory restarts: the time between its first and last restart
    over the cycles between them; with one restart, its run (the cycle is at least that long);
    NaN without one."""
    if not st.memory_restarts > 0:
        return math.nan
    if st.memory_restarts < 2:
        return duration
    return st.memory_restart_span / (st.memory_restarts - 1)


def fleet_from_gpus(gpus: pd.DataFrame, gpu_model: GpuModel | None = None) -> list[FleetGpu]:
    """The inventory from a uuid/model/instance table (`Identity.gpus`), one entry per uuid."""
    out: dict[str, FleetGpu] = {}
    for uuid, name, node in gpus[["uuid", "model", "instance"]].astype(str).itertuples(index=False):
        if uuid and uuid not in out:
            out[uuid] = FleetGpu(uuid, resolve_model(name, gpu_model)[0], node)
    return sorted(out.values(), key=lambda g: (g.node, g.uuid))


def fleet_catalog_models(fleet: list[FleetGpu]) -> list[GpuModel]:
    """Catalog models of the inventory (downsize targets: idle models included)."""
    models = {m for m in (model_for_nvml_name(g.model) for g in fleet) if m is not None}
    return sorted(models, key=lambda m: m.key)


def fleet_from_families(fams: dict[str, pd.DataFrame], gpu_model: GpuModel | None = None) -> list[FleetGpu]:
    """The inventory of a history: every GPU with a `gpu_info` sample in the window."""
    info = fams.get("gpu_info")
    if info is None or info.empty:
        return []
    latest = info.sort_values("timestamp").drop_duplicates("uuid", keep="last")
    return fleet_from_gpus(latest, gpu_model)


def fleet_from_samples(samples: pd.DataFrame, gpu_model: GpuModel | None = None) -> list[FleetGpu]:
    """The same from a long sample table."""
    return fleet_from_families({"gpu_info": samples[samples["metric"] == "gpu_info"]}, gpu_model)


def resolve_model(name: str, override: GpuModel | None) -> tuple[str, GpuModel | None]:
    """(model name to report, catalog model or None when gpulens does not know it)."""
    if override is not None:
        return override.key, override
    model = model_for_nvml_name(name) if name else None
    return (model.key if model else (name or "unknown")), model


def parse_model_option(name: str | None) -> GpuModel | None:
    """`--gpu-model`: a catalog model, or one clear error naming the known ones."""
    if not name:
        return None
    try:
        return get_model(name)
    except CatalogError as exc:
        raise AnalyzerError(f"--gpu-model: {exc}") from exc


def build_profiles(
    identity: Identity,
    stats: dict[str, JobStats],
    step_s: float,
    thresholds: Thresholds,
    gpu_model: GpuModel | None = None,
) -> pd.DataFrame:
    """Assemble the profile table from identity tables and aggregates (shared by both sources)."""
    series = identity.series.sort_values(["job_id", "uuid", "gpu_instance"])
    models = dict(zip(identity.gpus["uuid"], identity.gpus["model"], strict=True))
    nodes = dict(zip(identity.gpus["uuid"], identity.gpus["instance"], strict=True))
    mig_names = {
        (u, g): p
        for u, g, p in identity.migs[["uuid", "gpu_instance", "mig_profile"]].itertuples(index=False)
    }
    shared_rows = series[series["sharing"].isin(["mps", "time_slicing", "time-slicing"])]
    sharers = shared_rows.groupby("uuid")["job_id"].nunique().to_dict()
    rows = []
    # plain lists and one pass over job boundaries: a groupby with a row Series per job cost
    # seconds for 10,000 jobs; the series are sorted by job_id, so a job's rows are contiguous
    # and its first row is the one the sort puts first (the sort is stable)
    columns = {c: series[c].to_list() for c in ("job_id", "uuid", "gpu_instance", *signals.IDENTITY_LABELS)}
    job_ids = columns["job_id"]
    cuts = [i for i in range(1, len(job_ids)) if job_ids[i] != job_ids[i - 1]]
    for a, b in zip([0, *cuts], [*cuts, len(job_ids)], strict=True):
        job_id = str(job_ids[a])
        if job_id not in stats:
            continue
        st = stats[job_id]
        # the series that shares most gives the job's mode (as `job_kinds` chooses its table): a
        # job alone on a GPU until a neighbour arrived is labelled exclusive at its first steps
        top = min(
            range(a, b),
            key=lambda k: _KIND_ORDER[signals.job_kind(columns["sharing"][k], columns["gpu_instance"][k])],
        )
        first = {c: values[top] for c, values in columns.items()}
        uuids = columns["uuid"][a:b]
        kind = signals.job_kind(first["sharing"], first["gpu_instance"])
        sharing = first["sharing"] or ("mig" if kind == "mig" else "exclusive")
        model_name, model = resolve_model(models.get(first["uuid"], ""), gpu_model)
        mig_now = mig_names.get((first["uuid"], first["gpu_instance"]), "") if kind == "mig" else ""
        device_sms = model.sm_count if model else math.nan
        device_memory = model.memory_bytes if model else identity.memory_totals.get(first["uuid"], math.nan)
        share = 1.0
        slice_fraction = 1.0
        if kind == "mig" and model is not None and mig_now:
            try:
                profile = model.mig_profile(mig_now)
                device_sms, device_memory = profile.sm_count, profile.memory_bytes
                slice_fraction = profile.compute_slices / model.compute_slices
                share = slice_fraction
            except CatalogError:
                pass
        elif kind == "shared":
            share = 1.0 / max(1, max(sharers.get(u, 1) for u in uuids))
        act = st.activity
        expected = round((st.end - st.start) / step_s) + 1 if st.samples else 0
        coverage = min(1.0, act.get("count", 0.0) / expected) if expected else 0.0
        duration = (st.end - st.start + step_s) if st.samples else 0.0
        gpus = max(st.gpus, 1)
        hours_alloc = gpus * share * duration / 3600.0
        mean = act.get("mean", math.nan)
        hours_used = gpus * slice_fraction * duration / 3600.0 * mean if not math.isnan(mean) else math.nan
        if not math.isnan(hours_used):
            hours_used = min(hours_used, hours_alloc) if kind != "shared" else hours_used
        burst = act["stddev"] / act["mean"] if act and act["mean"] > 0 else (0.0 if act else math.nan)
        node = first["instance"] or nodes.get(first["uuid"], "")
        rows.append(
            {
                "job_id": job_id,
                "instance": node,
                "job_source": first["job_source"],
                "job_user": first["job_user"],
                "job_name": first["job_name"],
                "job_namespace": first["job_namespace"],
                "job_pod": first["job_pod"],
                "job_container": first["job_container"],
                "team": first["job_namespace"] or first["job_user"] or "unknown",
                "gpu_model": model_name,
                "gpu_model_known": model is not None,
                "gpus": gpus,
                "uuids": ",".join(sorted(set(uuids))),
                "sharing": sharing.replace("_", "-"),
                "mig_profile_now": mig_now,
                "mps_thread_cap_now_pct": 100.0 * st.thread_cap,
                "device_sms": device_sms,
                "device_memory_bytes": device_memory,
                "gpu_share": share,
                "start": st.start,
                "end": st.end,
                "duration_s": duration,
                "samples": st.samples,
                "coverage": coverage,
                "activity_signal": st.activity_signal or "none",
                "sm_active_mean": mean,
                "sm_active_p50": act.get("p50", math.nan),
                "sm_active_p95": act.get("p95", math.nan),
                "sm_active_p99": act.get("p99", math.nan),
                "sm_active_max": act.get("max", math.nan),
                "idle_fraction": act.get("idle", math.nan),
                "burstiness": burst,
                "memory_signal": st.memory_signal or "none",
                "memory_peak_bytes": st.memory_peak,
                "memory_p95_bytes": st.memory_p95,
                "memory_trend_bytes_per_hour": st.memory_slope * 3600.0,
                "memory_restarts": st.memory_restarts,
                "memory_cycle_slope_bytes_per_hour": st.memory_cycle_slope * 3600.0,
                "memory_period_s": period(st, duration),
                "dram_active_p95": st.dram_p95,
                "duty_cycle_p95": st.busy_p95,
                "tensor_active_mean": st.tensor_mean,
                "gpu_hours_allocated": hours_alloc,
                "gpu_hours_used": hours_used,
                "gpu_hours_idle": max(0.0, hours_alloc - hours_used)
                if not math.isnan(hours_used)
                else hours_alloc,
            }
        )
    frame = pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))
    if frame.empty:
        raise AnalyzerError("no job has samples in the window: nothing to profile")
    series = job_demand(stats, step_s)
    hours = [demand.active_hours(series.sm.get(job), series.bin_s) for job in frame["job_id"]]
    frame["active_hours"] = [float(h.active) if h else math.nan for h in hours]
    frame["lifetime_hours"] = [float(h.hours) if h else math.nan for h in hours]
    return demand.attach(frame, series)


def job_demand(stats: dict[str, JobStats], step_s: float) -> demand.Demand:
    """The jobs' per-bin series (`demand`), as both sources handed them over."""
    return demand.Demand(
        demand.bin_seconds(step_s, (st.start for st in stats.values()), (st.end for st in stats.values())),
        sm={job: st.sm_bins for job, st in stats.items() if st.sm_bins is not None},
        dram={job: st.dram_bins for job, st in stats.items() if st.dram_bins is not None},
        busy={job: st.busy_bins for job, st in stats.items() if st.busy_bins is not None},
    )


def profiles_from_samples(
    samples: pd.DataFrame, step_s: float, thresholds: Thresholds, gpu_model: GpuModel | None = None
) -> pd.DataFrame:
    """The file path end to end: samples -> profile table."""
    identity, stats = stats_from_samples(samples, thresholds, step_s)
    return build_profiles(identity, stats, step_s, thresholds, gpu_model)


def profiles_from_families(
    fams: dict[str, pd.DataFrame], step_s: float, thresholds: Thresholds, gpu_model: GpuModel | None = None
) -> pd.DataFrame:
    """The file path from per-family frames (`read_history(families=family_columns())`)."""
    identity, stats = stats_from_families(fams, thresholds, step_s)
    return build_profiles(identity, stats, step_s, thresholds, gpu_model)
