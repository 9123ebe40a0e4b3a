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


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stateful scontrol, squeue and sbatch first on PATH: drains, reboots (at once, a new
    BootTime), resumes, reservations and batch jobs change the node; yields the record file."""
    bin_dir, record = write_fake_scontrol(tmp_path, stateful=True)
    monkeypatch.setenv("PATH", path_with(bin_dir)["PATH"])
    return record
