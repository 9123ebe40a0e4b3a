"""Waiting for a condition instead of sleeping a fixed time.

A test that waits for something another thread or process does polls for it with a generous
deadline: the deadline only turns a hang into a failure and bounds nothing the test asserts, so
the test is as fast as the code and does not flake on a loaded CI machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout: float = 30.0, poll: float = 0.02) -> T:
    """The first truthy value of `condition()`; AssertionError naming `what` if none came in time."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not reached within {timeout:g} s")
        time.sleep(poll)
