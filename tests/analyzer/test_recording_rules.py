"""The analyzer's recording rules: generated from the signal table, read instead of raw joins,
with the same profiles and recommendations as the raw PromQL path on every shipped scenario.

Data: the scenario simulated at the analysis step (`STEP`), backfilled with promtool and served by
a real Prometheus whose lookback is just under the step (backfilled blocks have no staleness
markers, and a lookback of a whole step would let every series linger a step). The rules are
evaluated over it by `promtool tsdb create-blocks-from rules` at their group's own offset within
each interval, as Prometheus evaluates them live: each evaluation sees its step's samples, as the
raw path's subquery steps do, so the two paths reduce the same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest

from gpulens.analyzer import demand, signals
from gpulens.analyzer.pipeline import analyze_profiles
from gpulens.analyzer.profile import Identity, JobStats
from gpulens.analyzer.sources import promqueries, rules
from gpulens.analyzer.sources.promclient import PromClient, PromConfig
from gpulens.analyzer.sources.prometheus import (
    Aggregation,
    PromSource,
    RuleCoverage,
    RuleStats,
    rule_coverage,
)
from gpulens.cli import main
from gpulens.devtools.bench import tsdb
from gpulens.devtools.bench.analyzer_bench import backfill, make_cluster, write_openmetrics_blocks
from gpulens.sim.history import simulate
from gpulens.sim.scenariofile import list_builtin
from tests.analyzer.test_prometheus import assert_same_demand
from tests.support.procs import PROMETHEUS_ENGINES, REPO_ROOT, find_binary, use_prometheus

STEP = 120.0
LOOKBACK = "119s999ms"  # just under the step
START = 1_767_225_600.0  # a multiple of the step
DURATION = 90 * 60.0
END = START + DURATION + STEP  # the last step's evaluation lies before the end
WINDOW = DURATION + 2 * 3600.0  # the whole history, with room on both sides
RECOMMENDATION = (
    "recommendation",
    "mig_profile",
    "mps_active_thread_percentage",
    "mps_pinned_memory_limit_bytes",
)


def test_rule_file_is_generated_from_the_signal_table():
    shipped = (REPO_ROOT / "alerts" / rules.RULE_FILE).read_text()
    assert shipped == rules.render(), "run: gpulens mixin build (make rules)"


def test_every_signal_the_analyzer_can_pick_has_a_recorded_series():
    recorded = {r.record for r in rules.all_rules()}
    for table, how in rules.TABLES:
        for chain in table.values():
            for signal in chain:
                assert rules.record_name(signal, how) in recorded, signal


def test_rule_queries_run_where_the_windows_hold_the_raw_paths_steps():
    # the evaluation for step t runs at t + offset: a window ending at `end` would drop the last
    # step's evaluation and take one from before the window
    end = 1_767_830_400.0  # a multiple of 300
    at_offset = RuleCoverage(first=0.0, last=end - 300 + 120.5, interval_s=300.0)
    assert at_offset.offset_s == 120.5
    assert at_offset.query_time(end) == end + 300
    assert at_offset.query_time(end + 50) == end + 300  # the last step is still `end`
    on_the_step = RuleCoverage(first=0.0, last=end - 300, interval_s=300.0)
    assert on_the_step.offset_s == 0.0 and on_the_step.query_time(end) == end


def test_interval_is_the_groups_evaluation_interval():
    assert "interval: 5m\n" in rules.render("5m")


def test_every_activity_series_has_an_idle_twin_at_the_recorded_threshold():
    recorded = {r.record: r.expr for r in rules.all_rules(0.1)}
    assert recorded[rules.IDLE_BELOW] == "vector(0.1)"
    for chain in signals.ACTIVITY.values():
        for signal in chain:
            record = rules.record_name(signal, "avg")
            assert recorded[rules.idle_record(record)] == f"{recorded[record]} < bool 0.1"


def test_every_memory_series_has_a_restart_twin_at_the_recorded_drop():
    recorded = {r.record: r.expr for r in rules.all_rules(restart_drop=0.25, interval_s=300.0)}
    assert recorded[rules.RESTART_DROP] == "vector(0.25)"
    for chain in signals.MEMORY.values():
        for signal in chain:
            record = rules.record_name(signal, "max")
            two = f"({recorded[record]})[599999ms:300000ms]"  # the last two steps, as the raw path's
            assert recorded[rules.restart_record(record)] == (
                f"time() + 0 * (last_over_time({two}) < 0.75 * max_over_time({two}))"
            )


def test_the_restart_twins_take_the_groups_interval():
    assert "[239999ms:120000ms]" in rules.render("2m")


class AnsweringClient:
    """A PromClient stand-in: `answer(expr)` is the result of every query; `asked` keeps them."""

    def __init__(self, answer: Callable[[str], list[dict[str, Any]]]) -> None:
        self.answer = answer
        self.asked: list[str] = []
        self.base = "http://prometheus.test"
        self.config = PromConfig(url=self.base, in_flight=1)

    def ask(self, expr: str, at: float, matrix: bool = False) -> None:
        """Asking ahead is only a hint: this stand-in answers when the query comes."""

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        self.asked.append(expr)
        return self.answer(expr)

    def query_matrix(self, expr: str, at: float) -> list[dict[str, Any]]:
        """Range answers (the per-bin demand series): none, so jobs pack by their percentiles."""
        self.asked.append(expr)
        return []


def as_client(stand_in: AnsweringClient) -> PromClient:
    """The stand-in where a PromClient is asked for: it answers the calls these paths make
    (`ask`, `query`, `query_matrix`, `base`, `config`), which is all these paths read."""
    return cast(PromClient, stand_in)


def coverage_with(**stats: float) -> RuleCoverage | None:
    """What `rule_coverage` makes of a heartbeat over the whole week and these idle statistics."""
    week = 7 * 86400.0
    answers = {"first": END - week + 300, "last": END, "interval": 300.0, **stats}

    def answer(expr: str) -> list[dict[str, Any]]:
        return [{"metric": {"stat": k}, "value": [END, repr(v)]} for k, v in answers.items()]

    coverage, _ = rule_coverage(as_client(AnsweringClient(answer)), week, END)
    return coverage


def test_idle_twins_count_when_recorded_at_every_evaluation_with_one_threshold():
    coverage = coverage_with(evaluations=2016, idle_evaluations=2016, idle_min=0.05, idle_max=0.05)
    assert coverage is not None and coverage.idle_below == 0.05


@pytest.mark.parametrize(
    "idle",
    [
        {},  # rules from before the twins
        {"idle_evaluations": 1000, "idle_min": 0.05, "idle_max": 0.05},  # deployed within the window
        {"idle_evaluations": 2016, "idle_min": 0.05, "idle_max": 0.1},  # threshold changed within it
    ],
    ids=["absent", "part-of-the-window", "two-thresholds"],
)
def test_idle_twins_not_recorded_over_the_whole_window_at_one_threshold_do_not_count(idle):
    coverage = coverage_with(evaluations=2016, **idle)
    assert coverage is not None and np.isnan(coverage.idle_below)


def test_restart_twins_count_when_recorded_at_every_evaluation_with_one_drop():
    coverage = coverage_with(evaluations=2016, restart_evaluations=2016, restart_min=0.5, restart_max=0.5)
    assert coverage is not None and coverage.restart_drop == 0.5


@pytest.mark.parametrize(
    "restart",
    [
        {},  # rules from before the twins
        {"restart_evaluations": 1000, "restart_min": 0.5, "restart_max": 0.5},  # deployed within the window
        {"restart_evaluations": 2016, "restart_min": 0.5, "restart_max": 0.6},  # drop changed within it
    ],
    ids=["absent", "part-of-the-window", "two-drops"],
)
def test_restart_twins_not_recorded_over_the_whole_window_at_one_drop_do_not_count(restart):
    coverage = coverage_with(evaluations=2016, **restart)
    assert coverage is not None and np.isnan(coverage.restart_drop)


def rule_stats(
    th, has: tuple[str, ...], recorded_idle_below: float = 0.05, recorded_restart_drop: float = float("nan")
) -> tuple[JobStats, list[str]]:
    """The rule path's stats of one exclusive job "a" with samples in the series named in `has`
    (substrings of the queries), and the queries it sent."""
    identity = Identity(
        series=pd.DataFrame(
            {"job_id": ["a"], "uuid": ["GPU-0"], "gpu_instance": [""], "sharing": ["exclusive"]}
        ),
        gpus=pd.DataFrame(columns=["uuid", "model", "instance"]),
        migs=pd.DataFrame(columns=["uuid", "gpu_instance", "mig_profile"]),
    )

    def answer(expr: str) -> list[dict[str, Any]]:
        sampled = any(name in expr for name in ("job_id:gpu_job_info:", *has))
        return [{"metric": {"job_id": "a"}, "value": [END, "1"]}] if sampled else []

    client = AnsweringClient(answer)
    prom = PromSource(as_client(client), 7 * 86400, END, 300.0, log=None)
    coverage = RuleCoverage(END - 7 * 86400, END, 300.0, recorded_idle_below, recorded_restart_drop)
    stats = RuleStats(prom, coverage).stats(identity, th)
    return stats["a"], client.asked


def idle_queries(th, recorded_idle_below: float) -> list[str]:
    """The idle-fraction queries of the rule path for an exclusive job with SM activity."""
    st, asked = rule_stats(th, ("gpu_sm_active_ratio:avg", "gpu_job_memory"), recorded_idle_below)
    assert st.activity_signal == "sm_active"
    # the activity's idle queries (the memory restarts are counted with `< bool` too)
    return [e for e in asked if "gpu_sm_active_ratio" in e and ("_idle" in e or "bool" in e)]


def test_the_idle_fraction_reads_the_idle_twin_recorded_at_the_analyzers_threshold(th):
    assert idle_queries(th, th.activity.idle_below) == [
        "avg_over_time(job_id:gpu_sm_active_ratio:avg_idle[604800s])"
    ]


def test_another_threshold_than_the_recorded_one_evaluates_the_idle_subquery(th):
    (query,) = idle_queries(th, th.activity.idle_below * 2)
    assert query.startswith("avg_over_time((last_over_time(job_id:gpu_sm_active_ratio:avg[299999ms]) < bool")
    assert query.endswith(f"{th.activity.idle_below!r})[604800s:300s])")


MEMORY_RECORD = "job_id:gpu_job_memory_used_bytes:max"


def restart_queries(th, has: tuple[str, ...], recorded_restart_drop: float) -> tuple[JobStats, list[str]]:
    """The rule path's stats of an exclusive job with SM activity and its own memory, and its
    queries about the memory's restarts and per-cycle growth."""
    st, asked = rule_stats(th, ("gpu_sm_active_ratio:avg", *has), recorded_restart_drop=recorded_restart_drop)
    assert st.memory_signal == "job_memory"
    cycles = ("restart", f"{MEMORY_RECORD}{{job_id=~")  # the twin, or a matcher for the growth
    return st, [e for e in asked if any(c in e for c in cycles) or ("bool" in e and MEMORY_RECORD in e)]


