"""Shared fixtures for analyzer tests."""

from __future__ import annotations

import pytest

from gpulens.analyzer.thresholds import Thresholds, load_thresholds


@pytest.fixture
def th() -> Thresholds:
    return load_thresholds()
