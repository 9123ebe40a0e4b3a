"""Durations (`7d`, `12h30m`) and instants (RFC 3339, unix seconds, `now`) from the command line."""

from __future__ import annotations

import re
import time
from datetime import datetime

from gpulens.analyzer.errors import AnalyzerError

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")


def parse_duration(text: str, option: str = "duration") -> float:
    """Prometheus-style duration in seconds; a bare number means seconds."""
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for match in _PART.finditer(value):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(value) or not value or total <= 0:
        raise AnalyzerError(f"{option}: {text!r} is not a duration (expected e.g. 7d, 12h, 90s)")
    return total


def parse_time(text: str | None, option: str = "--end") -> float:
    """RFC 3339 / ISO 8601 time or unix seconds; None or `now` is the current time."""
    if text is None or text == "now":
        return time.time()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise AnalyzerError(f"{option}: {text!r} is not a time (expected RFC 3339 or unix seconds)") from exc
