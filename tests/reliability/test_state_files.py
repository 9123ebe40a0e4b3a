"""State files validated on load (issue 34): the remediation receiver's `breaker.json`.

A time no clock can have written (NaN, infinite, negative, later than now plus a small skew) used
to stay in the breaker's window for good, so the breaker stayed full and refused every new node
until a person reset it, and again after every restart. Such entries are now dropped with one
warning line; a file that cannot be read as a breaker state at all is renamed `*.corrupt` with one
warning line and the receiver starts, with a closed breaker, instead of refusing to start.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from gpulens.remediate.breaker import (
    MAX_CLOCK_SKEW_S,
    MAX_STATE_BYTES,
    Admission,
    CircuitBreaker,
    FileStore,
)

NOW = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for line in lines:
        assert "\n" not in line and "Traceback" not in line, line
    return lines


def state(nodes: dict[str, Any], in_flight: dict[str, Any] | None = None, opened_at: Any = None) -> str:
    return json.dumps(
        {
            "version": 1,
            "nodes": nodes,
            "in_flight": in_flight or {},
            "opened_at": opened_at,
            "refused_node": None,
        }
    )


IMPOSSIBLE = {
    "NaN": "NaN",
    "infinite": "Infinity",
    "minus infinite": "-Infinity",
    "negative": "-5",
    "far future": repr(NOW + 10 * 365 * 86400),
    "just past the skew": repr(NOW + MAX_CLOCK_SKEW_S + 1),
    "1e308": "1e308",
    "a 99-digit integer": "9" * 99,
}


@pytest.mark.parametrize("where", ["nodes", "in_flight"])
@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
def test_an_impossible_time_is_dropped_with_one_line_and_the_breaker_admits_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad_input: Any, case: str, where: str
) -> None:
    path = tmp_path / "breaker.json"
    text = state({"good": NOW - 60} if where == "in_flight" else {})
    doc = json.loads(text)
    doc[where]["bad"] = 0  # placeholder, replaced by the literal (NaN is not JSON for json.dumps)
    path.write_text(json.dumps(doc).replace('"bad": 0', f'"bad": {IMPOSSIBLE[case]}'))
    breaker = CircuitBreaker(max_nodes=2, window_s=600, clock=Clock(), store=FileStore(path))
    bad_input("state file: impossible breaker time")
    assert "bad" not in breaker.state().nodes_in_window
    lines = warnings(caplog)
    assert len(lines) == 1, lines
    assert f"{where}.'bad'=" in lines[0] and "dropped 1 impossible time" in lines[0]
    # the window is usable: a new node is admitted (before: the impossible node held its place for good)
    assert breaker.reserve("n1").admission is Admission.ADMITTED
    assert "bad" not in json.loads(path.read_text())["nodes"]


@pytest.mark.parametrize("case", ["NaN", "infinite", "negative", "far future"])
def test_an_impossible_opened_at_keeps_the_breaker_open_as_of_now(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad_input: Any, case: str
) -> None:
    path = tmp_path / "breaker.json"
    path.write_text(state({}, opened_at=0).replace('"opened_at": 0', f'"opened_at": {IMPOSSIBLE[case]}'))
    breaker = CircuitBreaker(max_nodes=2, window_s=600, clock=Clock(), store=FileStore(path))
    bad_input("state file: impossible breaker time")
    snapshot = breaker.state()
    assert snapshot.open and snapshot.opened_at == NOW
    lines = warnings(caplog)
    assert len(lines) == 1 and "opened_at=" in lines[0] and "kept open" in lines[0]
    breaker.reset()  # a person looked: closes as always
    assert breaker.reserve("n1").admission is Admission.ADMITTED


def test_possible_times_are_kept_without_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "breaker.json"
    path.write_text(state({"n1": NOW - 10, "n2": NOW + MAX_CLOCK_SKEW_S - 1}, opened_at=NOW - 5))
    breaker = CircuitBreaker(max_nodes=2, window_s=600, clock=Clock(), store=FileStore(path))
    assert breaker.state().nodes_in_window == ("n1", "n2") and breaker.state().open
    assert warnings(caplog) == []


CORRUPT: dict[str, bytes] = {
    "not JSON": b"{not json",
    "truncated": state({"n1": NOW}).encode()[:20],
    "UTF-16": state({"n1": NOW}).encode("utf-16"),
    "binary": b"\x7fELF\x00\x01\xff\xfe" * 8,
    "a list": b"[1, 2]",
    "version 2": json.dumps({"version": 2}).encode(),
    "times as strings": state({"n1": "yesterday"}).encode(),
    "a boolean time": state({"n1": True}).encode(),
    "nested 100,000 deep": b'{"version": 1, "nodes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "a 50,000-digit time": state({"n1": 0}).replace('"n1": 0', '"n1": ' + "9" * 50_000).encode(),
    "larger than the bound": state({f"n{i}": NOW for i in range(MAX_STATE_BYTES // 10)}).encode(),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_corrupt_state_file_is_moved_aside_and_never_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad_input: Any, case: str
) -> None:
    path = tmp_path / "breaker.json"
    path.write_bytes(CORRUPT[case])
    breaker = CircuitBreaker(max_nodes=1, window_s=600, clock=Clock(), store=FileStore(path))
    bad_input("state file: corrupt breaker.json")
    assert (tmp_path / "breaker.json.corrupt").read_bytes() == CORRUPT[case]  # kept for a person
    lines = warnings(caplog)
    assert len(lines) == 1 and lines[0].startswith(f"--breaker-state-file {path}: "), lines
    assert "breaker.json.corrupt" in lines[0] and len(lines[0]) < 400
    assert not breaker.state().open
    breaker.commit(breaker.reserve("n1"))  # works and saves a fresh state
    assert json.loads(path.read_text())["nodes"] == {"n1": NOW}


def test_a_corrupt_state_file_that_cannot_be_moved_is_still_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "breaker.json"
    path.write_text("{not json")

    def refuse(src: object, dst: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("gpulens.remediate.breaker.os.replace", refuse)
    breaker = CircuitBreaker(max_nodes=1, window_s=600, clock=Clock(), store=FileStore(path))
    lines = warnings(caplog)
    assert len(lines) == 1 and "could not rename it to breaker.json.corrupt: Permission denied" in lines[0]
    assert not breaker.state().open
