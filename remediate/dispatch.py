"""Act on queued notifications: in order on each node, different nodes at the same time.

One thread takes notifications from the queue (queue.py) in order and splits each one's alerts by
node. Every node has its own lane (a FIFO of its parts of notifications), and a bounded pool of
workers serves the lanes, one part of a lane at a time. So a node whose backend calls hang (up to
the action deadline) holds up only its own later notifications, while other nodes' lanes go on,
`workers` nodes at once; and a node's alerts are acted on in the order Alertmanager sent them. A
notification is marked done in the queue once every node's part of it has been handled.

Stopping (SIGTERM) takes nothing more from the queue or the lanes and waits for the parts in
progress; whatever was not finished stays in the queue file for the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpulens.remediate.model import Alert
from gpulens.remediate.queue import Entry, NotificationQueue

log = logging.getLogger("gpulens.remediate")

WORKERS = 16  # nodes acted on at once; each worker is idle but for its backend calls


@dataclass(frozen=True)
class _Part:
    """One node's alerts of one notification."""

    entry: Entry
    node: str
    alerts: tuple[Alert, ...]


class Dispatcher:
    def __init__(
        self,
        queue: NotificationQueue,
        handle: Callable[[Sequence[Alert]], object],
        lane_of: Callable[[Alert], str],
        workers: int = WORKERS,
    ) -> None:
        self.queue = queue
        self.handle = handle
        self.lane_of = lane_of
        self.workers = workers
        self._cond = threading.Condition()
        self._lanes: dict[str, deque[_Part]] = {}  # a lane exists while it is ready or being served
        self._ready: deque[str] = deque()  # lanes with parts and no worker
        self._parts_left: dict[int, int] = {}  # seq -> parts of that notification not yet handled
        self._stopping = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        if self._threads:
            return
        self._threads.append(threading.Thread(target=self._dispatch, name="gpulens-dispatch", daemon=True))
        for i in range(self.workers):
            self._threads.append(threading.Thread(target=self._work, name=f"gpulens-node-{i}", daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop taking work; wait up to `timeout` for the parts in progress. False if some still run."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.queue.close()
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(end - time.monotonic(), 0))
        return not any(thread.is_alive() for thread in self._threads)

    # ---- the dispatcher thread -----------------------------------------------------------------

    def _dispatch(self) -> None:
        while (entry := self.queue.take()) is not None:
            by_node: dict[str, list[Alert]] = {}
            for alert in entry.alerts:
                by_node.setdefault(self.lane_of(alert), []).append(alert)
            if not by_node:
                self.queue.done(entry.seq)
                continue
            with self._cond:
                if self._stopping:
                    return
                self._parts_left[entry.seq] = len(by_node)
                for node, alerts in by_node.items():
                    lane = self._lanes.get(node)
                    if lane is None:
                        lane = self._lanes[node] = deque()
                        self._ready.append(node)
                    lane.append(_Part(entry, node, tuple(alerts)))
                self._cond.notify_all()

    # ---- the workers ---------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._ready or self._stopping)
                if self._stopping:
                    return
                node = self._ready.popleft()
                part = self._lanes[node].popleft()
            try:
                self.handle(part.alerts)
            except Exception:  # a bug must not stop the lane; the part counts as handled
                log.exception("acting on notification %s (%d alerts) failed", part.entry.id, len(part.alerts))
            with self._cond:
                left = self._parts_left[part.entry.seq] - 1
                if left:
                    self._parts_left[part.entry.seq] = left
                else:
                    del self._parts_left[part.entry.seq]
                if self._lanes[node]:
                    self._ready.append(node)
                    self._cond.notify()
                else:
                    del self._lanes[node]
            if not left:
                self.queue.done(part.entry.seq)
