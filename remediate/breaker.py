"""Circuit breaker: stop acting when too many nodes were taken out within a window.

A fleet-wide cause (a bad driver roll-out, a rule or exporter bug) looks like many simultaneous
GPU faults; isolating every node would take the cluster down. Once more than `max_nodes`
distinct nodes would be acted on within `window_s`, the breaker opens and stays open (latched)
until a person resets it, because the condition that tripped it needs a human look.

What counts: only actions (isolations, and the resets and reboots that follow them) that were
attempted on a validated, existing node and succeeded. An action first *reserves* its node; the
reservation is committed when the action succeeded and released when it failed, so alerts for
nodes that do not exist, or a backend that refuses, never fill the window or latch the breaker.
While reservations are in flight they hold their places (concurrent actions on different nodes
cannot overshoot the limit); a newcomer that would only exceed it because of them waits for them
instead of latching.

The state (window, reservations, latch) is kept in a `BreakerStore` (a file, or a ConfigMap in
Kubernetes) after every change, so a restart or an OOM kill does not reset it. A reservation found
in the store at start-up was in flight when the receiver died; it counts as a success (the action
may have happened).

Saved state is checked on load. A time no clock can have produced (NaN, infinite, negative, or
later than now + `MAX_CLOCK_SKEW_S`) would never leave the window, so the breaker would stay full
for good: such entries are dropped with one warning line (an impossible `opened_at` keeps the
breaker open, as of now). A state file that cannot be read as a breaker state at all (not JSON,
not UTF-8, another shape, larger than `MAX_STATE_BYTES`) is renamed to `<name>.corrupt` with one
warning line and the receiver starts with a closed breaker; it never stops the receiver.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Protocol

from gpulens.safeload import InputError, load_json, read_text

log = logging.getLogger("gpulens.remediate")

MAX_CLOCK_SKEW_S = 300.0  # a saved time later than now + this cannot have been written by this clock
MAX_STATE_BYTES = 1 << 20  # a state holds at most a window of nodes: a few KiB


class BreakerStoreError(Exception):
    """The breaker's state could not be read or written; one line naming where."""


@dataclass(frozen=True)
class BreakerSnapshot:
    """What the store keeps: node -> time of its latest counted action, and the latch."""

    nodes: dict[str, float] = field(default_factory=dict)
    in_flight: dict[str, float] = field(default_factory=dict)
    opened_at: float | None = None
    refused_node: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": 1,
                "nodes": self.nodes,
                "in_flight": self.in_flight,
                "opened_at": self.opened_at,
                "refused_node": self.refused_node,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> BreakerSnapshot:
        try:
            doc = load_json(text)  # bounded: nesting, and integers of at most 100 digits
        except ValueError as exc:
            raise BreakerStoreError(f"{where}: not JSON ({str(exc).splitlines()[0]})") from None
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise BreakerStoreError(f"{where}: expected a gpulens breaker state (version 1)")

        def times(key: str) -> dict[str, float]:
            value = doc.get(key) or {}
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and _is_number(v) for k, v in value.items()
            ):
                raise BreakerStoreError(f"{where}: {key}: expected an object of node -> time")
            return {k: float(v) for k, v in value.items()}

        opened_at, refused = doc.get("opened_at"), doc.get("refused_node")
        if opened_at is not None and not _is_number(opened_at):
            raise BreakerStoreError(f"{where}: opened_at: expected a time or null")
        if refused is not None and not isinstance(refused, str):
            raise BreakerStoreError(f"{where}: refused_node: expected a string or null")
        return cls(
            times("nodes"), times("in_flight"), None if opened_at is None else float(opened_at), refused
        )

    def sane(self, now: float) -> tuple[BreakerSnapshot, list[str]]:
        """This state without the times no clock can have produced, and what was dropped.

        A time that is NaN, infinite, negative or later than now + MAX_CLOCK_SKEW_S would never
        leave the window (NaN and future times are never "older than the window"), keeping the
        breaker full for good; such entries are dropped. An impossible `opened_at` still says the
        breaker was opened: it stays open, as of `now`, for a person to reset.
        """
        dropped: list[str] = []

        def possible(at: float) -> bool:
            return math.isfinite(at) and 0 <= at <= now + MAX_CLOCK_SKEW_S

        def kept(key: str, entries: dict[str, float]) -> dict[str, float]:
            out = {}
            for node, at in entries.items():
                if possible(at):
                    out[node] = at
                else:
                    dropped.append(f"{key}.{node[:64]!r}={at!r}")  # repr: one line whatever the name
            return out

        nodes, in_flight = kept("nodes", self.nodes), kept("in_flight", self.in_flight)
        opened_at = self.opened_at
        if opened_at is not None and not possible(opened_at):
            dropped.append(f"opened_at={opened_at!r} (kept open, as of now)")
            opened_at = now
        if not dropped:
            return self, []
        return replace(self, nodes=nodes, in_flight=in_flight, opened_at=opened_at), dropped


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class BreakerStore(Protocol):
    def describe(self) -> str: ...

    def load(self) -> BreakerSnapshot | None:
        """The saved state, None when nothing was saved yet; BreakerStoreError when unreadable."""
        ...

    def save(self, snapshot: BreakerSnapshot) -> None: ...


