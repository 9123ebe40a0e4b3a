"""The scenario parser's primitive checks: each value's type and range, one error line each.

Every error names the file and the dotted path of the value

    <file>: <dotted.path[index].field>: expected <what>, found <what>

so a typo never silently changes a simulation (the parsers: `parse_gpus.py`,
`parse_processes.py`, `parse_faults.py`, `scenariofile.py`).
"""

from __future__ import annotations

import math
import re
from typing import Any

from gpulens.analyzer.units import gib_fixed
from gpulens.sim.scenario import FOREVER, ScenarioError

_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_MAX_DURATION = 10 * 365 * 86400.0
_SIZES = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}


def _found(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


class Check:
    """Raises one-line ScenarioErrors for one file."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, path: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.file}: {path or '(top level)'}: {message}")

    def expected(self, path: str, what: str, value: Any) -> ScenarioError:
        return self.fail(path, f"expected {what}, found {_found(value)}")

    def mapping(
        self, path: str, value: Any, required: tuple[str, ...], optional: tuple[str, ...]
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.expected(path, "a mapping", value)
        allowed = (*required, *optional)
        for key in value:
            if key not in allowed:
                raise self.fail(
                    _join(path, str(key)), f"expected one of the keys {', '.join(allowed)}, found {key!r}"
                )
        for key in required:
            if key not in value:
                raise self.fail(_join(path, key), "expected this required key, found nothing")
        return value

    def any_mapping(self, path: str, value: Any) -> dict[str, Any]:
        """A mapping with free-form keys (user names, environment variables)."""
        if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
            raise self.expected(path, "a mapping of names", value)
        return value

    def integer(self, path: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.expected(path, _range("an integer", lo, hi), value)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.expected(path, _range("an integer", lo, hi), value)
        return value

    def number(self, path: str, value: Any, lo: float | None = None, hi: float | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.expected(path, _range("a number", lo, hi), value)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.expected(path, _range("a number", lo, hi), value)
        return float(value)

    def fraction(self, path: str, value: Any) -> float:
        if isinstance(value, str) and value.endswith("%"):
            try:
                value = float(value[:-1]) / 100
            except ValueError:
                raise self.expected(path, "a fraction 0..1 or a percentage like '25%'", value) from None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise self.expected(path, "a fraction 0..1 or a percentage like '25%'", value)
        return float(value)

    def string(self, path: str, value: Any, pattern: str | None = None, what: str = "a string") -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value:
            raise self.expected(path, what, value)
        if pattern is not None and not re.fullmatch(pattern, value):
            raise self.expected(path, what, value)
        return value

    def boolean(self, path: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.expected(path, "true or false", value)
        return value

    def choice(self, path: str, value: Any, choices: tuple[str, ...] | list[str]) -> str:
        if not isinstance(value, str) or value not in choices:
            raise self.expected(path, "one of " + ", ".join(choices), value)
        return value

    def duration(self, path: str, value: Any, *, negative: bool = False, forever: bool = False) -> float:
        what = "a duration like 30s, 5m, 2h, 1d (or seconds)"
        if forever:
            what += " or 'forever'"
        if forever and value == "forever":
            return FOREVER
        seconds: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        elif isinstance(value, str):
            match = _DURATION.match(value.strip())
            if match:
                seconds = float(match.group(1)) * _UNITS[match.group(2)]
        if seconds is not None and not (math.isfinite(seconds) and abs(seconds) <= _MAX_DURATION):
            what = "a duration of at most 10 years" + (" or 'forever'" if forever else "")
            raise self.expected(path, what, value)
        if seconds is None or (seconds < 0 and not negative):
            if seconds is not None:
                what = "a duration that is not negative"
            raise self.expected(path, what, value)
        return seconds

    def size(self, path: str, value: Any) -> int:
        what = "a size like 512MiB, 10GiB or a number of bytes"
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if isinstance(value, str):
            match = _SIZE.match(value.strip())
            if match:
                return int(float(match.group(1)) * _SIZES[match.group(2)])
        raise self.expected(path, what, value)

    def list_(self, path: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise self.expected(path, "a list", value)
        return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _range(what: str, lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"{what} from {lo} to {hi}"
    if lo is not None:
        return f"{what} >= {lo}"
    if hi is not None:
        return f"{what} <= {hi}"
    return what


def gib(n: int) -> str:
    """Bytes in a scenario error, two decimals: a total just over a limit reads as over it."""
    return gib_fixed(n, 2)
