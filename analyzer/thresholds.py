"""Thresholds that decide recommendations, loaded from YAML over documented defaults.

The defaults live in `thresholds.yaml` next to this module (the documented reference file); a
user file only needs the keys it changes. Unknown keys are an error so that typos are not
silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpulens.analyzer.errors import AnalyzerError

DEFAULTS_PATH = Path(__file__).with_name("thresholds.yaml")


@dataclass(frozen=True)
class Thresholds:
    """Nested mapping section -> key -> number, with attribute-style access by `get`."""

    values: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = str(DEFAULTS_PATH)

    def get(self, section: str, key: str) -> float:
        return self.values[section][key]

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {s: dict(v) for s, v in self.values.items()}


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise AnalyzerError(f"{path}: cannot read thresholds file: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise AnalyzerError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise AnalyzerError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """Defaults, overridden by `path` when given; every value must be a number (or boolean)."""
    merged: dict[str, dict[str, float]] = {k: dict(v) for k, v in _read(DEFAULTS_PATH).items()}
    if path is None:
        return Thresholds(merged)
    user_path = Path(path)
    for section, entries in _read(user_path).items():
        if section not in merged:
            raise AnalyzerError(f"{user_path}: unknown section {section!r}; known: {', '.join(merged)}")
        if not isinstance(entries, dict):
            raise AnalyzerError(f"{user_path}: section {section!r} must be a mapping")
        for key, value in entries.items():
            if key not in merged[section]:
                known = ", ".join(merged[section])
                raise AnalyzerError(f"{user_path}: unknown key {section}.{key}; known: {known}")
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if not numeric and not isinstance(merged[section][key], bool):
                raise AnalyzerError(f"{user_path}: {section}.{key} must be a number, got {value!r}")
            merged[section][key] = value
    return Thresholds(merged, source=str(user_path))
