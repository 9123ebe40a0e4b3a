"""A fleet already running its plan gets no further change (issue 30 item 4), on every shipped scenario.

Per scenario in sim/scenarios/ (found there, so a new one is covered): week 1 simulated and
reported, its plan applied by `gpulens sim apply-plan`, week 2 simulated and reported with
`--previous`. Week 2 must emit no config file, give no job a `change` or `reclaim` action and
find no regression in what was applied (no `roll back`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpulens.cli import main
from gpulens.sim.applyfiles import apply_plan_files
from gpulens.sim.history import simulate
from gpulens.sim.scenariofile import BUILTIN_DIR

pytestmark = pytest.mark.slow

DAY, STEP, START = 86400.0, 300.0, 1_750_000_200.0
# a shorter window where a day is slow to simulate (large: 200 processes on 56 MIG instances)
WINDOW = {"large": 6 * 3600.0}
# scenarios that cannot reach a fixed point yet, each with the reason it is real (strict: once it
# passes, the entry must go)
NOT_YET: dict[str, str] = {}


def _scenarios() -> list[Any]:  # scenario names, or pytest.param for the expected failures
    names = sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))
    return [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=NOT_YET[n])) if n in NOT_YET else n
        for n in names
    ]


def _week(scenario: str, root: Path, start: float, window: float, *previous: str) -> Path:
    simulate(scenario, duration_s=window, out=root / "history", step_s=STEP, start=start)
    report = root / "report"
    assert main(["report", "--history", str(root / "history"), "--out", str(report), *previous]) == 0
    return report


def _changes(report: Path) -> set[str]:
    jobs = json.loads((report / "jobs.json").read_text())["jobs"]
    return {j["job_id"] for j in jobs if j["action"] in ("change", "reclaim")}


def test_there_are_scenarios_to_check():
    assert len(_scenarios()) >= 6


@pytest.mark.parametrize("name", _scenarios())
def test_a_fleet_running_its_plan_gets_no_further_change(name, tmp_path):
    window = WINDOW.get(name, DAY)
    week1 = _week(name, tmp_path / "week1", START, window)
    apply_plan_files(name, week1, tmp_path / "week2.yaml")
    week2 = _week(
        str(tmp_path / "week2.yaml"), tmp_path / "week2", START + 7 * DAY, window, "--previous", str(week1)
    )
    assert (_changes(week2), (week2 / "config").exists()) == (set(), False)
    # and nothing it applied reads as a regression: a job is measured the same way whole, on a
    # slice and under its MPS cap, so a client that runs as sized does not look like it binds
    week = json.loads((week2 / "week.json").read_text())
    assert [a["job_id"] for a in week["actions"] if a["status"] == "roll back"] == []