def test_restarts_are_counted_from_the_restart_twin_recorded_at_the_analyzers_drop(th):
    drop = th.leak.restart_drop_fraction
    st, asked = restart_queries(th, (f"{MEMORY_RECORD}[",), drop)
    twin = rules.restart_record(MEMORY_RECORD)
    assert asked == [
        f"count_over_time({twin}[604800s])",
        f"max_over_time({twin}[604800s]) - min_over_time({twin}[604800s])",
    ]
    # no recorded restart: none, and so no per-cycle growth to ask
    assert st.memory_restarts == 0 and np.isnan(st.memory_cycle_slope)


def test_another_drop_than_the_recorded_one_counts_restarts_with_a_subquery(th):
    _, asked = restart_queries(th, (f"{MEMORY_RECORD}[",), th.leak.restart_drop_fraction / 2)
    assert not any(rules.restart_record(MEMORY_RECORD) in e for e in asked)
    keep = 1 - th.leak.restart_drop_fraction
    assert any(e.startswith("sum_over_time((last_over_time") and f"< bool {keep!r}" in e for e in asked)


def test_the_per_cycle_growth_is_asked_for_the_jobs_that_restart_alone(th):
    # job "a" restarts (its twin has samples): its growth is asked with its own matcher
    st, asked = restart_queries(th, ("gpu_job_memory",), th.leak.restart_drop_fraction)
    (slope,) = [e for e in asked if "deriv(" in e]
    assert slope.startswith(f'quantile_over_time(0.5, (deriv({MEMORY_RECORD}{{job_id=~"a"}}[')
    assert st.memory_restarts == 1 and st.memory_cycle_slope == 1


