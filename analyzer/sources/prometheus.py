"""Profiles from a Prometheus-compatible HTTP API, aggregated inside PromQL.

The analyzer never pulls raw samples: per-job reductions (`avg_over_time`, `quantile_over_time`,
`max_over_time`, `stddev_over_time`, `count_over_time`) run over subqueries of per-step job
aggregates, for chunks of jobs at a time (a `job_id=~"a|b|..."` matcher), so the cost scales
with the TSDB. Signals and reductions are the ones `profile.stats_from_samples` computes with
pandas (`signals.py` is shared), so both paths give the same profile for the same data.

Works with Prometheus, Thanos, Mimir and VictoriaMetrics through `promclient.PromClient`. A run's
queries overlap where one does not need another's answer: identity, the rules' coverage and the
rule path's presence counts are asked together (`PromClient.ask`), the reductions as soon as the
job kinds are known.
"""

from __future__ import annotations

import enum
import math
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import pandas as pd

from gpulens.analyzer import demand, signals
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.profile import (
    STAT_KEYS,
    FleetGpu,
    Identity,
    JobStats,
    build_profiles,
    fleet_from_gpus,
    job_kinds,
)
from gpulens.analyzer.sources import promqueries, rules
from gpulens.analyzer.sources.promclient import PromClient, sample_value
from gpulens.analyzer.sources.promexpr import signal_expr
from gpulens.analyzer.thresholds import Leak, Thresholds
from gpulens.analyzer.topology import LABELS as TOPOLOGY_LABELS
from gpulens.analyzer.topology import Topology
from gpulens.analyzer.topology import from_rows as topology_from_rows
from gpulens.catalog import GpuModel

# a stats query repeats the job matcher ~7 times; VictoriaMetrics rejects queries over 16 KiB by default
# the per-job figures whose per-bin series the packer sums (`demand`): activity, DRAM, duty cycle
DEMAND_TABLES = ("activity", "dram", "busy")
MAX_REGEX_CHARS = 1800
# a longer stats query is asked in parts (`stats_queries`), with room left for the URL's other fields
MAX_QUERY_CHARS = 15_000
# a shared job's demand (`share_expr`) has the job matcher once and the device matcher up to 19
# times (the split by room under MPS caps) where other signals have them once and twice: its
# chunks get a tenth of the budget
SHARED_REGEX_CHARS = MAX_REGEX_CHARS // 10


def _regex(jobs: list[str]) -> str:
    """An RE2 alternation that matches exactly these job ids, escaped for a PromQL string."""
    special = set("\\.+*?()|[]{}^$")
    escaped = ["".join("\\" + c if c in special else c for c in job) for job in jobs]
    return "|".join(escaped).replace("\\", "\\\\").replace('"', '\\"')


def chunk_jobs(
    jobs: list[str],
    size: int,
    max_regex_chars: int = MAX_REGEX_CHARS,
    gpus_of: dict[str, list[str]] | None = None,
) -> list[list[str]]:
    """Chunks of at most `size` jobs whose matchers stay short enough for every store's query limit.

    With `gpus_of` (job -> its GPU uuids) the uuid matcher a chunk needs counts against the same
    length budget: device series are selected by uuid, so co-located jobs (in order) share it.
    """
    chunks: list[list[str]] = []
    current: list[str] = []
    seen: set[str] = set()
    length = 0
    for job in jobs:
        new = [u for u in (gpus_of or {}).get(job, []) if u not in seen]
        cost = len(_regex([job])) + 1 + sum(len(_regex([u])) + 1 for u in new)
        if current and (len(current) >= size or length + cost > max_regex_chars):
            chunks.append(current)
            current, length, seen = [], 0, set()
            new = list((gpus_of or {}).get(job, []))
            cost = len(_regex([job])) + 1 + sum(len(_regex([u])) + 1 for u in new)
        current.append(job)
        seen.update(new)
        length += cost
    if current:
        chunks.append(current)
    return chunks


def cycle_reductions(
    step_s: float, drop_fraction: float, window: int, series: str, now: str, steps: str
) -> dict[str, str]:
    """The restarts and the median short-window slope of a memory series (`profile.cycle_stats`).

    `series` is a range-selectable form of the per-step memory (`({inner})` plus `[range:step]` on
    the raw path, a recorded series plus `[range]` on the rule path: `{range}` stands for the
    range), `now` the job's value at the step itself (only windows that end at a sample count),
    `steps` the placeholder of the window's steps (`{window}` raw, `{sub}` rules): the figures are
    reduced over every step of the window. Ranges are whole steps less 1 ms: they hold exactly that
    many steps on every engine (Prometheus 2 ranges include their start).
    """
    step_ms = round(step_s * 1000)
    two = series.replace("{range}", f"{2 * step_ms - 1}ms")
    span = series.replace("{range}", f"{window * step_ms - 1}ms")
    keep = 1.0 - drop_fraction
    # the steps of restarts, as times (the rule path's are one interval later: the span is the same)
    at = f"timestamp(last_over_time({two}) < {keep!r} * max_over_time({two}))[{steps}]"
    return {
        "restarts": f"sum_over_time((last_over_time({two}) < bool {keep!r} * max_over_time({two}))[{steps}])",
        "restart_span": f"max_over_time({at}) - min_over_time({at})",
        "cycle_slope": f"quantile_over_time(0.5, (deriv({span}) and {now})[{steps}])",
    }


