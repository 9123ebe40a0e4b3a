"""Thresholds: typed sections read once, every bad value one line naming the file and the field."""

from __future__ import annotations

import dataclasses

import pytest

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.thresholds import DEFAULTS_PATH, load_thresholds


def test_defaults_are_typed_frozen_sections() -> None:
    th = load_thresholds()
    assert th.mps.min_thread_percentage == 10 and isinstance(th.mps.min_thread_percentage, int)
    assert th.headroom.memory_min_bytes == 1024**3
    assert th.downsize.enabled is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        th.mps.max_load = 2.0  # type: ignore[misc]


def test_a_user_file_changes_only_what_it_names(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("mps:\n  max_load: 0.5\n")
    th = load_thresholds(path)
    assert th.mps.max_load == 0.5
    assert th.mps.max_clients == load_thresholds().mps.max_clients
    assert th.source == str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope: {a: 1}\n", "unknown section 'nope'"),
        ("mps:\n  max_lod: 1\n", "unknown key mps.max_lod"),
        ("mps:\n  max_load: high\n", "mps.max_load must be a number, got 'high'"),
        ("mps:\n  max_load: 1.5\n", r"mps.max_load must be a number in \[0, 1\], got 1.5"),
        ("mps:\n  max_clients: 2.5\n", "mps.max_clients must be a whole number"),
        ("headroom:\n  compute_ratio: -0.1\n", "headroom.compute_ratio must be a finite number >= 0"),
        ("downsize:\n  enabled: 1\n", "downsize.enabled must be true or false"),
        ("mig: 3\n", "section 'mig' must be a mapping"),
        ("[1, 2\n", "not valid YAML"),
        ("- 1\n", "expected a mapping of sections"),
    ],
)
def test_bad_files_are_one_line_errors_naming_file_and_field(tmp_path, text, message):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(AnalyzerError, match=message) as err:
        load_thresholds(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(AnalyzerError, match="cannot read thresholds file"):
        load_thresholds(tmp_path / "absent.yaml")


def test_the_defaults_file_sets_every_field(tmp_path, monkeypatch):
    short = tmp_path / "defaults.yaml"
    text = DEFAULTS_PATH.read_text().replace("  max_dram_load: 0.80", "")
    short.write_text(text)
    monkeypatch.setattr("gpulens.analyzer.thresholds.DEFAULTS_PATH", short)
    with pytest.raises(AnalyzerError, match=r"defaults.yaml: plan.max_dram_load is missing"):
        load_thresholds()
