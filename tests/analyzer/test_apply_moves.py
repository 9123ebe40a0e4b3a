"""The plan's changes written into the recommendations: every column as a per-job write would."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from gpulens.analyzer.changes import apply_moves
from gpulens.analyzer.plan import Plan


def _plan(moved: dict[str, dict[str, Any]]) -> Plan:
    plan = Plan(0, 0, 0, {}, 0.0, 0.0, 168.0, [], {})
    plan.moved = moved
    return plan


def _recs() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "job_id": pd.array(["a", "b", "c", "d"], dtype="string[pyarrow]"),
            "recommendation": pd.array(["mps", "mig", "mps", "exclusive"], dtype="string[pyarrow]"),
            "reason": pd.array(["ra", "rb", "rc", "rd"], dtype="string[pyarrow]"),
            "mig_profile": pd.array([None, "1g.10gb", None, None], dtype="string[pyarrow]"),
            "mps_active_thread_percentage": [50.0, math.nan, 25.0, math.nan],
            "mps_pinned_memory_limit_bytes": [1e9, math.nan, 2e9, math.nan],
        }
    )


def test_moved_jobs_take_the_plans_settings_and_say_why() -> None:
    out = apply_moves(
        _recs(),
        _plan(
            {
                "a": {"recommendation": "time-slicing"},
                "b": {"recommendation": "mps", "mps_active_thread_percentage": 30.0, "note": "no room"},
                "c": {"recommendation": "mps", "kept": True},
                "gone": {"recommendation": "exclusive"},
            }
        ),
    )
    rows = out.set_index("job_id")
    assert rows.loc["a", "recommendation"] == "time-slicing"
    assert math.isnan(rows.loc["a", "mps_active_thread_percentage"]) and pd.isna(rows.loc["b", "mig_profile"])
    alone = "time-slicing beside other jobs (a GPU shared by it alone would save nothing)"
    assert rows.loc["a", "reason"] == f"ra; plan: {alone}"
    assert (
        rows.loc["b", "reason"] == "rb; plan: no room"
        and rows.loc["b", "mps_active_thread_percentage"] == 30.0
    )
    assert rows.loc["c", "reason"] == "rc; plan: it stays as it runs now"
    assert rows.loc["c", "mps_pinned_memory_limit_bytes"] == 2e9
    assert rows["kept_by_plan"].tolist() == [False, False, True, False]
    assert rows.loc["d", "reason"] == "rd" and rows.loc["d", "recommendation"] == "exclusive"
