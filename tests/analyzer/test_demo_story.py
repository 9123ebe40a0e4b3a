"""The story `make demo` tells: its week (`typical-fleet`) is a fleet as usually found, and the
report finds savings an SRE can apply. Pins the story, not the report's text.

Job ids are the scenario's (sim/scenarios/typical-fleet.yaml): 7101 the heavy trainer,
7102 the bursty inference service, 7103 the memory hog, 7104-7106 small jobs on whole GPUs, 7107
the leaking notebook; GPU 7 runs nothing.
"""

from __future__ import annotations

import pytest

from gpulens.analyzer import report_model
from gpulens.analyzer.history import read_history
from gpulens.analyzer.pipeline import Analysis, analyze_history
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.devtools.demo import Options
from gpulens.sim.history import simulate

TRAINER, SERVICE, HOG, LEAK = "7101", "7102", "7103", "7107"
SMALL = ("7104", "7105", "7106")


@pytest.fixture(scope="module")
def week(tmp_path_factory) -> Analysis:
    # half a day keeps the test short; the demo's week gives the same story (docs/analyzer.md)
    path = tmp_path_factory.mktemp("demo") / "history"
    simulate(Options.history_scenario, duration_s=12 * 3600, out=path, step_s=300, seed=0)
    return analyze_history(read_history(path), load_thresholds(), with_archetypes=False)


def test_the_demo_simulates_the_typical_fleet():
    assert Options.history_scenario == "typical-fleet"


def test_the_report_frees_gpus(week):
    assert week.plan.gpus_before == 8
    assert week.plan.gpus_freed >= 1
    assert report_model.build(week).gpus_reclaimable == week.plan.gpus_freed


def test_the_idle_gpu_is_reclaimable(week):
    idle = [g for g in week.plan.freed if g["why"] == "no job in the window"]
    assert len(idle) == 1
    model = report_model.build(week)
    assert 7 in model.reclaimable["gpu-node-01"]


def test_the_heavy_trainer_keeps_its_gpu_to_itself(week):
    row = week.recs.set_index("job_id").loc[TRAINER]
    assert row["recommendation"] == "exclusive" and row["action"] == "keep"
    assert row["proposed_gpu"] == row["current_gpu"]
    assert TRAINER not in [a["job_id"] for a in week.top_actions(20)]


def test_the_memory_hog_is_listed_with_what_to_do(week):
    (hog,) = [a for a in week.top_actions(20) if a["job_id"] == HOG]
    assert hog["action"] == "fix" and hog["what_to_do"].startswith("memory hog")
    assert hog["gpu_hours_recovered"] > 0


def test_the_small_jobs_share_instead_of_holding_whole_gpus(week):
    recs = week.recs.set_index("job_id")
    assert set(recs.loc[list(SMALL), "proposed_mode"]) <= {"mps", "time-slicing", "mig"}
    assert set(recs.loc[list(SMALL), "action"]) == {"change"}


def test_the_bursty_service_shares_with_a_cap_above_its_p99(week):
    row = week.recs.set_index("job_id").loc[SERVICE]
    assert row["proposed_mode"] == "mps" and row["action"] == "change"
    assert row["mps_active_thread_percentage"] / 100 >= row["sm_active_p99"]


def test_only_real_changes_are_listed(week):
    actions = week.top_actions(20)
    assert actions and all(a["gpu_hours_recovered"] > 0 or a["risk_fixed"] for a in actions)
    hours = [a["gpu_hours_recovered"] for a in actions]
    assert hours == sorted(hours, reverse=True)


def test_gpu_hours_recovered_are_the_freed_gpus_for_the_whole_window(week):
    model = report_model.build(week, report_model.parse_prices(["default=2"]))
    freed = sum(len(indices) for indices in model.reclaimable.values())
    assert freed >= 1 and model.window_hours > 0
    assert model.gpu_hours_recovered == pytest.approx(freed * model.window_hours)
    assert model.cost_recovered == pytest.approx(2 * freed * model.window_hours)


def test_what_fixing_the_hog_would_recover_is_counted_apart_from_the_plan(week):
    model = report_model.build(week)
    fixes = [a for a in report_model.ranked(week, None) if a.get("action") == "fix"]
    assert any(a["job_id"] == HOG for a in fixes)
    assert model.gpu_hours_if_fixed == pytest.approx(sum(a["gpu_hours_recovered"] for a in fixes))
