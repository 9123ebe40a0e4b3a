"""Suite-wide pytest configuration."""

import sys
from pathlib import Path

import pytest

# make `tests.support` importable however pytest is invoked
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pytest_configure(config: pytest.Config) -> None:
    from tests.support.folder_times import FolderTimes

    config.pluginmanager.register(FolderTimes(), "gpulens-folder-times")