def test_each_chains_first_signal_is_reduced_without_counting_its_samples_apart(th):
    st, asked = rule_stats(th, ("gpu_sm_active_ratio:avg", "gpu_job_memory", "gpu_job_duty_cycle_ratio:avg"))
    assert (st.activity_signal, st.memory_signal, st.busy_signal) == (
        "sm_active",
        "job_memory",
        "job_duty_cycle",
    )
    assert st.activity["count"] == 1
    # the first signals' reductions tell which jobs have samples: no count of their own
    counted = sorted(e for e in asked if e.startswith("count_over_time(job_id:"))
    assert counted == [
        "count_over_time(job_id:gpu_job_info:count[604800s])",
        "count_over_time(job_id:gpu_sm_active_ratio:avg[604800s])",  # the activity's sample count
    ]


def test_a_job_without_its_chains_first_signal_takes_the_next_one_with_samples(th):
    st, asked = rule_stats(th, ("gpu_utilization_ratio:avg", "gpu_job_memory"))
    assert st.activity_signal == "utilization" and st.activity["count"] == 1
    assert "count_over_time(job_id:gpu_utilization_ratio:avg[604800s])" in asked
    assert "quantile_over_time(0.95, job_id:gpu_utilization_ratio:avg[604800s])" in asked
    # the signals after it in the chain are not asked
    assert not any("gpu_job_sm_utilization_ratio" in e for e in asked)


