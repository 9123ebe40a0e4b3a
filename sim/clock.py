"""Clocks for the simulated node.

The simulated driver reads time only through one of these, so a test can pin time
(`ManualClock`), a history generator can run a week in minutes (`ScaledClock`), and a demo can run
in real time (`RealClock`). All report epoch seconds, like the timestamps NVML hands out.
"""

from __future__ import annotations

import threading
import time


class RealClock:
    """Wall-clock time; `sleep` really sleeps."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ScaledClock:
    """Simulated time runs `speed` times faster than real time, starting at `start`.

    `start` defaults to the real time at construction, so a 60x clock begins at "now" and is an
    hour ahead after one real minute. `sleep(s)` blocks `s / speed` real seconds.
    """

    def __init__(self, speed: float, start: float | None = None) -> None:
        if not speed > 0:
            raise ValueError(f"clock speed must be > 0, got {speed!r}")
        self.speed = float(speed)
        self._real_origin = time.monotonic()
        self._sim_origin = time.time() if start is None else float(start)

    def now(self) -> float:
        return self._sim_origin + (time.monotonic() - self._real_origin) * self.speed

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)


class ManualClock:
    """Time moves only when told to: `advance(seconds)`, or `sleep(seconds)` (which advances).

    Thread-safe, so a test thread can advance while a library thread reads.
    """

    def __init__(self, start: float) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {seconds!r})")
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, when: float) -> None:
        """Jump to an absolute time (not earlier than now)."""
        with self._lock:
            if when < self._now:
                raise ValueError(f"a clock cannot go backwards ({when!r} < {self._now!r})")
            self._now = float(when)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)
