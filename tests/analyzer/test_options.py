"""Command-line values and the documented defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.analyzer.timeparse import parse_duration, parse_time

DOCS = Path(__file__).resolve().parents[2] / "docs" / "analyzer.md"


@pytest.mark.parametrize(
    ("text", "seconds"), [("7d", 604800), ("12h30m", 45000), ("90s", 90), ("1w", 604800), ("300", 300)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7 days", "d7", "0s", "5x"])
def test_bad_durations_name_the_option(text):
    with pytest.raises(AnalyzerError, match=r"--window: .* is not a duration"):
        parse_duration(text, "--window")


def test_times():
    assert parse_time("2026-01-01T00:00:00Z") == 1_767_225_600.0
    assert parse_time("1767225600") == 1_767_225_600.0
    with pytest.raises(AnalyzerError, match="--end: 'yesterday' is not a time"):
        parse_time("yesterday")


def test_every_threshold_is_documented():
    text = DOCS.read_text()
    for section, values in load_thresholds().as_dict().items():
        for key in values:
            assert f"{section}.{key}" in text or (f"{section}." in text and key in text), f"{section}.{key}"
