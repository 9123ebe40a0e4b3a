"""A pytest plugin: the time each test folder took, printed at the end of the run.

The suite's cost must stay visible (CI has 90 minutes on 2 cores): setup, call and teardown of
every test are summed per folder under tests/ (`tests/analyzer`, `tests/alerts`, ...), the
slowest first, so a folder that grows shows in every CI log.
"""

from __future__ import annotations

from collections import defaultdict

import pytest


def folder_of(nodeid: str) -> str:
    """`tests/analyzer/test_plan.py::test_x` -> `tests/analyzer`; a file directly in tests/ -> `tests`."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


class FolderTimes:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, set[str]] = defaultdict(set)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        folder = folder_of(report.nodeid)
        self.seconds[folder] += report.duration
        self.tests[folder].add(report.nodeid)

    def lines(self) -> list[str]:
        total = sum(self.seconds.values())
        out = [f"{'folder':<24} {'tests':>6} {'seconds':>9} {'share':>6}"]
        for folder, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            share = seconds / total if total else 0.0
            out.append(f"{folder:<24} {len(self.tests[folder]):>6} {seconds:>9.1f} {share:>6.0%}")
        out.append(f"{'all':<24} {sum(len(t) for t in self.tests.values()):>6} {total:>9.1f}")
        return out

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.seconds:
            terminalreporter.write_sep("=", "time per test folder")
            for line in self.lines():
                terminalreporter.write_line(line)
