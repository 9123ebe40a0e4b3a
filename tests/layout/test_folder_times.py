"""The per-folder time summary CI prints (issue 33 item 7)."""

from __future__ import annotations

import pytest

from tests.support.folder_times import FolderTimes, folder_of


def test_a_test_counts_toward_the_folder_under_tests_that_holds_it():
    assert folder_of("tests/analyzer/test_plan.py::test_x[1]") == "tests/analyzer"
    assert folder_of("tests/alerts/sub/test_y.py::test_z") == "tests/alerts"
    assert folder_of("tests/test_top.py::test_t") == "tests"


def test_setup_call_and_teardown_add_up_per_folder_slowest_first() -> None:
    times = FolderTimes()
    for nodeid, duration in [
        ("tests/a/test_1.py::t", 1.0),
        ("tests/a/test_1.py::t", 0.5),  # its teardown
        ("tests/b/test_2.py::u", 4.0),
    ]:
        report = pytest.TestReport(nodeid, ("", None, ""), {}, "passed", None, "call", duration=duration)
        times.pytest_runtest_logreport(report)
    lines = times.lines()
    assert lines[1].split()[:3] == ["tests/b", "1", "4.0"]
    assert lines[2].split()[:3] == ["tests/a", "1", "1.5"]
    assert lines[-1].split() == ["all", "2", "5.5"]
