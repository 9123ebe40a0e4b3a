"""The proposed side of a job's "current -> proposed" line."""

from __future__ import annotations

from types import SimpleNamespace

from gpulens.analyzer.changes import Action, _proposed_text
from gpulens.analyzer.kinds import Kind


def _fix(sharing: str) -> str:
    row = SimpleNamespace(sharing=sharing, uuids="GPU-1", instance="n1", gpu_model="A100")
    return _proposed_text(row, Kind.MPS, Action.FIX, "memory hog: holds 30 GiB", "A100", "n1", "GPU-1")


def test_a_job_on_a_whole_gpu_shares_once_its_finding_is_fixed():
    assert _fix("exclusive") == "stays as it is until its memory hog is fixed (then it can share)"


def test_a_job_that_shares_already_is_not_told_it_can_share_later():
    assert _fix("mps") == "stays as it is (it shares its GPU already; fixing its memory hog would free more)"
    assert _fix("time_slicing").startswith("stays as it is (it shares its GPU already")
