"""Clocks: real, sped up, and manual."""

from __future__ import annotations

import time

import pytest

from gpulens.sim.clock import ManualClock, RealClock, ScaledClock


def test_real_clock_is_wall_time() -> None:
    assert RealClock().now() == pytest.approx(time.time(), abs=0.5)


def test_scaled_clock_runs_from_its_start_through_its_sleeps() -> None:
    clock = ScaledClock(100.0, start=1000.0)
    assert clock.now() == pytest.approx(1000.0, abs=1.0)
    clock.sleep(5.0)
    assert clock.now() >= 1005.0


def test_scaled_clock_sleeps_a_speedth_of_the_simulated_time(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)  # record the real wait instead of waiting
    ScaledClock(100.0, start=1000.0).sleep(5.0)
    assert slept == [pytest.approx(0.05)]


def test_scaled_clock_rejects_a_non_positive_speed() -> None:
    with pytest.raises(ValueError, match="speed"):
        ScaledClock(0)


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(50.0)
    assert clock.now() == 50.0
    clock.advance(2.5)
    clock.sleep(1.5)
    assert clock.now() == 54.0
    clock.set(60.0)
    assert clock.now() == 60.0


def test_manual_clock_never_goes_backwards() -> None:
    clock = ManualClock(50.0)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="backwards"):
        clock.set(10.0)
