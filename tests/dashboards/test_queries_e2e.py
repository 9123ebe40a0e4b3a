"""Every dashboard query, evaluated against a real Prometheus fed by the simulated exporters.

One Prometheus scrapes `gpulens-exporter --simulate dgx-h100` and exporters on the `faults` and
`k8s-a100-mixed` scenarios, with the shipped recording and alert rules loaded; the real analyzer
(`gpulens recommend --textfile`) then publishes its recommendations, served as node_exporter's
textfile collector would.

Variables are resolved from the data the way Grafana resolves them (`label_values`), substituted
into every target, and each target is evaluated through the HTTP API: no expression may error, and
every target of every panel must return a series on the healthy dgx-h100 node (the Jobs dashboard
once per sharing mode). The few panels that can only show something when a GPU is broken, or on a
time-sliced GPU, are listed below with the reason, and must return a series on the node of that
scenario instead.

Every query is asked twice: of Debian's Prometheus 2.42 and of Prometheus 3.16 (`make
prometheus3`), whose left-open ranges leave one sample fewer in every range selector; both scrape
the same exporters at once.
"""

from __future__ import annotations

import re
import urllib.error

import pytest

from gpulens.dashboards import queries
from gpulens.dashboards.common import CRITICAL_XID_REGEX
from tests.dashboards.live import CLUSTER, HEALTHY, SCENARIOS, Stack, engine_stack
from tests.dashboards.model import PanelRef, dashboards, data_panels, metric_names
from tests.support.procs import PROMETHEUS_ENGINES, PromAPI

RATE_INTERVAL = "10s"  # Grafana: max(4 x scrape interval, $__interval + scrape interval); scrape is 1 s
INTERVAL = "2s"

SCOPE = {"cluster": CLUSTER, "job": "gpulens"}  # tests.support.procs.prometheus: job "gpulens"
# (dashboard uid, panel title) -> (scenario whose node must show it, why the healthy node cannot)
ELSEWHERE: dict[tuple[str, str], tuple[str, str]] = {
    ("gpulens-fleet", "Faulty"): ("faults", "counts lost GPUs, pending/failed row remaps and critical Xids"),
    ("gpulens-fleet", "Open critical alerts"): ("faults", "critical alerts only fire on faults"),
    ("gpulens-fleet", "Xid rate by code (events per 10 min)"): (
        "faults",
        "the Xid counter is born with an Xid",
    ),
    ("gpulens-fleet", "Xid events in time range"): ("faults", "the Xid counter is born with the first Xid"),
    ("gpulens-node", "Xid events (per 10 min)"): ("faults", "the Xid counter is born with the first Xid"),
    ("gpulens-node", "Last Xid per GPU and code"): ("faults", "exists only after an Xid"),
    ("gpulens-sharing", "Time-sliced jobs per GPU"): ("k8s-a100-mixed", "dgx-h100 has no time-sliced GPU"),
    ("gpulens-sharing", "SM utilization per time-sliced job"): ("k8s-a100-mixed", "no time-sliced GPU"),
    ("gpulens-sharing", "Memory per time-sliced job"): ("k8s-a100-mixed", "no time-sliced GPU"),
    ("gpulens-fleet", "Top failing nodes (last day)"): (
        "faults",
        "fault-class Xids happen on the faults node",
    ),
    ("gpulens-fleet", "Fault rate by GPU model (last day)"): ("faults", "recorded from fault-class Xids"),
}
# recorded over the whole fleet: no instance label to select the healthy node by
FLEET_WIDE: dict[str, str] = {
    "fleet:gpu_faults_per_1000_gpu_days:ratio1d": "faults per 1,000 GPU-days of every node",
}
# panels fed by the `gpulens remediate` receiver, which this stack does not run (its metrics are
# checked end to end in tests/remediate/test_e2e_remediation.py)
FROM_RECEIVER: dict[tuple[str, str], str] = {
    ("gpulens-fleet", "MTTR (last 7 days)"): "the receiver's time-to-recover histogram",
    ("gpulens-fleet", "Isolated nodes now"): "the receiver's gauge",
    ("gpulens-fleet", "Episodes by outcome (time range)"): "the receiver's episode counter",
}
# metric names that the healthy node legitimately never exports
ABSENT_ON_HEALTHY_NODE: dict[str, str] = {
    "gpu_xid_errors_total": "born with the first Xid",
    "gpu_xid_last_timestamp_seconds": "born with the first Xid",
    "instance_gpu_xid:gpu_xid_errors:increase10m": "recorded from the Xid counter",
    "ALERTS": "no alert fires on a healthy node",
    "gpu_retired_pages_pending": "pre-Ampere only (page retirement became row remapping)",
    "instance:gpu_faults_per_1000_gpu_days:ratio1d": "recorded from fault-class Xids",
    "model:gpu_faults_per_1000_gpu_days:ratio1d": "recorded from fault-class Xids",
    "gpulens_remediate_isolated_nodes": "served by gpulens remediate (FROM_RECEIVER)",
    "gpulens_remediate_episodes_total": "served by gpulens remediate (FROM_RECEIVER)",
    "fleet:gpulens_remediate_time_to_recover_seconds:mean7d": "recorded from gpulens remediate's histogram",
}
# names published by the analyzer (`gpulens recommend --textfile`), scraped from the textfile target
EXTERNAL: dict[str, str] = {
    "gpulens_recommendation_info": "the analyzer's latest recommendation per job",
    "gpulens_recommendation_confidence": "the analyzer's confidence per job",
}
# (dashboard uid, panel title, refId) -> why that one target of a multi-target panel is empty there
EMPTY_TARGETS: dict[tuple[str, str, str], str] = {
    ("gpulens-fleet", "GPUs by state", "C"): "the faulty count; the same query is the Faulty stat, "
    "proven on the faults node",
}