def test_the_rule_path_reads_the_running_thread_caps_in_one_query(th):
    """Each MPS client's running cap comes from one query over the raw family for every job (no
    recording rule, no job matcher, no chunk): the rule path asks one query more than without it."""
    week = 7 * 86400.0
    client_labels = {
        "job_id": "a",
        "uuid": "GPU-0",
        "gpu_instance": "",
        "sharing": "mps",
        "job_source": "kubernetes",
    }
    gpu = {"uuid": "GPU-0", "model": "NVIDIA A100-SXM4-40GB", "instance": "node-1", "gpu": "0"}
    heartbeat = {"first": END - week + 300, "last": END, "interval": 300.0, "evaluations": 2016}

    def answer(expr: str) -> list[dict[str, Any]]:
        if signals.THREAD_CAP in expr:
            return [{"metric": {"job_id": "a"}, "value": [END, repr(1 / 3)]}]
        if rules.HEARTBEAT in expr:
            return [{"metric": {"stat": k}, "value": [END, repr(v)]} for k, v in heartbeat.items()]
        if expr.startswith("last_over_time(gpu_job_info"):
            return [{"metric": client_labels, "value": [END, "1"]}]
        if expr.startswith("last_over_time(gpu_info"):
            return [{"metric": gpu, "value": [END, "1"]}]
        return [{"metric": {"job_id": "a"}, "value": [END, "1"]}] if "job_id:" in expr else []

    client = AnsweringClient(answer)
    source = PromSource(as_client(client), week, END, 300.0, log=None, step_given=False)
    profile = source.profiles(th).set_index("job_id")
    assert source.used is Aggregation.RULES
    assert [e for e in client.asked if signals.THREAD_CAP in e] == [promqueries.thread_caps(week)]
    assert profile.loc["a", "mps_thread_cap_now_pct"] == pytest.approx(100 / 3)


