"""Suite-wide pytest configuration."""

import sys
from pathlib import Path

# make `tests.support` importable however pytest is invoked
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pytest_configure(config) -> None:  # type: ignore[no-untyped-def]
    from tests.support.folder_times import FolderTimes

    config.pluginmanager.register(FolderTimes(), "gpulens-folder-times")
