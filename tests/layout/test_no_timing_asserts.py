"""No test asserts how long something took (issue 33, item 7).

A duration measured on a loaded 2-core CI machine flakes and says nothing about behaviour; how fast
the code is, is `make bench`'s figure (devtools/bench/). Tests observe what the time stands for (a
manual clock, a counter, a "hung" flag, the order of events) instead. Waiting for a condition with
a deadline (`assert time.monotonic() < deadline`) bounds nothing the test asserts and stays allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
EXEMPT = ("bench", "support")  # benchmarks measure on purpose; support code only waits
CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns"}


def reads_clock(node: ast.AST) -> bool:
    """`time.monotonic()` and its kin (also imported bare: `monotonic()`)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in CLOCKS and isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id in CLOCKS - {"time"}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def timing_asserts(tree: ast.AST) -> list[int]:
    """Lines of asserts comparing a measured duration: a difference involving a clock reading,
    or a name assigned from one (`elapsed = time.monotonic() - started`)."""
    stamps: set[str] = set()  # names holding a clock reading: started = time.monotonic()
    durations: set[str] = set()  # names holding a difference of readings
    # two passes: the assignments first, wherever they are in the file, then the asserts
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if reads_clock(node.value):
                stamps |= names
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if any(_is_duration(sub, stamps) for sub in ast.walk(node.value)):
                durations |= names

    def measured(expr: ast.AST) -> bool:
        return any(_is_duration(sub, stamps) for sub in ast.walk(expr)) or bool(_names(expr) & durations)

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            compares = [c for c in ast.walk(node.test) if isinstance(c, ast.Compare)]
            if any(measured(c) for c in compares):
                lines.append(node.lineno)
    return lines


def _is_duration(node: ast.AST, stamps: set[str]) -> bool:
    """`a - b` where a side reads the clock or is a clock reading."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)):
        return False
    return any(
        reads_clock(side) or (isinstance(side, ast.Name) and side.id in stamps)
        for side in (node.left, node.right)
    )


def test_no_test_asserts_on_a_measured_duration() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(TESTS)
        if rel.parts[0] in EXEMPT:
            continue
        for line in timing_asserts(ast.parse(path.read_text(), str(path))):
            found.append(f"tests/{rel}:{line}")
    assert not found, "asserts on wall-clock time (observe the behaviour instead): " + ", ".join(found)


def test_the_check_finds_a_duration_assert_in_each_form() -> None:
    flagged = """
import time
started = time.monotonic()
elapsed = time.monotonic() - started
assert elapsed < 1.5
assert time.perf_counter() - started < 1.0
assert 0.2 <= time.monotonic() - started
"""
    assert timing_asserts(ast.parse(flagged)) == [5, 6, 7]


def test_the_check_allows_waiting_with_a_deadline() -> None:
    waiting = """
import time
deadline = time.monotonic() + 30
while True:
    assert time.monotonic() < deadline, "no first sample"
"""
    assert timing_asserts(ast.parse(waiting)) == []