@dataclass
class Deployment:
    """A TSDB with raw samples and, in other directories, rule blocks for all or half of the time."""

    raw: Path
    rule_blocks: list[Path]
    late_rule_blocks: list[Path]  # rules that only started halfway through


def deploy(tmp: Path, scenario: str, late_rules: bool = False) -> Deployment:
    find_binary("promtool")
    simulate(scenario, duration_s=DURATION, out=tmp / "h", step_s=STEP, seed=0, start=START)
    tsdb.backfill_openmetrics(tmp / "h" / "metrics.om", tmp / "raw")
    text = rules.render(f"{int(STEP)}s", tsdb.BACKFILLED)
    with tsdb.prometheus(tmp / "raw", LOOKBACK, tmp / "backfill.log", compaction=False) as base:
        blocks = tsdb.backfill_rules(base, text, START, END, tmp / "rules", STEP)
        late: list[Path] = []
        if late_rules:
            late = tsdb.backfill_rules(base, text, START + DURATION / 2, END, tmp / "late", STEP)
    return Deployment(tmp / "raw", blocks, late)


def with_blocks(deployment: Deployment, blocks: list[Path], out: Path) -> Path:
    shutil.copytree(deployment.raw, out)
    for block in blocks:
        shutil.copytree(block, out / block.name)
    return out


def source(base: str, **kwargs) -> PromSource:
    return PromSource(PromClient(PromConfig(base)), WINDOW, END, STEP, log=None, **kwargs)


def assert_same_profiles(raw: pd.DataFrame, ruled: pd.DataFrame) -> None:
    a, b = raw.set_index("job_id").sort_index(), ruled.set_index("job_id").sort_index()
    assert list(a.index) == list(b.index)
    for column in a.columns:
        x, y = a[column], b[column]
        if x.dtype.kind == "f":
            # a job's first/last step is the data's timestamp seen by the evaluation (within a step)
            atol = STEP if column in ("start", "end") else 0.0
            assert np.allclose(x.astype(float), y.astype(float), rtol=1e-9, atol=atol, equal_nan=True), column
        else:
            assert list(x.astype(str)) == list(y.astype(str)), column
    assert_same_demand(demand.of(raw), demand.of(ruled))  # the series the packer sums, bin for bin


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
@pytest.mark.parametrize("scenario", list_builtin())
def test_rules_and_raw_series_give_the_same_recommendations(tmp_path, th, scenario, engine, monkeypatch):
    use_prometheus(engine, monkeypatch)  # the rules evaluated and the week read by that version
    deployment = deploy(tmp_path, scenario)
    db = with_blocks(deployment, deployment.rule_blocks, tmp_path / "db")
    with tsdb.prometheus(db, LOOKBACK, tmp_path / "prometheus.log", compaction=False) as base:
        raw_source = source(base, aggregation=Aggregation.RAW)
        raw = raw_source.profiles(th)
        auto = source(base, step_given=False)
        ruled = auto.profiles(th)
    assert (raw_source.used, auto.used) == (Aggregation.RAW, Aggregation.RULES)
    assert auto.used_step_s == STEP
    assert_same_profiles(raw, ruled)
    by_raw = analyze_profiles(raw, th, "raw", with_archetypes=False)
    by_rules = analyze_profiles(ruled, th, "rules", with_archetypes=False)
    assert by_raw.recs[["job_id", *RECOMMENDATION]].equals(by_rules.recs[["job_id", *RECOMMENDATION]])
    assert by_raw.plan.as_dict() == by_rules.plan.as_dict()


@pytest.fixture(scope="module")
def seed_case(tmp_path_factory) -> Deployment:
    return deploy(tmp_path_factory.mktemp("seed-case"), "seed-case", late_rules=True)