@pytest.fixture(params=PROMETHEUS_ENGINES)
def stack(live_stacks: dict[str, Stack | BaseException], request: pytest.FixtureRequest) -> Stack:
    """Every panel is asked of both Prometheus versions."""
    return engine_stack(live_stacks, request.param)


def label_values(prom: PromAPI, query: str) -> list[str]:
    """Grafana's `label_values(selector, label)` through the label values API."""
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip())
    assert match, f"not a label_values() query: {query}"
    selector, label = match.groups()
    return sorted(prom.get(f"/api/v1/label/{label}/values", **{"match[]": selector}))


def regex_escape(value: str) -> str:
    """How Grafana's Prometheus datasource escapes a multi-value selection inside =~"..."."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value)


def substitute(text: str, values: dict[str, str], stack: Stack) -> str:
    builtins = {
        "__rate_interval": RATE_INTERVAL,
        "__interval": INTERVAL,
        "__range_s": str(stack.range_s()),
        "__range": f"{stack.range_s()}s",
    }
    merged = {**builtins, **values}
    for name in sorted(merged, key=len, reverse=True):  # $__range_s before $__range
        text = text.replace(f"${{{name}}}", merged[name]).replace(f"${name}", merged[name])
    assert "$" not in text, f"unsubstituted variable in {text}"
    return text


def resolve_variables(uid: str, node: str, stack: Stack, job_id: str | None = None) -> dict[str, str]:
    """Pick values like a user would: the given node, all GPUs, and a job (the first, or `job_id`)."""
    values: dict[str, str] = {}
    for variable in dashboards()[uid]["templating"]["list"]:
        name = variable["name"]
        if name == "datasource":
            continue
        options = label_values(stack.prom, substitute(variable["query"], values, stack))
        assert options, f"{uid}: variable {name} has no values"
        if name in SCOPE:  # one cluster and one scrape job picked, not "All": the matchers must hold
            assert SCOPE[name] in options, f"{uid}: {name} offers {options}"
            values[name] = SCOPE[name]
        elif name == "node":
            assert node in options
            values[name] = regex_escape(node) if variable["multi"] else node
        elif variable["includeAll"]:
            values[name] = variable["allValue"]
        elif name == "job_id" and job_id is not None:
            assert job_id in options
            values[name] = job_id
        else:
            values[name] = options[0]
    return values


def evaluate_targets(stack: Stack, ref: PanelRef, values: dict[str, str]) -> dict[str, int]:
    """refId -> series returned by that target; errors are collected, not raised."""
    counts = {}
    for target in ref.panel["targets"]:
        query = substitute(target["expr"], values, stack)
        try:
            counts[target["refId"]] = len(stack.prom.query(query))
        except urllib.error.HTTPError as exc:
            counts[target["refId"]] = 0
            stack.errors.append(f"{ref.name}: {exc.read().decode(errors='replace')[:300]} in {query}")
    return counts


def evaluate(stack: Stack, ref: PanelRef, values: dict[str, str]) -> int:
    """Series returned by all targets of the panel."""
    return sum(evaluate_targets(stack, ref, values).values())


def panels_of(uid: str) -> list[PanelRef]:
    return [ref for ref in data_panels() if ref.dashboard == uid]


def empty_panels(stack: Stack, uid: str, values: dict[str, str]) -> list[str]:
    """Titles of the panels without data on the healthy node (listed panels still must evaluate)."""
    empty = []
    for ref in panels_of(uid):
        counts = evaluate_targets(stack, ref, values)
        if (uid, ref.title) in ELSEWHERE or (uid, ref.title) in FROM_RECEIVER:
            continue
        empty += [
            f"{ref.title} [{ref_id}]"
            for ref_id, n in counts.items()
            if n == 0 and (uid, ref.title, ref_id) not in EMPTY_TARGETS
        ]
    return empty


def jobs_by_sharing(stack: Stack, node: str) -> dict[str, str]:
    """One workload job per sharing mode on `node` (the MPS server's own pseudo-job left out)."""
    rows = stack.prom.query(f'gpu_job_info{{instance="{node}", job_source!="system"}}')
    out: dict[str, str] = {}
    for row in sorted(rows, key=lambda r: r["metric"]["job_id"]):
        out.setdefault(row["metric"]["sharing"], row["metric"]["job_id"])
    return out


def test_listed_panels_exist_and_name_a_started_scenario() -> None:
    titles = {(ref.dashboard, ref.title) for ref in data_panels()}
    assert set(ELSEWHERE) <= titles
    assert set(FROM_RECEIVER) <= titles
    targets = {(ref.dashboard, ref.title, t["refId"]) for ref in data_panels() for t in ref.panel["targets"]}
    assert set(EMPTY_TARGETS) <= targets
    assert {scenario for scenario, _ in ELSEWHERE.values()} <= set(SCENARIOS)


@pytest.mark.slow
def test_node_variable_lists_every_exporter(stack: Stack) -> None:
    nodes = label_values(stack.prom, "label_values(gpu_info, instance)")
    assert set(stack.nodes.values()) <= set(nodes)


@pytest.mark.slow
@pytest.mark.parametrize("uid", sorted(set(dashboards()) - {"gpulens-jobs"}))
def test_every_panel_returns_series_on_the_healthy_node(stack: Stack, uid: str) -> None:
    values = resolve_variables(uid, stack.healthy, stack)
    empty = empty_panels(stack, uid, values)
    assert not stack.errors, "\n".join(stack.errors)
    assert not empty, f"{uid}: panels without data on {HEALTHY} with {values}: {empty}"


@pytest.mark.slow
@pytest.mark.parametrize("sharing", ["exclusive", "mig", "mps"])
def test_jobs_dashboard_shows_a_job_of_each_sharing_mode(stack: Stack, sharing: str) -> None:
    jobs = jobs_by_sharing(stack, stack.healthy)
    assert sharing in jobs, f"{HEALTHY} has no {sharing} job: {jobs}"
    values = resolve_variables("gpulens-jobs", stack.healthy, stack, job_id=jobs[sharing])
    empty = empty_panels(stack, "gpulens-jobs", values)
    assert not stack.errors, "\n".join(stack.errors)
    assert not empty, f"job {jobs[sharing]} ({sharing}): panels without data: {empty}"


@pytest.mark.slow
def test_listed_panels_return_series_on_their_scenario_node(stack: Stack) -> None:
    empty = []
    for (uid, title), (scenario, _why) in sorted(ELSEWHERE.items()):
        values = resolve_variables(uid, stack.nodes[scenario], stack)
        (ref,) = [r for r in panels_of(uid) if r.title == title]
        if evaluate(stack, ref, values) == 0:
            empty.append(f"{uid} / {title} on {scenario}")
    assert not stack.errors, "\n".join(stack.errors)
    assert not empty, f"panels without data even where they should have some: {empty}"


@pytest.mark.slow
def test_every_selected_metric_exists_on_the_healthy_node(stack: Stack) -> None:
    """Catches a misspelt name hidden behind `or` (the panel still shows the other branch)."""
    names = set().union(*(metric_names(e) for ref in data_panels() for e in ref.exprs))
    missing = []
    for name in sorted(names - set(ABSENT_ON_HEALTHY_NODE)):
        where = "" if name in EXTERNAL or name in FLEET_WIDE else f', instance="{stack.healthy}"'
        if not stack.prom.query(f'count({{__name__="{name}"{where}}})'):
            missing.append(name)
    assert not missing, f"selected by dashboards but absent from the {HEALTHY} node: {missing}"


def panel(uid: str, title: str) -> PanelRef:
    (ref,) = [r for r in panels_of(uid) if r.title == title]
    return ref


@pytest.mark.slow
def test_estimated_mig_instance_power_adds_up_to_the_parent_gpu(stack: Stack) -> None:
    values = resolve_variables("gpulens-sharing", stack.healthy, stack)
    (expr,) = panel("gpulens-sharing", "Estimated power per instance (by SM share)").exprs
    split = f"sum by (instance, gpu) ({substitute(expr, values, stack)})"
    parents = (
        f'gpu_power_watts and on (instance, gpu) gpu_info{{mig_mode="enabled", instance="{stack.healthy}"}}'
    )
    result = stack.prom.query(f"abs({split} - on (instance, gpu) {parents})")
    assert len(result) >= 2  # dgx-h100 has two MIG GPUs
    assert all(float(r["value"][1]) < 1e-6 for r in result), result


@pytest.mark.slow
def test_job_waste_never_exceeds_one_gpu_per_gpu(stack: Stack) -> None:
    """Shared GPUs (MIG slices, MPS clients) split one GPU: their waste cannot add up to more."""
    values = resolve_variables("gpulens-fleet", stack.healthy, stack)
    per_gpu = stack.prom.query(f"sum by (instance, gpu) ({substitute(queries.job_waste(), values, stack)})")
    assert {r["metric"]["gpu"] for r in per_gpu} >= {"0", "1", "2"}  # MIG, MIG, MPS GPUs
    assert all(0 <= float(r["value"][1]) <= 1 + 1e-9 for r in per_gpu), per_gpu


@pytest.mark.slow
def test_the_first_xid_of_a_code_is_counted_and_makes_the_gpu_faulty(stack: Stack) -> None:
    """faults.yaml: Xid 79 on GPU 2 at 15 s; its counter series is born with that event."""
    values = resolve_variables("gpulens-fleet", stack.nodes["faults"], stack)
    (events,) = panel("gpulens-fleet", "Xid events in time range").exprs
    rows = stack.prom.query(substitute(events, values, stack))
    assert any(
        r["metric"]["gpu"] == "2" and r["metric"]["xid"] == "79" and float(r["value"][1]) >= 1 for r in rows
    )
    critical = substitute(queries.xid_events("1h", f'xid=~"{CRITICAL_XID_REGEX}"'), values, stack)
    assert "2" in {r["metric"]["gpu"] for r in stack.prom.query(f"({critical}) > 0")}
