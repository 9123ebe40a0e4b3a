"""Circuit breaker: stop isolating when too many nodes were isolated within a window.

A fleet-wide cause (a bad driver roll-out, a rule or exporter bug) looks like many simultaneous
GPU faults; isolating every node would take the cluster down. Once more than `max_nodes`
distinct nodes would be isolated within `window_s`, the breaker opens and stays open (latched)
until a person resets it, because the condition that tripped it needs a human look.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BreakerState:
    open: bool
    max_nodes: int
    window_s: float
    nodes_in_window: tuple[str, ...]
    opened_at: float | None
    refused_node: str | None


class CircuitBreaker:
    def __init__(self, max_nodes: int, window_s: float, clock: Callable[[], float] = time.time) -> None:
        if max_nodes < 1 or window_s <= 0:
            raise ValueError("max_nodes must be >= 1 and window_s > 0")
        self._max_nodes = max_nodes
        self._window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._isolated: dict[str, float] = {}  # node -> time of its (latest) isolation
        self._opened_at: float | None = None
        self._refused_node: str | None = None

    def _prune(self, now: float) -> None:
        for node, at in list(self._isolated.items()):
            if now - at > self._window_s:
                del self._isolated[node]

    def admit(self, node: str) -> bool:
        """May `node` be isolated now? Records it when yes."""
        with self._lock:
            now = self._clock()
            self._prune(now)
            if self._opened_at is not None:
                return False
            if node in self._isolated:
                return True
            if len(self._isolated) >= self._max_nodes:
                self._opened_at = now
                self._refused_node = node
                return False
            self._isolated[node] = now
            return True

    def reset(self) -> None:
        """Close the breaker (after a person checked why it opened); the window starts afresh."""
        with self._lock:
            self._opened_at = None
            self._refused_node = None
            self._isolated.clear()

    def state(self) -> BreakerState:
        with self._lock:
            self._prune(self._clock())
            return BreakerState(
                open=self._opened_at is not None,
                max_nodes=self._max_nodes,
                window_s=self._window_s,
                nodes_in_window=tuple(sorted(self._isolated)),
                opened_at=self._opened_at,
                refused_node=self._refused_node,
            )
