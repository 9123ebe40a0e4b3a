"""A fleet already running its plan gets no further change (issue 30 item 4), on fleets found by
hunting for ones that did not reach it (tests/data/fixedpoint/, each file's header says what it
exercises). The loop of test_fixed_point.py: week 1 simulated and reported, its plan applied by
`gpulens sim apply-plan` over the fleet's scenarios at once (jobs the plan moves across nodes move
between them), week 2 simulated and reported with `--previous`: no config file, no `change` or
`reclaim`, and every action of week 1 reported `applied` (no `roll back`, none `not applied` or
`superseded`: the plan was applied as written, item 6).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulens.cli import main
from gpulens.sim.applyfiles import apply_plan_files
from gpulens.sim.history import simulate

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data" / "fixedpoint"
DAY, STEP, START = 86400.0, 300.0, 1_750_000_200.0
# fleet -> its nodes' scenarios (one file a node)
FLEETS: dict[str, tuple[str, ...]] = {
    "pod-starts-in-window": ("pod-starts-in-window.yaml",),
    "mig-to-mps-bursty-neighbour": ("mig-to-mps-bursty-neighbour.yaml",),
    "mps-plugin-duty-cycled-trainer": ("mps-plugin-duty-cycled-trainer.yaml",),
    "cross-node": ("cross-node-a.yaml", "cross-node-b.yaml"),
    "notebook-under-mps": ("notebook-under-mps-a.yaml", "notebook-under-mps-b.yaml"),
    "downsize-a100-to-l4": ("downsize-a100-to-l4-a.yaml", "downsize-a100-to-l4-b.yaml"),
    "mig-profiles-to-mps": ("mig-profiles-to-mps.yaml",),
    "cronjob-runs": ("cronjob-runs.yaml",),
    "vllm-onto-plugin-mps": ("vllm-onto-plugin-mps.yaml",),
    "notebooks-beside-vllm": ("notebooks-beside-vllm.yaml",),
    "three-node-moves": ("three-node-moves-a.yaml", "three-node-moves-b.yaml", "three-node-moves-c.yaml"),
    "k8s-mig-and-whole": ("k8s-mig-and-whole.yaml",),
    "timesliced-share-drift": ("timesliced-share-drift.yaml",),
    "plugin-mps-near-split": ("plugin-mps-near-split.yaml",),
    "plugin-mps-over-split": ("plugin-mps-over-split.yaml",),
    "slurm-array-in-window": ("slurm-array-in-window.yaml",),
    "timesliced-wide-onto-mps": ("timesliced-wide-onto-mps.yaml",),
    "nonoverlap-sharers": ("nonoverlap-sharers.yaml",),
    "same-name-slurm-jobs": ("same-name-slurm-jobs.yaml",),
    "plugin-mps-leak-to-timeslicing": ("plugin-mps-leak-to-timeslicing.yaml",),
    "timesliced-one-ends": ("timesliced-one-ends.yaml",),
    "mixed-orch": ("mixed-orch-a.yaml", "mixed-orch-b.yaml"),
}
# fleets that cannot reach a fixed point yet, each with the reason and how it fails (strict: once
# it passes, the entry must go)
NOT_YET: dict[str, tuple[str, type[Exception]]] = {}


def _fleets() -> list[object]:
    return [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=NOT_YET[n][0], raises=NOT_YET[n][1]))
        if n in NOT_YET
        else n
        for n in FLEETS
    ]


def _week(scenarios: list[str], root: Path, start: float, *previous: str) -> Path:
    simulate(scenarios, duration_s=DAY, out=root / "history", step_s=STEP, start=start)
    report = root / "report"
    assert main(["report", "--history", str(root / "history"), "--out", str(report), *previous]) == 0
    return report


def test_every_fixed_point_scenario_is_in_a_fleet():
    listed = {name for files in FLEETS.values() for name in files}
    assert listed == {p.name for p in DATA.glob("*.yaml")}


@pytest.mark.parametrize("name", _fleets())
def test_a_fleet_running_its_plan_gets_no_further_change(name, tmp_path):
    nodes = [DATA / f for f in FLEETS[name]]
    week1 = _week([str(p) for p in nodes], tmp_path / "week1", START)
    applied = apply_plan_files([str(p) for p in nodes], week1, tmp_path / "week2-scenarios")
    week2 = _week([s.source for s in applied], tmp_path / "week2", START + 7 * DAY, "--previous", str(week1))
    jobs = json.loads((week2 / "jobs.json").read_text())["jobs"]
    changed = {j["job_id"] for j in jobs if j["action"] in ("change", "reclaim")}
    actions = json.loads((week2 / "week.json").read_text())["actions"]
    not_applied = [(a["job_id"], a["status"]) for a in actions if a["status"] != "applied"]
    assert (changed, (week2 / "config").exists(), not_applied) == (set(), False, [])