def _stats_query(reductions: dict[str, str], inner: str, window: str) -> str:
    """One query returning several reductions of `inner`, told apart by a `stat` label."""
    return " or ".join(_stat_parts(reductions, inner, window))


def _stat_parts(reductions: dict[str, str], inner: str, window: str) -> list[str]:
    parts = []
    for stat, template in reductions.items():
        expr = template.format(sub=f"({inner})[{window}]", inner=inner, window=window)
        parts.append(f'label_replace({expr}, "stat", "{stat}", "", "")')
    return parts


def stats_queries(reductions: dict[str, str], inner: str, window: str) -> list[str]:
    """`_stats_query` cut into as few queries as keep each under `MAX_QUERY_CHARS` (a reduction
    longer than that alone goes as it is): a shared job's demand (`share_expr`) is long enough
    that its eight activity reductions together passed VictoriaMetrics' limit."""
    queries: list[list[str]] = []
    length = 0
    for part in _stat_parts(reductions, inner, window):
        if queries and length + len(" or ") + len(part) <= MAX_QUERY_CHARS:
            queries[-1].append(part)
            length += len(" or ") + len(part)
        else:
            queries.append([part])
            length = len(part)
    return [" or ".join(parts) for parts in queries]


def demand_query(per_bin: str, bin_s: float, at: float, since: float) -> tuple[str, float]:
    """(expression, evaluation time) of the per-bin maxima of a per-step series (`demand`): the
    subquery `[range:bin]` steps are multiples of the bin, as the file path's bin edges, from the
    first after `since` to the first at or after `at`. `per_bin` is the maximum over one bin
    ending at the subquery's step."""
    until = math.ceil(at / bin_s - 1e-9) * bin_s
    span_ms = round((until - since) * 1000) - 1  # Prometheus 2 ranges include their start
    return f"({per_bin})[{span_ms}ms:{int(bin_s)}s]", until


def binned_answer(result: list[dict[str, Any]], bin_s: float, shift: float = 0.0) -> dict[str, demand.Series]:
    """job_id -> its series from a `demand_query` answer (a point at t stands for the bin ending
    at t - `shift`)."""
    out: dict[str, demand.Series] = {}
    for item in result:
        points = np.array(item["values"], dtype=float).reshape(-1, 2)
        keep = points[:, 1] >= 0  # NaN and negatives dropped, as the per-step series drop them
        series = demand.binned(points[keep, 0] - shift, points[keep, 1], bin_s)
        if series is not None:
            out[item["metric"].get("job_id", "")] = series
    return out


