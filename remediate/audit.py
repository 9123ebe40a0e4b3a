"""The audit log: one JSON line per episode step, appended and flushed to disk as it happens.

Each line is the whole episode after the step (`{"ts": ..., "event": ..., "episode": {...}}`),
so the log reads as a history and a restarted receiver resumes from the last line of each
episode without replaying logic. Lines that are not JSON (a torn write at a crash) are skipped
and counted; the log is never rewritten, so rotate it with copytruncate-style tools.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpulens.remediate.episodes import Episode

log = logging.getLogger("gpulens.remediate")
MAX_LINE = 64 << 10  # an episode is well under a kilobyte; longer lines are not ours


class AuditError(Exception):
    """The audit log cannot be opened or read; one line naming it."""


def stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"


@dataclass
class Replay:
    episodes: dict[str, Episode]
    skipped: int


class AuditLog:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.write_errors = 0

    def append(self, event: str, episode: Episode, at: float) -> None:
        if self.path is None:
            return
        line = json.dumps({"ts": stamp(at), "time": at, "event": event, "episode": episode.to_dict()})
        with self._lock:
            try:
                with self.path.open("a") as handle:
                    handle.write(line + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as exc:
                self.write_errors += 1
                log.error(
                    "audit log %s: %s (episode %s %s not recorded)",
                    self.path,
                    exc.strerror,
                    episode.id,
                    event,
                )

    def present(self) -> bool:
        """Whether there is a log to resume from: a file with at least one line."""
        if self.path is None:
            return False
        try:
            return self.path.stat().st_size > 0
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise AuditError(f"--state-dir audit log {self.path}: {exc.strerror or exc}") from None

    def _lines(self) -> Iterator[str]:
        assert self.path is not None
        try:
            with self.path.open("rb") as handle:
                for raw in handle:
                    yield raw[:MAX_LINE].decode(errors="replace")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise AuditError(f"--state-dir audit log {self.path}: {exc.strerror or exc}") from None

    def replay(self) -> Replay:
        """The last recorded state of every episode in the log."""
        episodes: dict[str, Episode] = {}
        skipped = 0
        if self.path is None:
            return Replay(episodes, 0)
        for line in self._lines():
            try:
                doc = json.loads(line)
                episode = Episode.from_dict(doc["episode"])
            except (ValueError, KeyError, TypeError, RecursionError):
                skipped += 1
                continue
            episodes[episode.id] = episode
        return Replay(episodes, skipped)
