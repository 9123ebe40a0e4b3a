"""Reliability suite: counts the bad-input cases checked and prints the total in the test report."""

from __future__ import annotations

from collections.abc import Callable

import pytest

BAD_INPUT_CASES = pytest.StashKey[dict[str, int]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[BAD_INPUT_CASES] = {}


@pytest.fixture
def bad_input(request: pytest.FixtureRequest) -> Callable[[str, int], None]:
    """`bad_input(kind)` records one checked bad-input case of `kind` (e.g. "scenario file")."""
    counts = request.config.stash[BAD_INPUT_CASES]

    def count(kind: str, n: int = 1) -> None:
        counts[kind] = counts.get(kind, 0) + n

    return count


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    counts = config.stash.get(BAD_INPUT_CASES, {})
    if not counts:
        return
    terminalreporter.section("bad input")
    for kind, n in sorted(counts.items()):
        terminalreporter.write_line(f"  {kind}: {n}")
    terminalreporter.write_line(f"bad-input cases: {sum(counts.values())}")
