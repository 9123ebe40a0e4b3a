"""Fixtures the remediation receiver's tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.remediate.remediate_support import path_with, write_fake_scontrol


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recording scontrol first on PATH; yields its record file."""
    bin_dir, record = write_fake_scontrol(tmp_path)
    monkeypatch.setenv("PATH", path_with(bin_dir)["PATH"])
    return record
