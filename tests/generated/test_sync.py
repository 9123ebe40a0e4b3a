"""`gpulens.generated.sync`: the last step of every build of generated files."""

from __future__ import annotations

from pathlib import Path

from gpulens.generated import read, sync


def test_a_missing_or_different_file_is_written_and_a_matching_one_left_alone(tmp_path: Path) -> None:
    same, different, missing = tmp_path / "same", tmp_path / "different", tmp_path / "sub" / "missing"
    same.write_text("a", encoding="utf-8")
    different.write_text("old", encoding="utf-8")
    outcome = sync({same: "a", different: "new", missing: "m"}, check=False)
    assert outcome.changed == [different, missing]
    assert read(different) == "new" and read(missing) == "m"


def test_a_present_file_the_build_no_longer_makes_is_removed(tmp_path: Path) -> None:
    kept, stale = tmp_path / "kept.json", tmp_path / "stale.json"
    kept.write_text("k", encoding="utf-8")
    stale.write_text("s", encoding="utf-8")
    outcome = sync({kept: "k"}, [kept, stale], check=False)
    assert outcome.changed == [] and outcome.removed == [stale]
    assert not stale.exists() and kept.exists()


def test_check_lists_what_would_change_and_touches_nothing(tmp_path: Path) -> None:
    stale, missing = tmp_path / "stale", tmp_path / "missing"
    stale.write_text("s", encoding="utf-8")
    outcome = sync({missing: "m"}, [stale], check=True)
    assert outcome.changed == [missing] and outcome.removed == [stale]
    assert stale.exists() and not missing.exists()


def test_read_of_a_file_not_yet_written_is_none(tmp_path: Path) -> None:
    assert read(tmp_path / "nothing") is None
