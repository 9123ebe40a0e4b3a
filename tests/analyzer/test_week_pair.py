"""Week 1 -> the plan applied the way each tool applies it -> week 2 with `--previous` (issue 30).

Week 1 is two Kubernetes nodes simulated together: tests/data/weekpair/week1.yaml runs two small
pods on MIG 3g.40gb slices and a busy trainer, week1-shared.yaml four under-used pods on whole GPUs
(its own node, where the device plugin's MPS applies). `gpulens sim apply-plan` writes each node's
week 2 as an SRE who applied week 1's plan runs it (pods rolled out under new names, MPS clients
under the device plugin's control daemon, the MIG GPU re-sliced, GPUs left empty); both are
simulated together and reported on against week 1's report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpulens.cli import main
from gpulens.sim.applyfiles import apply_plan_files
from gpulens.sim.applyplan import job_key
from gpulens.sim.history import simulate
from gpulens.sim.scenario import Scenario
from gpulens.sim.scenariofile import load_scenario

pytestmark = pytest.mark.slow

WEEK1 = Path(__file__).resolve().parents[1] / "data" / "weekpair" / "week1.yaml"
PAIR = (WEEK1, WEEK1.parent / "week1-shared.yaml")  # k8s-weekpair-1 (MIG, trainer), -2 (the MPS pods)
DAY, STEP, START = 86400.0, 300.0, 1_750_000_200.0
GROWN = "ml-serving/embedder-0"


def _report(history: Path, out: Path, *extra: str) -> Path:
    assert main(["report", "--history", str(history), "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def week1(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("week1")
    simulate([str(p) for p in PAIR], duration_s=DAY, out=root / "history", step_s=STEP, start=START)
    return _report(root / "history", root / "report")


def _week2(week1: Path, root: Path, grow: dict[str, float] | None = None) -> tuple[list[Scenario], Path]:
    """Each node's scenario with the plan applied (the one report: each takes its own node's part),
    simulated together, reported on with week 1's report as --previous."""
    paths = [root / f"{source.stem}-week2.yaml" for source in PAIR]
    scenarios = [
        apply_plan_files(
            str(source), week1, path, grow={k: v for k, v in (grow or {}).items() if k in _jobs(source)}
        )
        for source, path in zip(PAIR, paths, strict=True)
    ]
    simulate(
        [str(p) for p in paths], duration_s=DAY, out=root / "history", step_s=STEP, start=START + 7 * DAY
    )
    return scenarios, _report(root / "history", root / "report", "--previous", str(week1))


def _jobs(source: Path) -> set[str]:
    """The jobs of one node's scenario (apply-plan grows only jobs of the scenario it is given)."""
    return {job_key(p) or "" for p in load_scenario(source).processes}


@pytest.fixture(scope="module")
def applied(week1, tmp_path_factory) -> tuple[list[Scenario], Path]:
    return _week2(week1, tmp_path_factory.mktemp("week2"))


@pytest.fixture(scope="module")
def grown(week1, tmp_path_factory) -> tuple[list[Scenario], Path]:
    return _week2(week1, tmp_path_factory.mktemp("week2-grown"), {GROWN: 3.0})


def _week(report: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((report / "week.json").read_text())
    return doc


def _changes(report: Path) -> set[str]:
    """Jobs the report moves or re-sizes (a `fix` is advice to the job's owner: it stays put)."""
    jobs = json.loads((report / "jobs.json").read_text())["jobs"]
    return {j["job_id"] for j in jobs if j["action"] in ("change", "reclaim")}


def test_week_one_proposes_changes_to_apply(week1):
    assert len(_changes(week1)) >= 5 and (week1 / "config").is_dir()


def test_a_fleet_running_the_plan_gets_no_further_change(applied):
    _, report = applied
    assert not (report / "config").exists() and not _changes(report)
    assert "no configuration file is emitted" in (report / "summary.md").read_text()


def test_every_applied_action_is_reported_applied_through_the_rollout(week1, applied):
    _, report = applied
    actions = {a["job_id"]: a for a in _week(report)["actions"]}
    assert set(actions) == _changes(week1)
    assert {a["status"] for a in actions.values()} == {"applied"}
    renamed = [a for a in actions.values() if "(now " in a["now"]]
    assert renamed  # Deployment and Job pods came back under new names and were still followed
    assert _week(report)["ended"] == []


def test_gpus_released_are_the_gpus_the_applied_plan_left_empty(week1, applied):
    scenarios, report = applied
    empty = {(s.hostname, g.index) for s in scenarios for g in s.gpus} - {
        (s.hostname, p.gpu) for s in scenarios for p in s.processes
    }
    week = _week(report)
    assert empty and week["gpus_released"] == len(empty)
    assert week["gpus_promised"] == json.loads((week1 / "plan.json").read_text())["gpus_freed"]


def test_the_headline_says_how_many_reclaimable_gpus_ran_no_job_since_last_week(applied):
    scenarios, report = applied
    empty = {(s.hostname, g.index) for s in scenarios for g in s.gpus} - {
        (s.hostname, p.gpu) for s in scenarios for p in s.processes
    }
    (head,) = [
        line for line in (report / "summary.md").read_text().splitlines() if "GPUs reclaimable now" in line
    ]
    assert f"{len(empty)} of them ran no job all window (Since last week)" in head


def test_a_moved_job_that_binds_its_cap_gets_a_roll_back_with_its_command(week1, grown):
    scenarios, report = grown
    # grown past the device plugin's share: 100 / 4 clients = 25 % of the threads
    (client,) = [p for s in scenarios for p in s.processes if job_key(p) == GROWN]
    assert client.sm_cap == pytest.approx(0.25) and client.workload.sm > client.sm_cap
    actions = {a["job_id"]: a for a in _week(report)["actions"]}
    moved = actions[GROWN]
    assert moved["status"] == "roll back" and "at its cap" in moved["regression"]
    command = moved["rollback"]
    assert command.startswith("sh ") and Path(command[3:]).is_file()
    assert Path(command[3:]).parent == week1 / "config"
    # only the job made to outgrow its cap regresses: the others run as sized
    others = [a["status"] for job, a in actions.items() if job != GROWN]
    assert others and set(others) == {"applied"}
