"""Log a problem once while it lasts rather than once per sample (5 s) forever, in bounded memory.

Keys name a problem (a file, a pid, the kubelet socket). A key is logged the first time it is seen
and then stays quiet until `forget` re-arms it (the problem went away). `forget(key, quiet_for=s)`
re-arms it only once `s` seconds have passed since it was last logged, so a file that flips
between bad and good every sample is logged once per `s`, not every other sample.

The table holds at most `capacity` keys (problems still present plus re-armed keys still quiet):
a directory of 30,000 junk names must not become 30,000 log lines or 30,000 remembered keys.
Beyond the capacity new keys are not logged at all (`Outcome.SUPPRESSED`, counted in
`suppressed`); the caller says so in one summary line (see mapping_dir.py). `drop` frees a key for
good (the file was deleted): memory follows what exists, not what once existed.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Hashable

DEFAULT_CAPACITY = 256


class Outcome(enum.Enum):
    LOGGED = "logged"
    KNOWN = "known"  # already logged (or re-armed but still quiet): not logged again
    SUPPRESSED = "suppressed"  # new, but the table is full: not logged


class LogOnce:
    """Remembers which keys were logged, at most `capacity` of them."""

    def __init__(
        self,
        logger: logging.Logger,
        capacity: int = DEFAULT_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._capacity = max(1, capacity)
        self._clock = clock
        self._active: dict[Hashable, float] = {}  # key -> when it was logged
        self._quiet: dict[Hashable, tuple[float, float]] = {}  # re-armed key -> (logged, may log again)
        self.suppressed = 0  # new keys not logged because the table was full (a running count)
        self._next_prune = 0.0

    @property
    def logger(self) -> logging.Logger:
        return self._logger

    def __len__(self) -> int:
        return len(self._active) + len(self._quiet)

    def _admit(self, key: Hashable) -> Outcome:
        if key in self._active:
            return Outcome.KNOWN
        now = self._clock()
        held = self._quiet.pop(key, None)
        if held is not None and now < held[1]:
            # back within its hold: present again but not logged (one line per hold, whatever the
            # reason this time); the metrics still count it
            self._active[key] = held[0]
            return Outcome.KNOWN
        if len(self) >= self._capacity and self._quiet and now >= self._next_prune:
            # expired holds make room first (at most once a second: a full table is the hostile case)
            self._quiet = {k: h for k, h in self._quiet.items() if h[1] > now}
            self._next_prune = now + 1.0
        if len(self) >= self._capacity:
            self.suppressed += 1
            return Outcome.SUPPRESSED
        self._active[key] = now
        return Outcome.LOGGED

    def warning(self, key: Hashable, message: str, *args: object) -> Outcome:
        outcome = self._admit(key)
        if outcome is Outcome.LOGGED:
            self._logger.warning(message, *args)
        return outcome

    def info(self, key: Hashable, message: str, *args: object) -> Outcome:
        outcome = self._admit(key)
        if outcome is Outcome.LOGGED:
            self._logger.info(message, *args)
        return outcome

    def forget(self, key: Hashable, quiet_for: float = 0.0) -> None:
        """The problem went away: log `key` again when it comes back (not before `quiet_for`
        seconds after it was last logged)."""
        logged = self._active.pop(key, None)
        if logged is None:
            return
        if quiet_for > 0 and self._clock() < logged + quiet_for:
            self._quiet[key] = (logged, logged + quiet_for)

    def forget_where(self, predicate: Callable[[Hashable], bool]) -> None:
        for key in [k for k in self._active if predicate(k)]:
            self.forget(key)

    def drop(self, key: Hashable) -> None:
        """The thing `key` names is gone: forget it entirely (no hold, no memory)."""
        self._active.pop(key, None)
        self._quiet.pop(key, None)
