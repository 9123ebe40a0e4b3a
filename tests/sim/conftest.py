"""The probe suite of NVML behaviours runs on both simulated drivers (see tests/sim/drivers.py)."""

from __future__ import annotations

import pytest

from tests.sim.drivers import DRIVERS


@pytest.fixture(params=DRIVERS)
def nvml_driver(request: pytest.FixtureRequest) -> str:
    """The simulated NVML driver under test: the Python callbacks or the native library."""
    return str(request.param)
