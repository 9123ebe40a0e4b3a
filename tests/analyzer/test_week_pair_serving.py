"""A served job moved onto a shared GPU, week over week: its latency decides (issue 30 item 6).

tests/data/weekpair/serving-week1.yaml runs a low-traffic vLLM server and a notebook on GPUs of
their own; week 1's plan time-slices them on one GPU. Week 2 runs the plan as applied: with the
notebook as light as before the server's p95 latency holds; with the notebook's cells grown
(`grow`), the server waits for them and its p95 latency rises past `serving.max_latency_increase`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpulens.cli import main
from gpulens.sim.applyfiles import apply_plan_files
from gpulens.sim.history import simulate

pytestmark = pytest.mark.slow

WEEK1 = Path(__file__).resolve().parents[1] / "data" / "weekpair" / "serving-week1.yaml"
DAY, STEP, START = 86400.0, 300.0, 1_750_000_200.0
SERVER = "llm/chat-vllm-6f7b9c8d5-q4x2z"
NOTEBOOK = "research/notebook-alice-0"


def _report(history: Path, out: Path, *extra: str) -> Path:
    assert main(["report", "--history", str(history), "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def week1(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serving-week1")
    simulate(str(WEEK1), duration_s=DAY, out=root / "history", step_s=STEP, start=START)
    return _report(root / "history", root / "report")


def _week2(week1: Path, root: Path, grow: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Week 2's outcome per job of last week's actions."""
    apply_plan_files(str(WEEK1), week1, root / "week2.yaml", grow=grow)
    simulate(
        str(root / "week2.yaml"), duration_s=DAY, out=root / "history", step_s=STEP, start=START + 7 * DAY
    )
    report = _report(root / "history", root / "report", "--previous", str(week1))
    return {a["job_id"]: a for a in json.loads((report / "week.json").read_text())["actions"]}


def _jobs(report: Path) -> dict[str, dict[str, Any]]:
    return {j["job_id"]: j for j in json.loads((report / "jobs.json").read_text())["jobs"]}


def test_week_one_time_slices_the_server_with_the_notebook(week1):
    jobs = _jobs(week1)
    assert jobs[SERVER]["recommendation"] == jobs[NOTEBOOK]["recommendation"] == "time-slicing"
    assert jobs[SERVER]["serving_e2e_p95_s"] > 0 and jobs[SERVER]["serving_ttft_p95_s"] > 0


def test_a_moved_server_whose_latency_held_is_applied(week1, tmp_path):
    actions = _week2(week1, tmp_path, {})
    assert actions[SERVER]["status"] == "applied" and actions[SERVER]["regression"] == ""


def test_a_moved_server_whose_latency_rose_gets_a_roll_back_with_its_command(week1, tmp_path):
    actions = _week2(week1, tmp_path, {NOTEBOOK: 8.0})  # the notebook's cells now fill the GPU
    server = actions[SERVER]
    assert server["status"] == "roll back"
    assert "serves slower" in server["regression"] and "serving.max_latency_increase" in server["regression"]
    assert "at its" not in server["regression"]  # its own activity is as before: the wait is the cause
    command = server["rollback"]
    assert command.startswith("sh ") and Path(command[3:]).parent == week1 / "config"
    assert actions[NOTEBOOK]["status"] == "applied"
