"""Logging for both daemons (the exporter, `gpulens remediate`): `--log.level`, `--log.format`.

Prometheus exporters log in logfmt by default (exporter-toolkit's promslog), so gpulens does too:
one line per record, `key=value` pairs in a fixed order, values quoted when they hold spaces,
quotes, `=` or control characters. `json` writes the same keys as one JSON object per line. Both
formats put the keys `time`, `level`, `logger` and `msg` first and `exception` last.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from gpulens.serverflags import log_level

LOGFMT = "logfmt"
JSON = "json"
TEXT_ALIAS = "text"  # the pre-logfmt name of the default format, still accepted


def _fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, str]:
    fields = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    if record.exc_info:
        fields["exception"] = formatter.formatException(record.exc_info)
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line (time, level, logger, msg, exception if any)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record, self), ensure_ascii=False)


def logfmt_value(value: str) -> str:
    """A logfmt value: bare when it is a plain token, else double-quoted with escapes."""
    if value and not any(c in value for c in ' ="\\') and value.isprintable():
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    escaped = "".join(c if c.isprintable() or c == " " else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'


class LogfmtFormatter(logging.Formatter):
    """`time=... level=info logger=gpulens.exporter msg="..."`, one record per line."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={logfmt_value(value)}" for key, value in _fields(record, self).items())


def setup_logging(level: str = "info", fmt: str = LOGFMT, name: str = "gpulens.exporter") -> logging.Logger:
    """One handler on stderr for every `gpulens.*` logger; returns the logger called `name`.

    `level` and `fmt` are checked values (`serverflags.log_level` / `log_format`); the libraries'
    own loggers (outside `gpulens`) stay at Python's default, warnings only.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == JSON else LogfmtFormatter())
    root = logging.getLogger("gpulens")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, log_level(level)))
    root.propagate = False
    return logging.getLogger(name)