def _by_job(result: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for item in result:
        job = item["metric"].get("job_id", "")
        out.setdefault(job, {})[item["metric"].get("stat", "")] = sample_value(item)
    return out


class Aggregation(enum.StrEnum):
    """Where the per-step job aggregates come from."""

    AUTO = "auto"  # the recording rules when they cover the window, else raw
    RULES = "rules"  # `rules.py` series, reduced with *_over_time
    RAW = "raw"  # joins of raw series evaluated in subqueries at query time


@dataclass
class PromSource:
    """Profiles for `window_s` seconds ending at `end`, aggregated at `step_s` resolution."""

    client: PromClient
    window_s: float
    end: float
    step_s: float
    chunk_size: int = 200
    progress: TextIO | None = None
    # chunks of the raw path in flight at once; the rule path's queries (and every query asked
    # ahead) run `client.config.in_flight` at a time
    concurrency: int = 4
    aggregation: Aggregation = Aggregation.AUTO
    step_given: bool = True  # False: `step_s` is only the default, the rules' interval may replace it
    log: TextIO | None = field(default_factory=lambda: sys.stderr)  # the one line saying which path ran
    used: Aggregation | None = None  # the path the last `profiles` call took (RULES or RAW)
    used_reason: str = ""
    used_step_s: float = math.nan  # the step the last `profiles` call aggregated at
    _answers: dict[tuple[str, float], list[dict[str, Any]]] = field(
        default_factory=dict, init=False, repr=False
    )

    @property
    def window(self) -> str:
        return f"{int(self.window_s)}s:{int(self.step_s)}s"

    def _say(self, message: str) -> None:
        if self.progress is not None:
            print(f"gpulens: {message}", file=self.progress, flush=True)

    def _labels(self, family: str, keys: list[str]) -> pd.DataFrame:
        expr = promqueries.labels(family, self.window_s)
        # identity, fleet and gpu_rows all read gpu_info's labels over the same window: asked once
        key = (expr, self.end)  # the window is in the expression; the end is not
        if key not in self._answers:
            self._answers[key] = self.client.query(expr, self.end)
        result = self._answers[key]
        rows = [{k: item["metric"].get(k, "") for k in keys} for item in result]
        return pd.DataFrame(rows, columns=keys)

    def identity(self) -> Identity:
        series = self._labels(
            promqueries.JOB_INFO,
            ["job_id", "uuid", "gpu_instance", *signals.IDENTITY_LABELS],
        )
        if series.empty:
            raise AnalyzerError(
                f"{self.client.base}: no gpu_job_info series in the {int(self.window_s)} s window ending at "
                f"{self.end:.0f}: no jobs to profile (check --window/--end and that the exporter is scraped)"
            )
        series = series.drop_duplicates().reset_index(drop=True)
        gpus = self._labels(promqueries.GPU_INFO, ["uuid", "model", "instance"]).drop_duplicates("uuid")
        migs = self._labels(promqueries.MIG_INFO, ["uuid", "gpu_instance", "mig_profile"])
        migs = migs.drop_duplicates(["uuid", "gpu_instance"])
        totals = self.client.query(promqueries.memory_totals(self.window_s), self.end)
        memory = {item["metric"].get("uuid", ""): sample_value(item) for item in totals}
        memory = {u: v for u, v in memory.items() if u and v > 0}
        return Identity(series, gpus.reset_index(drop=True), migs.reset_index(drop=True), memory)

    def _chain(
        self,
        chain: tuple[signals.Signal, ...],
        jobs: list[str],
        how: str,
        reductions: dict[str, str],
        gpus_of: dict[str, list[str]],
    ) -> dict[str, tuple[str, dict[str, float]]]:
        out: dict[str, tuple[str, dict[str, float]]] = {}
        pending = list(jobs)
        for signal in chain:
            if not pending:
                break
            uuids = sorted({u for job in pending for u in gpus_of.get(job, [])})
            inner = signal_expr(signal, _regex(pending), how, _regex(uuids))
            for job, values in self._ask_stats(reductions, inner).items():
                if job in pending and values.get("count", 1) > 0:
                    out[job] = (signal.name, values)
            pending = [j for j in pending if j not in out]
        return out

    def _cycles(
        self,
        chain: tuple[signals.Signal, ...],
        chosen: dict[str, tuple[str, dict[str, float]]],
        leak: Leak,
        gpus_of: dict[str, list[str]],
    ) -> dict[str, dict[str, float]]:
        """Restarts and per-cycle growth of each job's memory signal (`cycle_reductions`): asked
        apart from the other memory reductions, whose query would repeat the job matcher past
        VictoriaMetrics' query length limit. The growth only matters for a job that restarts
        (`recommend.cycle_leak`), so it is asked after the restarts, for those jobs alone: each
        reduction is a subquery of the per-step join at every step of the window."""
        reductions = cycle_reductions(
            self.step_s,
            leak.restart_drop_fraction,
            leak.cycle_window_steps,
            f"({{inner}})[{{range}}:{int(self.step_s)}s]",
            "({inner})",
            "{window}",
        )
        slope = {"cycle_slope": reductions.pop("cycle_slope")}
        out: dict[str, dict[str, float]] = {}
        for signal in chain:
            jobs = [job for job, (name, _) in chosen.items() if name == signal.name]
            for stage in (reductions, slope):
                if not jobs:
                    break
                uuids = sorted({u for job in jobs for u in gpus_of.get(job, [])})
                inner = signal_expr(signal, _regex(jobs), "max", _regex(uuids))
                for job, values in self._ask_stats(stage, inner).items():
                    if job in jobs:
                        out.setdefault(job, {}).update(values)
                jobs = [job for job in jobs if out.get(job, {}).get("restarts", 0.0) > 0]
        return out

    def _ask_stats(self, reductions: dict[str, str], inner: str) -> dict[str, dict[str, float]]:
        """job_id -> stat -> value of `reductions` over `inner`, in one query or a few
        (`stats_queries`)."""
        out: dict[str, dict[str, float]] = {}
        for query in stats_queries(reductions, inner, self.window):
            for job, values in _by_job(self.client.query(query, self.end)).items():
                out.setdefault(job, {}).update(values)
        return out

    def _chunk_stats(
        self, kind: str, jobs: list[str], gpus_of: dict[str, list[str]], idle: float, leak: Leak
    ) -> dict[str, JobStats]:
        """All aggregates of one chunk of jobs of one kind (five to a dozen queries)."""
        activity_red = {
            "mean": "avg_over_time({sub})",
            "p50": "quantile_over_time(0.5, {sub})",
            "p95": "quantile_over_time(0.95, {sub})",
            "p99": "quantile_over_time(0.99, {sub})",
            "max": "max_over_time({sub})",
            "count": "count_over_time({sub})",
            "stddev": "stddev_over_time({sub})",
            "idle": f"avg_over_time(({{inner}} < bool {idle!r})[{{window}}])",
        }
        memory_red = {
            "max": "max_over_time({sub})",
            "p95": "quantile_over_time(0.95, {sub})",
            "count": "count_over_time({sub})",
            "slope": "deriv({sub})",  # least-squares slope per second, as profile.slope
        }
        presence_red = {
            "start": "min_over_time(timestamp({inner})[{window}])",
            "end": "max_over_time(timestamp({inner})[{window}])",
            "samples": "count_over_time({sub})",
            "gpus": "max_over_time({sub})",
        }
        stats: dict[str, JobStats] = {}
        regex = _regex(jobs)
        presence = f'count by (job_id) (gpu_job_info{{job_id=~"{regex}"}})'
        for job, values in _by_job(
            self.client.query(_stats_query(presence_red, presence, self.window), self.end)
        ).items():
            if job in jobs and values.get("samples", 0) > 0:
                stats[job] = JobStats(
                    start=values["start"],
                    end=values["end"],
                    samples=int(values["samples"]),
                    gpus=int(values["gpus"]),
                )
        present = [j for j in jobs if j in stats]
        for job, (name, values) in self._chain(
            signals.ACTIVITY[kind], present, "avg", activity_red, gpus_of
        ).items():
            stats[job].activity_signal = name
            stats[job].activity = {k: values.get(k, math.nan) for k in STAT_KEYS}
        memory = self._chain(signals.MEMORY[kind], present, "max", memory_red, gpus_of)
        for job, (name, values) in memory.items():
            stats[job].memory_signal = name
            stats[job].memory_peak = values.get("max", math.nan)
            stats[job].memory_p95 = values.get("p95", math.nan)
            stats[job].memory_slope = values.get("slope", math.nan)
        for job, values in self._cycles(signals.MEMORY[kind], memory, leak, gpus_of).items():
            stats[job].memory_restarts = values.get("restarts", math.nan)
            stats[job].memory_cycle_slope = values.get("cycle_slope", math.nan)
            stats[job].memory_restart_span = values.get("restart_span", math.nan)
        dram_red = {"p95": "quantile_over_time(0.95, {sub})", "count": "count_over_time({sub})"}
        for job, (_, values) in self._chain(signals.DRAM[kind], present, "avg", dram_red, gpus_of).items():
            stats[job].dram_p95 = values.get("p95", math.nan)
        for job, (name, values) in self._chain(signals.BUSY[kind], present, "avg", dram_red, gpus_of).items():
            stats[job].busy_p95 = values.get("p95", math.nan)
            stats[job].busy_signal = name
        tensor_red = {"mean": "avg_over_time({sub})", "count": "count_over_time({sub})"}
        for job, (_, values) in self._chain(
            signals.TENSOR[kind], present, "avg", tensor_red, gpus_of
        ).items():
            stats[job].tensor_mean = values.get("mean", math.nan)
        return stats

    def stats(self, identity: Identity, thresholds: Thresholds) -> dict[str, JobStats]:
        """Per-job aggregates, chunk by chunk, `concurrency` chunks in flight at a time.

        Jobs are ordered by their first GPU before chunking, so a chunk's jobs share few GPUs and
        the device side of each join (selected by uuid) stays small.
        """
        kinds = job_kinds(identity.series)
        idle = thresholds.activity.idle_below
        ordered = identity.series.sort_values(["uuid", "gpu_instance", "job_id"])
        gpus_of: dict[str, list[str]] = {}
        for job, uuid in ordered[["job_id", "uuid"]].itertuples(index=False):
            if uuid not in gpus_of.setdefault(job, []):
                gpus_of[job].append(uuid)
        chunks = [
            (kind, chunk)
            for kind in ("exclusive", "mig", "shared")
            for chunk in chunk_jobs(
                [j for j in gpus_of if kinds.get(j) == kind],
                self.chunk_size,
                SHARED_REGEX_CHARS if kind == "shared" else MAX_REGEX_CHARS,
                gpus_of=gpus_of,
            )
        ]
        stats: dict[str, JobStats] = {}
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            futures = {
                pool.submit(self._chunk_stats, kind, jobs, gpus_of, idle, thresholds.leak): (kind, len(jobs))
                for kind, jobs in chunks
            }
            try:
                for done, future in enumerate(as_completed(futures), start=1):
                    stats.update(future.result())
                    kind, size = futures[future]
                    self._say(f"prometheus: chunk {done}/{len(chunks)} done: {size} {kind} jobs")
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
            # the bins need every job's span: asked once the chunks' stats are in
            bin_s = demand.bin_seconds(
                self.step_s, (st.start for st in stats.values()), (st.end for st in stats.values())
            )
            asked = [
                pool.submit(self._chunk_demand, kind, [j for j in jobs if j in stats], gpus_of, stats, bin_s)
                for kind, jobs in chunks
            ]
            for answer in asked:
                answer.result()
        return dict(sorted(stats.items()))

    def _chunk_demand(
        self,
        kind: str,
        jobs: list[str],
        gpus_of: dict[str, list[str]],
        stats: dict[str, JobStats],
        bin_s: float,
    ) -> None:
        """The chunk's per-bin activity and DRAM activity (`demand`), each job from the signal its
        reductions came from: one subquery per signal, steps of the window only."""
        step = int(self.step_s)
        since = self.end - self.window_s
        tables = (
            ("sm", signals.ACTIVITY[kind], lambda st, name: st.activity_signal == name),
            ("dram", signals.DRAM[kind], lambda st, name: not math.isnan(st.dram_p95)),
            ("busy", signals.BUSY[kind], lambda st, name: st.busy_signal == name),
        )
        for figure, chain, uses in tables:
            for signal in chain:
                wanted = [j for j in jobs if uses(stats[j], signal.name)]
                if not wanted:
                    continue
                uuids = sorted({u for job in wanted for u in gpus_of.get(job, [])})
                inner = signal_expr(signal, _regex(wanted), "avg", _regex(uuids))
                if bin_s > self.step_s:  # a bin of several steps takes none from outside the window
                    within = f"(vector(time()) > {since!r}) and on() (vector(time()) <= {self.end!r})"
                    inner = f"({inner}) and on() {within}"
                per_bin = f"max_over_time(({inner})[{round(bin_s * 1000) - 1}ms:{step}s])"
                expr, at = demand_query(per_bin, bin_s, self.end, since)
                for job, series in binned_answer(self.client.query_matrix(expr, at), bin_s).items():
                    if job in wanted:
                        if figure == "sm":
                            stats[job].sm_bins = series
                        elif figure == "dram":
                            stats[job].dram_bins = series
                        else:
                            stats[job].busy_bins = series

    def fleet(self, gpu_model: GpuModel | None = None) -> list[FleetGpu]:
        """Every GPU with a `gpu_info` series in the window, idle ones included."""
        return fleet_from_gpus(self._labels(promqueries.GPU_INFO, ["uuid", "model", "instance"]), gpu_model)

    def gpu_rows(self) -> list[dict[str, Any]]:
        """One row per GPU of `gpu_info` in the window (uuid, model, instance and the `gpu` index
        label): the inventory emit and the report name node/GPU from, as the file path's rows."""
        frame = self._labels(promqueries.GPU_INFO, ["uuid", "model", "instance", "gpu"])
        frame = frame[frame["uuid"] != ""].drop_duplicates("uuid", keep="last")
        rows: list[dict[str, Any]] = frame.astype(str).to_dict("records")
        return rows

    def topology(self) -> Topology:
        """The GPU topology (`gpu_topology_info` over the window, one query): the same labels the
        file path reads from a history; empty where the exporter does not publish it."""
        frame = self._labels(promqueries.TOPOLOGY_INFO, list(TOPOLOGY_LABELS))
        frame = frame[frame["uuid"] != ""].drop_duplicates(["uuid", "peer_uuid"], keep="last")
        return topology_from_rows(frame.astype(str).to_dict("records"))

    def ask_first(self) -> None:
        """Ask the queries every run starts with ahead (the CLI does it before its imports)."""
        promqueries.ask_first(self.client, self.window_s, self.end, self.aggregation is not Aggregation.RAW)

    def profiles(self, thresholds: Thresholds, gpu_model: GpuModel | None = None) -> pd.DataFrame:
        self.ask_first()
        # the coverage answer comes first (it is quick): the rule path's presence counts then run
        # beside identity; the path is said (or refused) after identity, whose "no jobs in the
        # window" comes first
        coverage, reason = self._path()
        rule_stats = RuleStats(self, coverage) if coverage is not None else None
        if rule_stats is not None:
            rule_stats.ask_presence()
        identity = self.identity()
        self._take(coverage, reason)
        if rule_stats is not None:
            stats = rule_stats.stats(identity, thresholds)
            step = rule_stats.step_s
        else:
            stats = self.stats(identity, thresholds)
            step = self.step_s
        self.used_step_s = step
        self._thread_caps(stats)
        return build_profiles(identity, stats, step, thresholds, gpu_model)

    def _thread_caps(self, stats: dict[str, JobStats]) -> None:
        """Each job's MPS thread cap at the window's end (`promqueries.thread_caps`, asked ahead
        with the identity): one query on either path."""
        for item in self.client.query(promqueries.thread_caps(self.window_s), self.end):
            job, cap = item["metric"].get("job_id", ""), sample_value(item)
            if job in stats and cap > 0:
                stats[job].thread_cap = cap

    def choose_path(self) -> RuleCoverage | None:
        """The recording rules' coverage when their path is taken, else None (raw); logs the choice."""
        coverage, reason = self._path()
        self._take(coverage, reason)
        return coverage

    def _path(self) -> tuple[RuleCoverage | None, str]:
        """The rules' coverage when their path would be taken (else None), and why."""
        if self.aggregation is Aggregation.RAW:
            return None, "--aggregation raw"
        coverage, reason = rule_coverage(self.client, self.window_s, self.end)
        if coverage is not None and self.step_given and abs(coverage.interval_s - self.step_s) > 1e-6:
            reason = (
                f"the analyzer rules evaluate every {coverage.interval_s:g} s but --step is {self.step_s:g} s"
            )
            coverage = None
        return coverage, reason

    def _take(self, coverage: RuleCoverage | None, reason: str) -> None:
        """Record and log the path; `--aggregation rules` without coverage is an error."""
        if coverage is None and self.aggregation is Aggregation.RULES:
            raise AnalyzerError(f"{self.client.base}: --aggregation rules: {reason}")
        self.used = Aggregation.RULES if coverage is not None else Aggregation.RAW
        self.used_reason = reason
        if coverage is not None:
            message = (
                f"prometheus: reading the analyzer recording rules ({reason}); step {coverage.interval_s:g} s"
            )
        else:
            message = (
                f"prometheus: joining raw series at query time (slower; {reason}); step {self.step_s:g} s"
            )
        if self.log is not None:
            print(f"gpulens: {message}", file=self.log, flush=True)


@dataclass(frozen=True)
class RuleCoverage:
    """The heartbeat of the analyzer rules in a window: first and last evaluation, interval."""

    first: float
    last: float
    interval_s: float
    # the threshold the `_idle` series were recorded with over the whole window; NaN: not recorded
    # (rules from before them, deployed within the window, or thresholds changed within it)
    idle_below: float = math.nan
    # the same for the restart twins' `leak.restart_drop_fraction`
    restart_drop: float = math.nan

    @property
    def offset_s(self) -> float:
        """Where in each interval the group evaluates (Prometheus: a hash of group name and file)."""
        offset = round(self.last % self.interval_s, 3)
        return 0.0 if offset >= self.interval_s else offset

    def query_time(self, end: float) -> float:
        """When to evaluate the rule-path queries so they take the evaluations of the raw path's steps.

        The raw path reduces the steps (multiples of the interval) in (end - W, end]; the evaluation
        for step t happens at t + offset. At the next multiple of the interval after the last step
        (the last step itself when the offset is 0), a range of W holds exactly those evaluations,
        and so do the one-interval windows of a subquery at that step.
        """
        last_step = math.floor(end / self.interval_s) * self.interval_s
        return last_step + (self.interval_s if self.offset_s > 0 else 0.0)


def _recorded_throughout(values: dict[str, float], twin: str) -> float:
    """The threshold a twin's series (`idle`, `restart`) was recorded with: counted when recorded at
    every evaluation of the window with one value, else NaN (its reductions keep the subquery)."""
    low = values.get(f"{twin}_min", math.nan)
    if values.get(f"{twin}_evaluations") != values.get("evaluations") or values.get(f"{twin}_max") != low:
        return math.nan
    return low


def rule_coverage(client: PromClient, window_s: float, end: float) -> tuple[RuleCoverage | None, str]:
    """Whether the analyzer rules ran over the whole window (and every job in it), with the reason.

    The heartbeat (`rules.HEARTBEAT`, valued with its evaluation time) gives the first and last
    evaluation in the window; the interval is the median spacing of two consecutive evaluations
    (`idelta`, sampled hourly), so a missed evaluation, or a hand-over between two Prometheus
    evaluating at different offsets, does not change it. The rules cover the window
    when they ran from its first step to its last, or when no job existed before they started.
    """
    hb = rules.HEARTBEAT
    answer = client.query(promqueries.coverage(window_s), end)
    values = {item["metric"].get("stat", ""): sample_value(item) for item in answer}
    first, last, interval = (values.get(k, math.nan) for k in ("first", "last", "interval"))
    # the idle series count when recorded at every evaluation of the window, with one threshold
    idle_below, restart_drop = _recorded_throughout(values, "idle"), _recorded_throughout(values, "restart")
    if math.isnan(first) or math.isnan(last):
        return (
            None,
            f"no {hb} series in the window: the analyzer rules (alerts/{rules.RULE_FILE}) are not deployed",
        )
    if math.isnan(interval) or interval <= 0:
        return None, f"{hb} has fewer than two evaluations in any hour of the window"
    interval = float(round(interval))
    slack = 1.5 * interval
    if end - last > slack:
        return None, f"the analyzer rules stopped at {last:.0f}, {end - last:.0f} s before the window's end"
    start = end - window_s
    if first - start > slack:
        # rules deployed inside the window: fine only if no job ran before they started
        before = first - interval - start
        jobs = client.query(
            f"count({promqueries.labels(promqueries.JOB_INFO, before)})",
            first - interval,
        )
        if jobs and sample_value(jobs[0]) > 0:
            return None, f"the analyzer rules start at {first:.0f}, after jobs in the window began"
    return (
        RuleCoverage(first, last, interval, idle_below, restart_drop),
        f"heartbeat from {first:.0f} to {last:.0f}",
    )


@dataclass
class RuleStats:
    """Per-job aggregates from the analyzer's recording rules: `*_over_time` of recorded series.

    A few queries over every job at once (no job matcher, so no chunks): per recorded signal its
    sample count, which decides each job's signal exactly as the raw path's chain does (the first
    signal of the job's chain with samples), then the reductions of the signals some job uses.
    """

    source: PromSource
    coverage: RuleCoverage

    @property
    def step_s(self) -> float:
        return self.coverage.interval_s

    @property
    def at(self) -> float:
        return self.coverage.query_time(self.source.end)

    def _query(self, expr: str) -> dict[str, float]:
        answer = self.source.client.query(expr, self.at)
        return {item["metric"].get("job_id", ""): sample_value(item) for item in answer}

    def presence_queries(self) -> dict[tuple[str, str], str]:
        """Each job's samples, devices, first and last step: asked whatever the jobs' kinds."""
        w = f"{int(self.source.window_s)}s"
        return {
            (rules.PRESENCE, "samples"): f"count_over_time({rules.PRESENCE}[{w}])",
            (rules.PRESENCE, "gpus"): f"max_over_time({rules.PRESENCE}[{w}])",
            (rules.PRESENCE_TIME, "start"): f"min_over_time({rules.PRESENCE_TIME}[{w}])",
            (rules.PRESENCE_TIME, "end"): f"max_over_time({rules.PRESENCE_TIME}[{w}])",
        }

    def ask_presence(self) -> None:
        """Ask `presence_queries` ahead: they need no identity, so they run beside it."""
        for expr in self.presence_queries().values():
            self.source.client.ask(expr, self.at)

    def stats(self, identity: Identity, thresholds: Thresholds) -> dict[str, JobStats]:
        w = f"{int(self.source.window_s)}s"
        sub = f"{w}:{int(self.step_s)}s"
        idle = thresholds.activity.idle_below
        kinds = job_kinds(identity.series)
        present_kinds = set(kinds.values())
        tables = (
            ("activity", signals.ACTIVITY, "avg"),
            ("memory", signals.MEMORY, "max"),
            ("dram", signals.DRAM, "avg"),
            ("busy", signals.BUSY, "avg"),
            ("tensor", signals.TENSOR, "avg"),
        )
        if self.coverage.idle_below == idle:
            # the recorded idle twin (1 under the threshold, else 0): the same 0/1 values, in the
            # same order, as the subquery below, without evaluating it at every step
            idle_reduction = "avg_over_time({ri}[{w}])"
        else:
            # last_over_time over one interval less 1 ms takes each evaluation exactly once per
            # step, whatever the group's evaluation offset and the store's lookback: Prometheus 2
            # ranges include their start, so a whole interval would also take, at offset 0, the
            # previous step's evaluation, and count a job's last step twice
            idle_reduction = f"avg_over_time((last_over_time({{r}}[{{i}}]) < bool {idle!r})[{{sub}}])"
        # one interval after the raw path's steps, as the idle subquery (see there)
        cycles = cycle_reductions(
            self.step_s,
            thresholds.leak.restart_drop_fraction,
            thresholds.leak.cycle_window_steps,
            "{r}[{range}]",
            "last_over_time({r}[{i}])",
            "{sub}",
        )
        # the per-cycle growth matters only for a job that restarts (`recommend.cycle_leak`): asked
        # after the restarts, for those jobs alone
        slope_template = cycles.pop("cycle_slope")
        restart_twins = self.coverage.restart_drop == thresholds.leak.restart_drop_fraction
        restart_reductions = cycles
        if restart_twins:
            # the recorded restart times (`rules.restart_rules`): the same steps as the subquery
            restart_reductions = {
                "restarts": "count_over_time({rr}[{w}])",
                "restart_span": "max_over_time({rr}[{w}]) - min_over_time({rr}[{w}])",
            }
        reductions = {
            "activity": {
                "count": "count_over_time({r}[{w}])",
                "mean": "avg_over_time({r}[{w}])",
                "p50": "quantile_over_time(0.5, {r}[{w}])",
                "p95": "quantile_over_time(0.95, {r}[{w}])",
                "p99": "quantile_over_time(0.99, {r}[{w}])",
                "max": "max_over_time({r}[{w}])",
                "stddev": "stddev_over_time({r}[{w}])",
                "idle": idle_reduction,
            },
            "memory": {
                "max": "max_over_time({r}[{w}])",
                "p95": "quantile_over_time(0.95, {r}[{w}])",
                # the evaluations' timestamps are the steps' plus a constant offset: the same slope
                "slope": "deriv({r}[{w}])",
                **restart_reductions,
            },
            "dram": {"p95": "quantile_over_time(0.95, {r}[{w}])"},
            "busy": {"p95": "quantile_over_time(0.95, {r}[{w}])"},
            "tensor": {"mean": "avg_over_time({r}[{w}])"},
        }
        # a reduction every job with samples in the series has: *_over_time answers for a series
        # exactly when its range holds a sample, as count_over_time does
        witness = {"activity": "count", "memory": "max", "dram": "p95", "busy": "p95", "tensor": "mean"}
        step_ms = f"{int(self.step_s * 1000) - 1}ms"

        def reduce(pairs: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
            """The reductions of (table, record) pairs not asked yet."""
            return {
                (record, f"{t}.{stat}"): template.format(
                    r=record,
                    ri=rules.idle_record(record),
                    rr=rules.restart_record(record),
                    w=w,
                    sub=sub,
                    i=step_ms,
                )
                for t, record in sorted(pairs)
                for stat, template in reductions[t].items()
                if (record, f"{t}.{stat}") not in results
            }

        results: dict[tuple[str, str], dict[str, float]] = {}
        # the reductions of each chain's first signal beside the presence, in one round: most data
        # has the first signal of every chain, whose reductions every job of the kind then uses
        # (the witness tells which jobs have samples); a later signal's samples are counted first,
        # and only for the jobs left without samples
        first = {
            (t, rules.record_name(table[kind][0], how))
            for t, table, how in tables
            for kind in present_kinds
            if table[kind]
        }
        queries = reduce(first)
        for expr in queries.values():
            self.source.client.ask(expr, self.at)
        results.update(self._run(self.presence_queries()))  # asked ahead, beside the identity
        stats: dict[str, JobStats] = {}
        for job, samples in results[(rules.PRESENCE, "samples")].items():
            if job in kinds and samples > 0:
                stats[job] = JobStats(
                    start=results[(rules.PRESENCE_TIME, "start")].get(job, math.nan),
                    end=results[(rules.PRESENCE_TIME, "end")].get(job, math.nan),
                    samples=int(samples),
                    gpus=int(results[(rules.PRESENCE, "gpus")].get(job, 0)),
                )
        # the demand series of those first signals need only the jobs' spans: asked now, so
        # Prometheus answers them beside the reductions instead of after them (`_demand` takes them)
        bin_s = self._bin_s(stats)
        for t, record in sorted(first):
            if t in DEMAND_TABLES:
                self.source.client.ask(*self._demand_query(record, bin_s), matrix=True)
        results.update(self._run(queries))

        def sampled(t: str, record: str) -> dict[str, float]:
            """job -> a value for each job with samples in `record` (its witness, else its count)."""
            key = (record, f"{t}.{witness[t]}")
            return results[key] if key in results else results[(record, "count")]

        # each job's signal per table: the first of its chain with samples (as `_chain`), one
        # position of the chains at a time, counting a record's samples only when a job needs it
        chosen: dict[tuple[str, str], tuple[str, str]] = {}  # (table, job) -> (signal name, record)
        pending = {(t, job) for t, _, _ in tables for job in stats}
        depth = 0
        while pending:
            wanted: dict[tuple[str, str], tuple[str, str]] = {}  # (table, job) -> (signal, record)
            for table_name, table, how in tables:
                for job in stats:
                    chain = table[kinds[job]]
                    if (table_name, job) in pending and depth < len(chain):
                        wanted[(table_name, job)] = (chain[depth].name, rules.record_name(chain[depth], how))
            if not wanted:
                break
            missing = {
                record
                for (t, _), (_, record) in wanted.items()
                if (record, f"{t}.{witness[t]}") not in results and (record, "count") not in results
            }
            if missing:
                results.update(
                    self._run({(r, "count"): f"count_over_time({r}[{w}])" for r in sorted(missing)})
                )
            for key, (signal_name, record) in wanted.items():
                if key[1] in sampled(key[0], record):
                    chosen[key] = (signal_name, record)
                    pending.discard(key)
            depth += 1
        for record in {record for (t, _), (_, record) in chosen.items() if t == "activity"}:
            if (record, "count") in results:  # counted already: not asked again
                results.setdefault((record, "activity.count"), results[(record, "count")])
        second = reduce({(t, record) for (t, _), (_, record) in chosen.items()})
        if second:
            results.update(self._run(second))
        restarted: dict[str, list[str]] = {}  # memory record -> its jobs that restart
        for (table_name, job), (signal_name, record) in chosen.items():
            st = stats[job]

            def get(stat: str, record: str = record, job: str = job, table_name: str = table_name) -> float:
                return results[(record, f"{table_name}.{stat}")].get(job, math.nan)

            if table_name == "activity":
                st.activity_signal = signal_name
                st.activity = {k: get(k) for k in STAT_KEYS}
            elif table_name == "memory":
                st.memory_signal = signal_name
                st.memory_peak, st.memory_p95, st.memory_slope = get("max"), get("p95"), get("slope")
                st.memory_restarts, st.memory_restart_span = get("restarts"), get("restart_span")
                if restart_twins and math.isnan(st.memory_restarts):
                    st.memory_restarts = 0.0  # no recorded restart: the subquery's sum of zeros
                if st.memory_restarts > 0:
                    restarted.setdefault(record, []).append(job)
            elif table_name == "dram":
                st.dram_p95 = get("p95")
            elif table_name == "busy":
                st.busy_signal, st.busy_p95 = signal_name, get("p95")
            else:
                st.tensor_mean = get("mean")
        slopes = {
            (record, str(i)): slope_template.format(
                r=f'{record}{{job_id=~"{_regex(jobs)}"}}', w=w, sub=sub, i=step_ms
            )
            for record, restarting in sorted(restarted.items())
            for i, jobs in enumerate(chunk_jobs(restarting, self.source.chunk_size))
        }
        for (record, _), found in (self._run(slopes) if slopes else {}).items():
            for job, value in found.items():
                if job in stats and chosen.get(("memory", job), ("", ""))[1] == record:
                    stats[job].memory_cycle_slope = value
        self._demand(
            stats,
            {key: record for key, (_, record) in chosen.items() if key[0] in DEMAND_TABLES},
            bin_s,
        )
        return dict(sorted(stats.items()))

    def _bin_s(self, stats: dict[str, JobStats]) -> float:
        return demand.bin_seconds(
            self.step_s, (st.start for st in stats.values()), (st.end for st in stats.values())
        )

    def _demand_query(self, record: str, bin_s: float) -> tuple[str, float]:
        """(expression, evaluation time) of a record's per-bin maxima (`demand_query`)."""
        per_bin = f"max_over_time({record}[{round(bin_s * 1000) - 1}ms])"
        return demand_query(per_bin, bin_s, self.at, self.at - self.source.window_s)

    def _demand(self, stats: dict[str, JobStats], records: dict[tuple[str, str], str], bin_s: float) -> None:
        """Each job's per-bin activity and DRAM activity (`demand`) from the record its reductions
        came from, on the bins `stats()` chose (`bin_s`): one subquery per record, in flight together.

        An evaluation for step t runs at t + offset: with an offset, a range of one bin ending at
        a subquery step u holds the steps of (u - interval - bin, u - interval], so u stands for the
        bin ending one interval earlier. Where a bin is one step (a week at 5 min), those are the
        file path's bins exactly; where it holds several, its steps are one interval earlier than
        the file path's, for every job alike (the co-located sums are over one grid all the same).
        """
        shift = self.coverage.interval_s if self.coverage.offset_s > 0 else 0.0
        per_record: dict[str, list[tuple[str, str]]] = {}
        for (table, job), record in records.items():
            per_record.setdefault(record, []).append((table, job))
        asked = {record: self._demand_query(record, bin_s) for record in sorted(per_record)}
        with ThreadPoolExecutor(max_workers=max(1, self.source.client.config.in_flight)) as pool:
            answers = {
                record: pool.submit(self.source.client.query_matrix, expr, at)
                for record, (expr, at) in asked.items()
            }
            for record, answer in answers.items():
                found = binned_answer(answer.result(), bin_s, shift)
                for table, job in per_record[record]:
                    if job in found and job in stats:
                        if table == "activity":
                            stats[job].sm_bins = found[job]
                        elif table == "dram":
                            stats[job].dram_bins = found[job]
                        else:
                            stats[job].busy_bins = found[job]
        self.source._say(f"prometheus: {len(asked)} demand-series queries done")

    def _run(self, queries: dict[tuple[str, str], str]) -> dict[tuple[str, str], dict[str, float]]:
        """Every query, asked at once (the client runs `in_flight` at a time); per key, job -> value."""
        for expr in queries.values():
            self.source.client.ask(expr, self.at)
        out = {key: self._query(expr) for key, expr in queries.items()}
        self.source._say(f"prometheus: {len(queries)} recording-rule queries done")
        return out


def default_progress() -> TextIO | None:
    """Progress lines go to stderr when it is a terminal."""
    return sys.stderr if sys.stderr.isatty() else None
