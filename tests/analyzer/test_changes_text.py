"""The proposed side of a job's "current -> proposed" line."""

from __future__ import annotations

from collections import namedtuple
from types import SimpleNamespace

from gpulens.analyzer.changes import Action, _proposed_text, finding
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.thresholds import load_thresholds

GIB = 1024**3


def _fix(sharing: str) -> str:
    row = SimpleNamespace(sharing=sharing, uuids="GPU-1", instance="n1", gpu_model="A100")
    return _proposed_text(row, Kind.MPS, Action.FIX, "memory hog: holds 30 GiB", "A100", "n1", "GPU-1")


def test_a_job_on_a_whole_gpu_shares_once_its_finding_is_fixed():
    assert _fix("exclusive") == "stays as it is until its memory hog is fixed (then it can share)"


def test_a_job_that_shares_already_is_not_told_it_can_share_later():
    assert _fix("mps") == "stays as it is (it shares its GPU already; fixing its memory hog would free more)"
    assert _fix("time_slicing").startswith("stays as it is (it shares its GPU already")


def _holding(sharing: str) -> str:
    """The finding of a job holding 7 of its device's 9.5 GiB at 15 % mean activity."""
    fields = {
        "gpus": 1,
        "memory_leak": "",
        "false_saturation": False,
        "false_saturation_hint": "",
        "memory_peak_bytes": 7 * GIB,
        "device_memory_bytes": 9.5 * GIB,
        "sm_active_mean": 0.15,
        "sharing": sharing,
    }
    return finding(namedtuple("Row", list(fields))(**fields), load_thresholds())


def test_a_job_holding_most_of_its_whole_gpu_at_low_activity_is_a_memory_hog():
    assert _holding("exclusive").startswith("memory hog: holds 7.0 GiB (74% of the GPU)")


def test_a_job_on_a_mig_slice_sized_to_hold_its_peak_is_no_memory_hog():
    assert _holding("mig") == ""