@dataclass
class FileStore:
    """The state in a JSON file, replaced atomically (temporary file in the same directory, renamed)."""

    path: Path

    def describe(self) -> str:
        return f"file {self.path}"

    def load(self) -> BreakerSnapshot | None:
        """The saved state; None when there is none, or when the file is corrupt: it is then
        renamed to `<name>.corrupt` (kept for a person to look at) with one warning line."""
        where = f"--breaker-state-file {self.path}"
        try:
            return BreakerSnapshot.from_json(read_text(self.path, MAX_STATE_BYTES, where), where)
        except FileNotFoundError:
            return None
        except OSError as exc:  # unreadable (permissions, I/O): not corrupt, the caller says so
            raise BreakerStoreError(f"{where}: {exc.strerror or exc}") from None
        except (InputError, BreakerStoreError) as exc:
            self._move_aside(str(exc))
            return None

    def _move_aside(self, problem: str) -> None:
        aside = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            log.warning(
                "%s; starting with a closed breaker (could not rename it to %s: %s)",
                problem,
                aside.name,
                exc.strerror or exc,
            )
            return
        log.warning("%s; renamed to %s, starting with a closed breaker and an empty window", problem, aside)

    def save(self, snapshot: BreakerSnapshot) -> None:
        directory = self.path.parent
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
            try:
                with os.fdopen(fd, "w") as handle:
                    handle.write(snapshot.to_json() + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise BreakerStoreError(f"--breaker-state-file {self.path}: {exc.strerror or exc}") from None


@dataclass
class MemoryStore:
    """No persistence (dry-run, or tests): the state lives as long as the process."""

    snapshot: BreakerSnapshot | None = None

    def describe(self) -> str:
        return "memory"

    def load(self) -> BreakerSnapshot | None:
        return self.snapshot

    def save(self, snapshot: BreakerSnapshot) -> None:
        self.snapshot = snapshot


class Admission(Enum):
    ADMITTED = "admitted"  # a new node: reserved, commit or release it
    COUNTED = "counted"  # the node already counts in the window: nothing to commit
    OPEN = "open"  # the breaker is open (or just opened on this node)
    BUSY = "busy"  # the window is full of in-flight reservations that did not finish in time
    UNSAVED = "unsaved"  # the reservation could not be persisted: refused rather than unrecorded


@dataclass(frozen=True)
class Ticket:
    admission: Admission
    node: str
    detail: str = ""

    @property
    def allowed(self) -> bool:
        return self.admission in (Admission.ADMITTED, Admission.COUNTED)


@dataclass(frozen=True)
class BreakerState:
    open: bool
    max_nodes: int
    window_s: float
    nodes_in_window: tuple[str, ...]
    in_flight: tuple[str, ...]
    opened_at: float | None
    refused_node: str | None
    store: str


class CircuitBreaker:
    def __init__(
        self,
        max_nodes: int,
        window_s: float,
        clock: Callable[[], float] = time.time,
        store: BreakerStore | None = None,
        on_save_error: Callable[[BreakerStoreError], None] | None = None,
    ) -> None:
        if max_nodes < 1 or window_s <= 0:
            raise ValueError("max_nodes must be >= 1 and window_s > 0")
        self._max_nodes = max_nodes
        self._window_s = window_s
        self._clock = clock
        self._store: BreakerStore = store or MemoryStore()
        self.on_save_error = on_save_error
        self._changed = threading.Condition()
        self._counted: dict[str, float] = {}  # node -> time of its latest counted action
        self._in_flight: dict[str, float] = {}  # node -> time its reservation was made
        self._opened_at: float | None = None
        self._refused_node: str | None = None
        saved = self._store.load()  # BreakerStoreError propagates: the caller refuses to start
        if saved is not None:
            saved, dropped = saved.sane(clock())
            if dropped:
                log.warning(
                    "breaker state %s: dropped %d impossible time(s) (NaN, infinite, negative or "
                    "in the future): %s",
                    self._store.describe(),
                    len(dropped),
                    ", ".join(dropped[:5]) + (", ..." if len(dropped) > 5 else ""),
                )
            # a reservation in flight at the last stop may have acted: count it
            self._counted = {**saved.in_flight, **saved.nodes}
            self._opened_at, self._refused_node = saved.opened_at, saved.refused_node

    @property
    def max_nodes(self) -> int:
        return self._max_nodes

    def _prune(self, now: float) -> None:
        for node, at in list(self._counted.items()):
            if now - at > self._window_s:
                del self._counted[node]

    def _snapshot(self) -> BreakerSnapshot:
        return BreakerSnapshot(
            dict(self._counted), dict(self._in_flight), self._opened_at, self._refused_node
        )

    def _save(self) -> BreakerStoreError | None:
        try:
            self._store.save(self._snapshot())
        except BreakerStoreError as exc:
            if self.on_save_error is not None:
                self.on_save_error(exc)
            return exc
        return None

    def reserve(self, node: str, wait_s: float = 0.0) -> Ticket:
        """May an action on `node` go ahead? ADMITTED reserves a place to commit() or release()."""
        give_up = time.monotonic() + max(wait_s, 0.0)
        with self._changed:
            while True:
                now = self._clock()
                self._prune(now)
                if self._opened_at is not None:
                    return Ticket(Admission.OPEN, node, self._open_detail())
                if node in self._counted:
                    return Ticket(Admission.COUNTED, node)
                if node in self._in_flight:
                    pass  # another action on the same node is reserving: wait for its outcome
                elif len(self._counted) >= self._max_nodes:
                    self._opened_at, self._refused_node = now, node
                    self._save()
                    return Ticket(Admission.OPEN, node, self._open_detail())
                elif len(self._counted) + len(self._in_flight) < self._max_nodes:
                    self._in_flight[node] = now
                    error = self._save()
                    if error is not None:
                        del self._in_flight[node]
                        return Ticket(Admission.UNSAVED, node, f"breaker state not saved: {error}")
                    return Ticket(Admission.ADMITTED, node)
                left = give_up - time.monotonic()
                if left <= 0:
                    return Ticket(
                        Admission.BUSY,
                        node,
                        f"circuit breaker: {len(self._in_flight)} action(s) in flight fill the window of "
                        f"{self._max_nodes} nodes; retried on the next notification",
                    )
                self._changed.wait(left)

    def commit(self, ticket: Ticket) -> None:
        """The reserved action succeeded: the node counts in the window from now."""
        if ticket.admission is not Admission.ADMITTED:
            return
        with self._changed:
            self._in_flight.pop(ticket.node, None)
            self._counted[ticket.node] = self._clock()
            self._save()
            self._changed.notify_all()

    def release(self, ticket: Ticket) -> None:
        """The reserved action failed or was not attempted: the place is free again."""
        if ticket.admission is not Admission.ADMITTED:
            return
        with self._changed:
            self._in_flight.pop(ticket.node, None)
            self._save()
            self._changed.notify_all()

    def _open_detail(self) -> str:
        return (
            f"circuit breaker open: more than {self._max_nodes} nodes in {self._window_s:g}s "
            f"(refused {self._refused_node}); reset it with POST /-/breaker/reset"
        )

    def reset(self) -> None:
        """Close the breaker (after a person checked why it opened); the window starts afresh."""
        with self._changed:
            self._opened_at = None
            self._refused_node = None
            self._counted.clear()
            self._save()
            self._changed.notify_all()

    def state(self) -> BreakerState:
        with self._changed:
            self._prune(self._clock())
            return BreakerState(
                open=self._opened_at is not None,
                max_nodes=self._max_nodes,
                window_s=self._window_s,
                nodes_in_window=tuple(sorted(self._counted)),
                in_flight=tuple(sorted(self._in_flight)),
                opened_at=self._opened_at,
                refused_node=self._refused_node,
                store=self._store.describe(),
            )
