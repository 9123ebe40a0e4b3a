"""The week pair on Slurm: applying the plan resubmits each moved job under a new id (issue 30 item 5).

tests/data/weekpair/slurm-week1.yaml runs two tasks of alice's `sweep` array, bob's `embed-batch`
and carol's unnamed job on whole GPUs, and a busy trainer. The plan packs the four as MPS clients;
`gpulens sim apply-plan` writes week 2 with each moved job resubmitted (new id, same user and
name; the array under one new array id). Week over week follows a named job by (user, name) and
its array task; a job without a name has only its id, which changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpulens.cli import main
from gpulens.sim.applyfiles import apply_plan_files
from gpulens.sim.history import simulate
from gpulens.sim.scenario import Scenario, SlurmJob

pytestmark = pytest.mark.slow

WEEK1 = Path(__file__).resolve().parents[1] / "data" / "weekpair" / "slurm-week1.yaml"
DAY, STEP, START = 86400.0, 300.0, 1_750_000_200.0
NAMED = {"6001_0": "sweep", "6001_1": "sweep", "6010": "embed-batch"}
UNNAMED = "6011"


def _report(history: Path, out: Path, *extra: str) -> Path:
    assert main(["report", "--history", str(history), "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Scenario, Path]:
    root = tmp_path_factory.mktemp("slurm-pair")
    simulate(str(WEEK1), duration_s=DAY, out=root / "h1", step_s=STEP, start=START)
    week1 = _report(root / "h1", root / "r1")
    scenario = apply_plan_files(str(WEEK1), week1, root / "week2.yaml")
    simulate(str(root / "week2.yaml"), duration_s=DAY, out=root / "h2", step_s=STEP, start=START + 7 * DAY)
    return week1, scenario, _report(root / "h2", root / "r2", "--previous", str(week1))


def _jobs(report: Path) -> dict[str, dict[str, Any]]:
    return {j["job_id"]: j for j in json.loads((report / "jobs.json").read_text())["jobs"]}


def _actions(report: Path) -> dict[str, dict[str, Any]]:
    return {a["job_id"]: a for a in json.loads((report / "week.json").read_text())["actions"]}


def test_week_one_moves_the_named_and_the_unnamed_jobs(pair):
    week1, _, _ = pair
    jobs = _jobs(week1)
    assert {j for j, row in jobs.items() if row["action"] == "change"} == {*NAMED, UNNAMED}


def test_jobs_json_carries_each_jobs_name_and_workload(pair):
    week1, _, _ = pair
    jobs = _jobs(week1)
    assert {j: jobs[j]["job_name"] for j in NAMED} == NAMED
    assert jobs["6001_1"]["workload"] == "slurm alice/sweep[1]"
    assert jobs["6010"]["workload"] == "slurm bob/embed-batch"
    assert jobs[UNNAMED]["workload"] == UNNAMED


def test_apply_plan_resubmits_moved_jobs_with_their_names_under_new_ids(pair):
    _, scenario, _ = pair
    jobs = {p.job.job_id: p.job.name for p in scenario.processes if isinstance(p.job, SlurmJob)}
    assert not set(jobs) & {*NAMED, UNNAMED}  # every moved job has a new id
    assert sorted(n for n in jobs.values() if n != "pretrain-llm") == sorted([*NAMED.values(), ""])
    sweep = sorted(j for j, name in jobs.items() if name == "sweep")
    assert len({j.split("_")[0] for j in sweep}) == 1  # the array resubmitted as one new array
    assert [j.split("_")[1] for j in sweep] == ["0", "1"]  # its tasks keep their index


def test_named_jobs_resubmitted_under_new_ids_are_reported_applied_with_their_new_ids(pair):
    _, scenario, week2 = pair
    new_ids = {f"(now {p.job.job_id})" for p in scenario.processes if isinstance(p.job, SlurmJob)}
    actions = _actions(week2)
    assert set(actions) == set(NAMED)
    assert {a["status"] for a in actions.values()} == {"applied"}
    assert all(a["now"].endswith(tuple(new_ids)) for a in actions.values())
    assert actions["6001_1"]["now"].endswith("_1)")  # each array task follows its own task


def test_a_job_submitted_without_a_name_cannot_be_followed_and_is_reported_ended(pair):
    _, _, week2 = pair
    assert json.loads((week2 / "week.json").read_text())["ended"] == [UNNAMED]
