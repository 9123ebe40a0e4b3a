"""One lock per node, so actions on a node are serialised and actions on different nodes are not."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class NodeLocks:
    """Locks created on first use and dropped when nobody holds or waits for them (bounded memory)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, node: str, timeout: float) -> Iterator[bool]:
        """Hold `node`'s lock for the block; yields False when it stayed taken for `timeout` seconds."""
        with self._guard:
            lock, users = self._locks.get(node, (threading.Lock(), 0))
            self._locks[node] = (lock, users + 1)
        acquired = lock.acquire(timeout=max(timeout, 0.0))
        try:
            yield acquired
        finally:
            if acquired:
                lock.release()
            with self._guard:
                lock, users = self._locks[node]
                if users <= 1:
                    del self._locks[node]
                else:
                    self._locks[node] = (lock, users - 1)
