"""Week over week: which of last week's recommendations were applied, and what they did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import read_history
from gpulens.analyzer.pipeline import analyze_history
from gpulens.analyzer.report import html_report, markdown, write_report
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.analyzer.weekly import compare, load_previous, on_whole_gpu, pair_successors
from gpulens.sim.history import simulate


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    """This week's analysis and last week's report written from it, then edited per test."""
    root = tmp_path_factory.mktemp("weekly")
    simulate("dgx-h100", duration_s=2 * 3600, out=root / "h", step_s=120, seed=1)
    analysis = analyze_history(read_history(root / "h"), load_thresholds(), with_archetypes=False)
    write_report(analysis, root / "last")
    return analysis, root / "last"


# last week 5101 ran on a whole GPU and the report asked for the MIG slice it runs on now
LAST_WEEK_5101 = {"5101": {"sharing": "exclusive", "mig_profile_now": None, "action": "change"}}


def previous(week_dir, edits):
    jobs, plan = load_previous(week_dir)
    by_id = {j["job_id"]: j for j in jobs}
    for job_id, fields in edits.items():
        if job_id in by_id:
            by_id[job_id].update(fields)
        else:
            jobs.append({"job_id": job_id, **fields})
    return jobs, plan


def test_a_recommendation_the_job_now_runs_is_applied(week):
    analysis, last = week
    jobs, plan = previous(last, LAST_WEEK_5101)
    result = compare(analysis, jobs, plan, str(last))
    applied = {o.job_id: o for o in result.applied}
    assert "5101" in applied
    assert applied["5101"].was.startswith("exclusive") and applied["5101"].now.startswith("mig 3g.40gb")


def test_a_recommendation_the_job_does_not_run_is_not_applied(week):
    analysis, last = week
    jobs, plan = previous(
        last, {"5110": {"recommendation": "mps", "action": "change", "mps_active_thread_percentage": 40}}
    )
    result = compare(analysis, jobs, plan, str(last))
    assert "5110" in {o.job_id for o in result.not_applied}


def test_a_reclaimed_job_that_is_gone_is_applied_and_an_ended_job_is_counted_apart(week):
    analysis, last = week
    jobs, plan = previous(
        last,
        {
            "old-idle": {"recommendation": "reclaim", "sharing": "exclusive", "gpu_model": "H100-80GB"},
            "old-batch": {"recommendation": "mps", "sharing": "exclusive", "gpu_model": "H100-80GB"},
        },
    )
    result = compare(analysis, jobs, plan, str(last))
    assert "old-idle" in {o.job_id for o in result.applied}
    assert result.ended == ["old-batch"]


def test_a_job_that_runs_at_its_cap_after_the_move_is_flagged(week):
    analysis, last = week
    hot = analysis.recs.assign(
        sm_active_p95=analysis.recs["sm_active_p95"].where(analysis.recs["job_id"] != "5101", 0.99)
    )
    changed = type(analysis)(
        analysis.kind, analysis.source, hot, analysis.plan, None, analysis.emitted, analysis.meta
    )
    jobs, plan = previous(last, LAST_WEEK_5101)
    outcome = next(o for o in compare(changed, jobs, plan, str(last)).applied if o.job_id == "5101")
    assert "may be slower" in outcome.warning


def test_no_change_asked_is_neither_applied_nor_not_applied(week):
    analysis, last = week
    result = compare(analysis, *load_previous(last), str(last))
    asked = {o.job_id for o in result.applied + result.not_applied}
    unchanged = analysis.recs[analysis.recs["recommendation"] == analysis.recs["sharing"]]
    assert not asked & set(unchanged.loc[unchanged["mig_profile"].isna(), "job_id"])


def test_the_report_says_what_happened_since_last_week(week):
    analysis, last = week
    jobs, plan = previous(last, LAST_WEEK_5101)
    result = compare(analysis, jobs, plan, str(last))
    page = html_report(analysis, previous=result)
    assert "<h2>Since last week</h2>" in page and ">applied<" in page
    assert "## Since last week" in markdown(analysis, previous=result)


def test_a_directory_that_is_not_a_report_is_one_clear_error(tmp_path):
    with pytest.raises(AnalyzerError, match=r"no jobs\.json"):
        load_previous(tmp_path)
    (tmp_path / "jobs.json").write_text("{not json")
    (tmp_path / "plan.json").write_text(json.dumps({}))
    with pytest.raises(AnalyzerError, match="not a gpulens report"):
        load_previous(tmp_path)


def test_a_job_renamed_by_a_rollout_is_followed_by_its_workload_and_counted_applied(week):
    analysis, last = week
    jobs, plan = load_previous(last)
    renamed = [dict(j) for j in jobs]
    [workload] = [r["workload"] for r in analysis.job_records() if r["job_id"] == "5101"]
    for job in renamed:
        if job["job_id"] == "5101":  # last week's job: same workload, another id
            job.update(job_id="5101-old", workload=workload, **LAST_WEEK_5101["5101"])
    result = compare(analysis, renamed, plan, str(last))
    applied = {o.job_id: o for o in result.applied}
    assert "5101-old" in applied and applied["5101-old"].now.endswith("(now 5101)")
    assert "5101-old" not in result.ended


def test_every_job_record_carries_its_workload(week):
    analysis, _ = week
    assert all(r["workload"] for r in analysis.job_records())


def test_gpus_released_are_the_gpus_that_ran_no_job_all_window_by_node_and_model(week):
    analysis, last = week
    jobs, plan = load_previous(last)
    used = {u for j in jobs for u in str(j.get("uuids") or "").split(",") if u}
    emitted = analysis.emitted
    assert emitted is not None and emitted.placement is not None
    idle = [s for s in emitted.placement.inventory.gpus if s.uuid not in used]
    result = compare(analysis, jobs, {**plan, "gpus_freed": 3}, str(last))
    assert result.gpus_released == len(idle) >= 1
    assert sum(result.idle_now.values()) == len(idle) and result.promised == 3
    assert result.gpus_now == len(used) <= len(emitted.placement.inventory.gpus)


def _with(analysis, job_id, **columns):
    recs = analysis.recs.copy()
    for column, value in columns.items():
        recs[column] = recs[column].astype(object).where(recs["job_id"] != job_id, value)
    return type(analysis)(
        analysis.kind, analysis.source, recs, analysis.plan, None, analysis.emitted, analysis.meta
    )


def _changed_node(last: Path, node: str = "dgx-h100-01") -> Path:
    """Last week's report as if its plan had changed `node` (this fixture's plan changes none: packing
    dgx-h100 frees no GPU): its rollback script. The week-pair tests produce the real one."""
    script = last / "config" / f"rollback-{node}.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("#!/bin/sh\n# last week's configuration of this node\n")
    return script


def test_a_regression_after_the_change_is_a_roll_back_with_the_command_that_undoes_it(week):
    analysis, last = week
    _changed_node(last)
    hot = _with(analysis, "5101", sm_active_p95=0.99)
    jobs, plan = previous(last, LAST_WEEK_5101)
    outcome = next(o for o in compare(hot, jobs, plan, str(last)).applied if o.job_id == "5101")
    assert outcome.status == "roll back"
    assert outcome.rollback == f"sh {last / 'config' / 'rollback-dgx-h100-01.sh'}"
    assert (last / "config" / "rollback-dgx-h100-01.sh").is_file()


def test_an_mps_job_that_binds_its_thread_cap_is_a_regression(week):
    analysis, last = week
    # last week's plan capped it at 30 %; now its p95 (its sizing percentile) is 29 %: the cap binds
    # in over compute.max_bind_fraction of samples. This week's own proposal (45 %) is not in force.
    now = {"sharing": "mps", "mps_active_thread_percentage": 45, "sizing_percentile": "p95"}
    bound = _with(analysis, "5101", sm_active_p95=0.29, **now)
    told = {
        "recommendation": "mps",
        "sharing": "exclusive",
        "action": "change",
        "mps_active_thread_percentage": 30,
    }
    jobs, plan = previous(last, {"5101": told})
    outcome = next(o for o in compare(bound, jobs, plan, str(last)).applied if o.job_id == "5101")
    assert "at its cap (p95 activity 29% of 30%" in outcome.warning and outcome.status == "roll back"
    quiet = _with(analysis, "5101", sm_active_p95=0.10, **now)
    outcome = next(o for o in compare(quiet, jobs, plan, str(last)).applied if o.job_id == "5101")
    assert outcome.status == "applied"


def test_a_moved_job_that_restarts_more_often_than_before_is_a_roll_back(week):
    """An MPS client that outgrows its pinned limit is killed and restarted: its memory drops to a
    fraction between two steps more often than before the move."""
    analysis, last = week
    told = {**LAST_WEEK_5101["5101"], "memory_restarts": 1, "duration_s": 86400.0}
    jobs, plan = previous(last, {"5101": told})
    now = {"sizing_percentile": "p95", "sm_active_p95": 0.01, "duration_s": 86400.0}
    restarting = _with(analysis, "5101", memory_restarts=6, **now)
    outcome = next(o for o in compare(restarting, jobs, plan, str(last)).applied if o.job_id == "5101")
    assert outcome.status == "roll back" and "restarts more often: 6.0 a day, was 1.0" in outcome.warning
    steady = _with(analysis, "5101", memory_restarts=1, **now)
    outcome = next(o for o in compare(steady, jobs, plan, str(last)).applied if o.job_id == "5101")
    assert "restarts" not in outcome.warning


def test_a_latency_sensitive_job_is_judged_at_the_percentile_it_is_sized_at(week):
    analysis, last = week
    now = {"sharing": "mps", "sizing_percentile": "p99", "sm_active_p95": 0.10}
    told = {
        "recommendation": "mps",
        "sharing": "exclusive",
        "action": "change",
        "mps_active_thread_percentage": 30,
    }
    jobs, plan = previous(last, {"5101": told})
    bursty = _with(analysis, "5101", sm_active_p99=0.30, **now)
    outcome = next(o for o in compare(bursty, jobs, plan, str(last)).applied if o.job_id == "5101")
    assert "p99 activity 30% of 30%" in outcome.warning


def test_an_action_not_applied_whose_job_now_gets_another_proposal_is_superseded(week, tmp_path):
    analysis, last = week
    told = {"recommendation": "mps", "sharing": "exclusive", "action": "change"}
    jobs, plan = previous(last, {"5101": told})
    other = _with(
        analysis,
        "5101",
        sharing="exclusive",
        mig_profile_now="",
        recommendation="mig",
        mig_profile="1g.10gb",
        action="change",
    )
    result = compare(other, jobs, plan, str(last))
    (outcome,) = [o for o in result.not_applied if o.job_id == "5101"]
    assert outcome.superseded_by.startswith("mig 1g.10gb")
    write_report(other, tmp_path / "now", previous=result)
    doc = json.loads((tmp_path / "now" / "week.json").read_text())
    (entry,) = [a for a in doc["actions"] if a["job_id"] == "5101"]
    assert entry["status"].startswith("superseded by mig 1g.10gb")
    assert "- superseded: 5101" in (tmp_path / "now" / "summary.md").read_text()
    same = _with(
        analysis, "5101", sharing="exclusive", mig_profile_now="", recommendation="mps", action="change"
    )
    (outcome,) = [o for o in compare(same, jobs, plan, str(last)).not_applied if o.job_id == "5101"]
    assert outcome.superseded_by == ""


def test_the_report_writes_every_previous_actions_status_and_figures_to_week_json(week, tmp_path):
    analysis, last = week
    _changed_node(last)
    jobs, plan = previous(last, LAST_WEEK_5101)
    result = compare(_with(analysis, "5101", sm_active_p95=0.99), jobs, plan, str(last))
    write_report(analysis, tmp_path / "now", previous=result)
    doc = json.loads((tmp_path / "now" / "week.json").read_text())
    by_job = {a["job_id"]: a for a in doc["actions"]}
    assert by_job["5101"]["status"] == "roll back" and by_job["5101"]["rollback"].startswith("sh ")
    # 5101 runs on a 3g.40gb slice of an H100 (60 of its 132 SMs): on the whole GPU's scale
    assert by_job["5101"]["sm_active_p95_now"] == pytest.approx(0.99 * 60 / 132)
    assert doc["gpus_released"] == result.gpus_released


# --- the cap an MPS client runs under, as measured (gpu_job_mps_active_thread_ratio) ------------

# last week's plan told 5101 to run under MPS at 20 %; on Kubernetes it runs at the device
# plugin's 100/3 (three replicas), which the exporter measures
TOLD_20 = {
    "recommendation": "mps",
    "sharing": "exclusive",
    "action": "change",
    "mps_active_thread_percentage": 20,
}
RUNS_33 = {"sharing": "mps", "sizing_percentile": "p95", "mps_thread_cap_now_pct": 100 / 3}


def _week_of(analysis, last, **now):
    jobs, plan = previous(last, {"5101": TOLD_20})
    return compare(_with(analysis, "5101", **now), jobs, plan, str(last))


def _outcome_of(analysis, last, **now):
    return next(o for o in _week_of(analysis, last, **now).applied if o.job_id == "5101")


def test_a_client_told_20_that_runs_at_33_and_uses_30_is_not_at_its_cap(week):
    outcome = _outcome_of(*week, sm_active_p95=0.30, **RUNS_33)
    assert outcome.status == "applied" and "at its cap" not in outcome.warning


def test_a_client_that_runs_at_33_and_uses_33_is_at_its_cap(week):
    outcome = _outcome_of(*week, sm_active_p95=0.33, **RUNS_33)
    assert outcome.status == "roll back" and "at its cap (p95 activity 33% of 33%" in outcome.warning


def test_without_a_measured_cap_a_client_is_judged_against_the_cap_it_was_told(week):
    outcome = _outcome_of(*week, sm_active_p95=0.30, sharing="mps", sizing_percentile="p95")
    assert outcome.status == "roll back" and "at its cap (p95 activity 30% of 20%" in outcome.warning
    assert "runs at" not in outcome.now and outcome.cap_now_pct is None


def test_the_jobs_line_says_it_runs_at_another_cap_than_the_plan_asked(week, tmp_path):
    analysis, last = week
    jobs, plan = previous(last, {"5101": TOLD_20})
    now = _with(analysis, "5101", sm_active_p95=0.10, job_source="kubernetes", **RUNS_33)
    result = compare(now, jobs, plan, str(last))
    (outcome,) = [o for o in result.applied if o.job_id == "5101"]
    note = "runs at 33 % (the device plugin's 100/3), the plan asked 20 %"
    assert outcome.now.endswith(note) and outcome.status == "applied"
    assert note in markdown(now, previous=result)
    write_report(now, tmp_path / "now", previous=result)
    actions = json.loads((tmp_path / "now" / "week.json").read_text())["actions"]
    action = next(a for a in actions if a["job_id"] == "5101")
    assert (
        action["mps_thread_cap_now_pct"] == pytest.approx(100 / 3)
        and action["mps_thread_cap_asked_pct"] == 20
    )
    # jobs.json carries the cap each job runs under (null where none was measured: no MPS client)
    rows = {j["job_id"]: j for j in json.loads((tmp_path / "now" / "jobs.json").read_text())["jobs"]}
    assert rows["5101"]["mps_thread_cap_now_pct"] == pytest.approx(100 / 3)
    assert all(r["mps_thread_cap_now_pct"] is None for r in rows.values() if r["sharing"] != "mps")


def test_a_job_moved_between_mig_slices_is_compared_on_its_whole_gpus_scale():
    # the same SMs' worth of work: 20 % of a 3g slice's 42 SMs, 60 % of a 1g slice's 14
    then = {"sm_active_p95": 0.2, "device_sms": 42, "mig_profile_now": "3g.40gb", "gpu_model": "A100-80GB"}
    now = {"sm_active_p95": 0.6, "device_sms": 14, "mig_profile_now": "1g.10gb", "gpu_model": "A100-80GB"}
    whole = {"sm_active_p95": 0.0778, "device_sms": 108, "gpu_model": "A100-80GB"}
    assert on_whole_gpu(then) == pytest.approx(on_whole_gpu(now)) == pytest.approx(8.4 / 108)
    assert on_whole_gpu(whole) == 0.0778  # a whole GPU's figure is already on its scale


def _told(job_id: str, memory_gib: float, threads: int) -> dict[str, object]:
    """Last week's row of one of alice's `train` jobs, told to run under MPS on GPU-b."""
    return {
        "job_id": job_id,
        "workload": "slurm alice/train",
        "recommendation": "mps",
        "proposed_node": "n1",
        "proposed_gpu": "GPU-b",
        "memory_peak_bytes": memory_gib * 2**30,
        "mps_active_thread_percentage": threads,
    }


def _now(memory_gib: float, threads: float) -> dict[str, object]:
    return {
        "current_node": "n1",
        "current_gpu": "GPU-b",
        "sharing": "mps",
        "memory_peak_bytes": memory_gib * 2**30,
        "mps_thread_cap_now_pct": threads,
    }


def test_renamed_jobs_of_one_workload_are_paired_with_the_successor_that_runs_as_each_was_told():
    """Resubmitted, 4401 (5 GiB, told 10 %) became 4404 and 4402 (30 GiB, 37 %) 4403: in id order
    4401 would take 4403 and be judged on its sibling's memory."""
    gone = [_told("4401", 5, 10), _told("4402", 30, 37)]
    now = {"4403": _now(30, 37), "4404": _now(5, 10)}
    paired = pair_successors(gone, {"slurm alice/train": ["4403", "4404"]}, now)
    assert paired == {"4401": "4404", "4402": "4403"}


def test_a_renamed_job_takes_a_successor_only_of_its_own_workload_and_each_once():
    gone = [_told("4401", 5, 10), _told("4402", 5, 10)]
    paired = pair_successors(gone, {"slurm alice/train": ["4404"], "other": ["9"]}, {"4404": _now(5, 10)})
    assert list(paired.values()) == ["4404"]