@pytest.mark.slow
def test_without_the_rules_the_raw_path_is_taken_and_said(tmp_path, th, seed_case, capsys):
    with tsdb.prometheus(seed_case.raw, LOOKBACK, tmp_path / "prometheus.log", compaction=False) as base:
        auto = PromSource(PromClient(PromConfig(base)), WINDOW, END, STEP, step_given=False)
        profiles = auto.profiles(th)
        forced = ["profile", "--prometheus", base, "--window", f"{int(WINDOW)}s", "--end", str(END)]
        code = main([*forced, "--aggregation", "rules"])
    assert auto.used is Aggregation.RAW and auto.used_step_s == STEP  # the default it was given
    assert len(profiles) == 4
    err = capsys.readouterr().err.splitlines()
    assert "joining raw series at query time" in err[0] and rules.HEARTBEAT in err[0]
    assert code == 2
    assert len(err) == 2 and err[1].startswith("gpulens: error: ") and "--aggregation rules" in err[1]


@pytest.mark.slow
def test_rules_that_started_after_the_jobs_are_not_used(tmp_path, th, seed_case):
    db = with_blocks(seed_case, seed_case.late_rule_blocks, tmp_path / "db")
    with tsdb.prometheus(db, LOOKBACK, tmp_path / "prometheus.log", compaction=False) as base:
        auto = source(base, step_given=False)
        auto.profiles(th)
    assert auto.used is Aggregation.RAW
    assert "after jobs in the window began" in auto.used_reason


@pytest.mark.slow
def test_a_step_other_than_the_rule_interval_reads_raw_series(tmp_path, th, seed_case, capsys):
    db = with_blocks(seed_case, seed_case.rule_blocks, tmp_path / "db")
    with tsdb.prometheus(db, LOOKBACK, tmp_path / "prometheus.log", compaction=False) as base:
        explicit = source(base, step_given=True)  # STEP itself: the rules' interval, so rules
        explicit.profiles(th)
        other = PromSource(PromClient(PromConfig(base)), WINDOW, END, 60.0, log=None)
        other.profiles(th)
        args = ["recommend", "--prometheus", base, "--window", f"{int(WINDOW)}s", "--end", str(END)]
        code = main([*args, "--format", "json"])
    assert explicit.used is Aggregation.RULES
    assert other.used is Aggregation.RAW and "every 120 s but --step is 60 s" in other.used_reason
    assert code == 0
    out, err = capsys.readouterr()
    assert "reading the analyzer recording rules" in err and "step 120 s" in err
    assert {j["recommendation"] for j in json.loads(out)["jobs"]} == {"mps"}


@pytest.mark.slow
@pytest.mark.parametrize("idle_below", [None, 0.3], ids=["recorded-idle-twins", "idle-subquery"])
def test_rules_evaluated_on_the_step_give_the_raw_paths_profiles(tmp_path, th, idle_below):
    # evaluation offset 0 (a group whose hash lands on the step; the bench's generated series): a
    # range of one whole interval would also hold the previous step's evaluation (Prometheus 2
    # ranges include their start) and count a job's last step twice in its idle fraction; at
    # another threshold than the recorded twins' the idle fraction comes from a subquery
    if idle_below is not None:
        th = dataclasses.replace(th, activity=dataclasses.replace(th.activity, idle_below=idle_below))
    step = 1800
    cluster = make_cluster(40, step)
    backfill(write_openmetrics_blocks(cluster, tmp_path / "om", recorded=True), tmp_path / "db")
    with tsdb.prometheus(tmp_path / "db", tsdb.lookback(step), tmp_path / "p.log", compaction=False) as base:
        ruled, raw = (
            PromSource(
                PromClient(PromConfig(base)), 7 * 86400, cluster.end, step, log=None, aggregation=how
            ).profiles(th)
            for how in (Aggregation.RULES, Aggregation.RAW)
        )
    assert len(ruled) == 40
    assert_same_profiles(raw, ruled)
