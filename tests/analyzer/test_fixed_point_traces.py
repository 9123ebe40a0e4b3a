"""A fleet already running its plan gets no further change (issue 30 item 4), on both real traces.

Per trace (read from the shared copy, never copied into the repository): import, report, the
history rewritten into the fleet running the report's plan (`gpulens sim apply-plan --history`),
report again with `--previous`. The second report must emit no config file and give no job a
`change` or `reclaim` action. For the requests-only v2023 trace the proposed state is the
fractional requests packed as planned (each such pod on its planned shared GPU): its report must
then find nothing more to free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpulens.cli import main
from tests.analyzer.test_traces import GENAI, V2023

pytestmark = pytest.mark.slow


def _report(history: Path, out: Path, *previous: str) -> dict[str, Any]:
    assert main(["report", "--history", str(history), "--out", str(out), *previous]) == 0
    plan: dict[str, Any] = json.loads((out / "plan.json").read_text())
    return plan


def _applied(history: Path, report: Path, out: Path) -> Path:
    args = ["sim", "apply-plan", "--history", str(history), "--report", str(report), "--out", str(out)]
    assert main(args) == 0
    return out


def _changes(report: Path) -> set[str]:
    jobs = json.loads((report / "jobs.json").read_text())["jobs"]
    return {j["job_id"] for j in jobs if j.get("action") in ("change", "reclaim")}


def test_genai_fleet_running_its_plan_gets_no_further_change(tmp_path):
    if not GENAI.is_dir():
        pytest.skip("shared traces not present")
    history = tmp_path / "history"
    assert (
        main(
            [
                "import-trace",
                "alibaba-genai-2026",
                str(GENAI),
                "--out",
                str(history),
                "--gpu-model",
                "H100-80GB",
            ]
        )
        == 0
    )
    week1 = tmp_path / "week1"
    _report(history, week1)
    assert _changes(week1) and (week1 / "config").is_dir()  # there is a plan to apply
    applied = _applied(history, week1, tmp_path / "applied")
    week2 = tmp_path / "week2"
    _report(applied, week2, "--previous", str(week1))
    assert (_changes(week2), (week2 / "config").exists()) == (set(), False)


def test_v2023_requests_packed_as_planned_free_nothing_more(tmp_path):
    if not V2023.is_dir():
        pytest.skip("shared traces not present")
    history = tmp_path / "history"
    assert main(["import-trace", "alibaba-gpu-v2023", str(V2023), "--out", str(history)]) == 0
    week1 = tmp_path / "week1"
    plan1 = _report(history, week1)
    assert plan1["gpus_freed"] > 0
    plan2 = _report(_applied(history, week1, tmp_path / "applied"), tmp_path / "week2")
    assert (plan2["gpus_before"], plan2["gpus_freed"]) == (plan1["gpus_after"], 0)
    assert [e["jobs"] for e in plan2["layout"]] == [e["jobs"] for e in plan1["layout"]]
    assert not (tmp_path / "week2" / "config").exists()
