"""The receiver's episode table: every change is written to the audit log first, then applied.

A restarted receiver reads the audit log back (`EpisodeBook.resume`) and carries on with every
episode that was still open: isolated, waiting for its reset or reboot, in its hold-down, or
ready to return. Every saved step is also handed to `mirror` (the backend's `record`: Kubernetes
keeps each open episode as a node annotation), so that without the audit log the receiver can
`adopt` what the orchestrator kept instead. Memory is bounded: open episodes (one per alert
episode, so bounded by the fleet's faults) plus the time each node was last returned (for flap detection).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from gpulens.remediate.audit import AuditLog
from gpulens.remediate.episodes import Episode, State
from gpulens.remediate.escape import printable
from gpulens.remediate.metrics import RemediateMetrics

log = logging.getLogger("gpulens.remediate")
MAX_OPEN = 10_000
MAX_RETURNED = 100_000  # nodes whose last return time is kept


class EpisodeBook:
    def __init__(
        self,
        audit: AuditLog,
        metrics: RemediateMetrics,
        clock: Callable[[], float],
        mirror: Callable[[Episode], None] | None = None,
    ) -> None:
        self.audit = audit
        self.mirror = mirror
        self.metrics = metrics
        self.clock = clock
        self._lock = threading.Lock()
        self._open: OrderedDict[str, Episode] = OrderedDict()
        self._returned: OrderedDict[str, float] = OrderedDict()  # node -> last return time
        metrics.bind_episodes(self.open_episodes, clock)

    def resume(self) -> int:
        """Load the audit log's open episodes and return times; how many episodes are open."""
        replay = self.audit.replay()
        if replay.skipped:
            log.warning("audit log %s: %d unreadable line(s) skipped", self.audit.path, replay.skipped)
        with self._lock:
            for episode in sorted(replay.episodes.values(), key=lambda e: e.detected_at):
                if episode.returned_at is not None:
                    self._note_return(episode.node, episode.returned_at)
                if episode.state.open:
                    self._open[episode.id] = episode
            resumed = list(self._open.values())
        self.metrics.episodes_resumed(resumed)
        return len(resumed)

    def adopt(self, episodes: list[Episode], returned: dict[str, float]) -> int:
        """Take over episodes and return times kept elsewhere (the nodes); how many are open.
        Each is written to the audit log as `resumed`, which then holds them again."""
        now = self.clock()
        with self._lock:
            for node, at in returned.items():
                self._note_return(node, at)
        taken = sorted(episodes, key=lambda e: e.detected_at)[:MAX_OPEN]
        for episode in taken:
            self.audit.append("resumed", episode, now)
            with self._lock:
                self._open[episode.id] = episode
        self.metrics.episodes_resumed(taken)
        return len(self.open_episodes())

    def _note_return(self, node: str, at: float) -> None:
        self._returned[node] = max(at, self._returned.get(node, 0.0))
        self._returned.move_to_end(node)
        while len(self._returned) > MAX_RETURNED:
            self._returned.popitem(last=False)

    def get(self, episode_id: str) -> Episode | None:
        with self._lock:
            return self._open.get(episode_id)

    def open_episodes(self) -> list[Episode]:
        with self._lock:
            return list(self._open.values())

    def of_node(self, node: str) -> list[Episode]:
        with self._lock:
            return [e for e in self._open.values() if e.node == node]

    def last_return(self, node: str) -> float | None:
        with self._lock:
            return self._returned.get(node)

    def save(self, event: str, episode: Episode) -> Episode:
        """Record `episode` after `event`: audit line first, then the table and the metrics."""
        now = self.clock()
        self.audit.append(event, episode, now)
        with self._lock:
            before = self._open.get(episode.id)
            if episode.state.open:
                self._open[episode.id] = episode
                while len(self._open) > MAX_OPEN:
                    dropped = self._open.popitem(last=False)[1]
                    log.error(
                        "more than %d open episodes: forgetting %s on %s", MAX_OPEN, dropped.id, dropped.node
                    )
            else:
                self._open.pop(episode.id, None)
            returns = (State.RETURNED, State.RETURNED_BY_HAND)
            if episode.state in returns and episode.returned_at is not None:
                self._note_return(episode.node, episode.returned_at)
        self.metrics.episode_changed(before, episode)
        if self.mirror is not None:
            self.mirror(episode)
        level = logging.WARNING if episode.state in (State.RMA, State.ESCALATED) else logging.INFO
        log.log(
            level,
            "episode %s node=%s gpu=%s %s: %s -> %s: %s",
            printable(episode.id, 100),
            episode.node,
            episode.gpu or "-",
            event,
            before.state.value if before else "-",
            episode.state.value,
            printable(episode.detail, 300),
        )
        return episode
