"""Log lines: logfmt by default (as Prometheus exporters log), JSON on request, same keys in both."""

from __future__ import annotations

import json
import logging

from hypothesis import given
from hypothesis import strategies as st

from gpulens.logsetup import JsonFormatter, LogfmtFormatter, logfmt_value, setup_logging


def _record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("gpulens.exporter", logging.WARNING, __file__, 1, message, args, None)


def test_a_logfmt_line_has_time_level_logger_and_msg_in_that_order() -> None:
    line = LogfmtFormatter().format(_record("GPU %d: %s", 2, "lost"))
    keys = [pair.split("=", 1)[0] for pair in line.split(" ", 3)[:3]]
    assert keys == ["time", "level", "logger"]
    assert ' level=warning logger=gpulens.exporter msg="GPU 2: lost"' in line
    assert line.startswith("time=20") and line.split(" ", 1)[0].endswith("Z")


def test_logfmt_quotes_values_with_spaces_quotes_equals_and_newlines() -> None:
    assert logfmt_value("plain") == "plain"
    assert logfmt_value("") == '""'
    assert logfmt_value('say "hi"') == '"say \\"hi\\""'
    assert logfmt_value("a=b") == '"a=b"'
    assert logfmt_value("two\nlines") == '"two\\nlines"'


@given(st.text())
def test_a_logfmt_record_is_always_one_line(message: str) -> None:
    line = LogfmtFormatter().format(_record("%s", message))
    assert "\n" not in line and "\r" not in line
    assert line.endswith(logfmt_value(message))


def test_json_lines_carry_the_same_keys() -> None:
    payload = json.loads(JsonFormatter().format(_record("GPU %d: %s", 2, "lost")))
    assert list(payload) == ["time", "level", "logger", "msg"]


def test_logfmt_is_the_default_and_warn_is_a_level(capsys) -> None:
    root = logging.getLogger("gpulens")
    saved = (root.handlers[:], root.level, root.propagate)
    try:
        log = setup_logging("warn")
        log.info("not shown")
        log.warning("shown")
    finally:
        root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]
    err = capsys.readouterr().err
    assert "not shown" not in err
    assert "level=warning" in err and "msg=shown" in err
