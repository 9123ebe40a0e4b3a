"""The queue of acknowledged notifications: `POST /alerts` answers once a notification is here.

Alertmanager waits for the webhook's answer and retries it after its timeout; an answer that
waited on `scontrol` or the Kubernetes API would hold Alertmanager, and an HTTP slot, as long as
the orchestrator is slow. So the receiver only queues a notification before answering 200, and the
dispatcher (dispatch.py) acts on it afterwards.

With a file (`--state-dir`) the queue survives a restart. Each notification is one JSON line
`{"seq": N, "at": T, "alerts": [...]}`, appended, flushed and fsynced before the answer. What has
been acted on is kept beside it in `<name>.done` (`{"version": 1, "through": N, "done": [...]}`:
every number up to `through`, and those listed), replaced atomically after each notification; the
queue file itself is rewritten (atomically) with only the pending lines once the processed ones
outweigh them. Sequence numbers only grow, so a done record can never name a later notification.

At start-up the pending lines are queued again in order: they were acknowledged, so they are acted
on, and one that was acted on already (the receiver died before it was marked done) comes out a
`duplicate` (service.py's idempotency). A last line without its newline was cut short by the crash
before it was acknowledged, and is dropped. A file that cannot be read as a queue is renamed
`<name>.corrupt` with one warning and the receiver starts without it: a person should look at
lines that are not ours, never have the receiver isolate nodes from them.

Without a file the queue lives in memory and a restart loses what it held. Both are bounded: at
most `max_entries` pending notifications of at most `max_bytes` in all (their lines); beyond
either a notification is refused (`QueueFull`: a 503, which Alertmanager retries).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulens import atomicfile
from gpulens.remediate.model import Alert
from gpulens.remediate.payload import PayloadError, parse_webhook

log = logging.getLogger("gpulens.remediate")

MAX_ENTRIES = 10_000
MAX_BYTES = 16 << 20  # a GPU alert's line is about 400 bytes: room for far more than MAX_ENTRIES
# The queue file is rewritten once its processed lines outweigh the pending ones and it is larger
# than this: the rewrite costs a copy of the pending lines, so small files are left to grow.
COMPACT_MIN_BYTES = 1 << 20


class QueueFull(Exception):
    """The queue holds its maximum; one line saying which bound."""


class QueueError(Exception):
    """The queue file cannot be opened or written; one line naming it."""


@dataclass(frozen=True)
class QueueLimits:
    max_entries: int = MAX_ENTRIES
    max_bytes: int = MAX_BYTES


@dataclass(frozen=True)
class Entry:
    """One queued notification: its alerts in order and the size of its line."""

    seq: int
    at: float
    alerts: tuple[Alert, ...]
    size: int

    @property
    def id(self) -> str:
        return str(self.seq)


@dataclass(frozen=True)
class QueueStats:
    """What /-/state and the metrics show of the queue."""

    kept_in: str
    pending: int
    bytes: int
    max_entries: int
    max_bytes: int


def _line(seq: int, at: float, alerts: Sequence[Alert]) -> bytes:
    """The queue line of a notification; annotations are left out (they are read, never kept)."""
    doc = {
        "seq": seq,
        "at": round(at, 3),
        "alerts": [
            {"status": a.status, "labels": a.labels, "fingerprint": a.fingerprint, "startsAt": a.starts_at}
            for a in alerts
        ],
    }
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode()


def _entry(line: bytes) -> Entry:
    """An entry read back from its line; ValueError (PayloadError) when it is not one of ours."""
    alerts = parse_webhook(line)  # the same bounds and checks as a notification from the network
    doc = json.loads(line)
    seq, at = doc.get("seq"), doc.get("at")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise ValueError("seq: expected a positive integer")
    if not isinstance(at, int | float) or isinstance(at, bool):
        raise ValueError("at: expected a time")
    return Entry(seq, float(at), tuple(alerts), len(line))


@dataclass(frozen=True)
class _Done:
    """Which sequence numbers were acted on: all up to `through`, and `above` beyond it."""

    through: int = 0
    above: frozenset[int] = frozenset()

    def __contains__(self, seq: int) -> bool:
        return seq <= self.through or seq in self.above

    def add(self, seq: int) -> _Done:
        through, above = self.through, set(self.above | {seq})
        while through + 1 in above:
            through += 1
            above.discard(through)
        return _Done(through, frozenset(above))

    def to_json(self) -> str:
        return json.dumps({"version": 1, "through": self.through, "done": sorted(self.above)})

    @classmethod
    def from_json(cls, text: str) -> _Done:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise ValueError("expected a gpulens queue done record (version 1)")
        through, above = doc.get("through"), doc.get("done")
        if not isinstance(through, int) or isinstance(through, bool) or through < 0:
            raise ValueError("through: expected a sequence number")
        if not isinstance(above, list) or not all(isinstance(s, int) and s > through for s in above):
            raise ValueError("done: expected a list of sequence numbers beyond `through`")
        return cls(through, frozenset(above))


def _set_aside(path: Path, why: str) -> None:
    """Rename an unreadable file to `<name>.corrupt`, with one warning line; never raises."""
    aside = path.with_name(path.name + ".corrupt")
    try:
        os.replace(path, aside)
    except OSError as exc:
        log.warning("queue: %s %s, and cannot be moved aside (%s): starting without it", path, why, exc)
        return
    log.warning("queue: %s %s: moved to %s, starting without it (look at it)", path, why, aside.name)


class NotificationQueue:
    """Acknowledged notifications in order, until each is marked done; in a file or in memory.

    `put` (the HTTP handler), `take` (the dispatcher, in order) and `done` (the workers, in any
    order) are safe from any thread. File writes happen under `_io`; the in-memory state is
    changed under `_cond` only after the write it depends on has reached the disk.
    """

    def __init__(
        self,
        path: Path | None = None,
        limits: QueueLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.done_path = path.with_name(path.name + ".done") if path is not None else None
        self.limits = limits or QueueLimits()
        self.clock = clock
        self._io = threading.Lock()
        self._cond = threading.Condition()
        self._pending: dict[int, Entry] = {}  # put, not yet done; in order of seq
        self._untaken: deque[Entry] = deque()  # put, not yet taken by the dispatcher
        self._bytes = 0
        self._next_seq = 1
        self._done = _Done()
        self._file_bytes = 0
        self._closed = False
        self.write_errors = 0
        self.recovered = self._load() if path is not None else 0

    # ---- start-up ------------------------------------------------------------------------------

    def _load(self) -> int:
        """Queue again what a previous run acknowledged and did not finish; returns how many."""
        assert self.path is not None and self.done_path is not None
        self._done = self._load_done(self.done_path)
        entries, torn = self._load_entries(self.path)
        last = max([e.seq for e in entries] + [self._done.through, *self._done.above])
        pending = [e for e in entries if e.seq not in self._done]
        self._next_seq = last + 1
        # from here on the numbers run on without gaps from the first pending one
        through = pending[0].seq - 1 if pending else last
        done = _Done(through, frozenset(s for s in self._done.above if s > through))
        for entry in pending:
            self._pending[entry.seq] = entry
            self._untaken.append(entry)
            self._bytes += entry.size
        try:
            if done != self._done or not self.done_path.exists():
                atomicfile.write_text(self.done_path, done.to_json() + "\n")
            self._done = done
            if torn or len(pending) != len(entries) or not self.path.exists():
                self._rewrite(pending)  # also cuts off a torn line, which the next append would join
            self.path.open("ab").close()  # the directory is writable: fail now, not at the first alert
            self._file_bytes = self.path.stat().st_size
        except (OSError, atomicfile.WriteFailed) as exc:
            raise QueueError(f"--state-dir queue {self.path}: {_cause(exc)}") from None
        return len(pending)

    @staticmethod
    def _load_done(path: Path) -> _Done:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return _Done()
        except OSError as exc:
            raise QueueError(f"--state-dir queue {path}: {_cause(exc)}") from None
        try:
            return _Done.from_json(text)
        except (ValueError, RecursionError) as exc:
            _set_aside(path, f"is not a queue done record ({str(exc)[:100]}); every queued line is acted on")
            return _Done()

    def _load_entries(self, path: Path) -> tuple[list[Entry], bool]:
        """The entries of the file, and whether a torn last line was dropped."""
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return [], False
        except OSError as exc:
            raise QueueError(f"--state-dir queue {path}: {_cause(exc)}") from None
        # compaction keeps a file we wrote under twice the bound; far more is not ours
        if size > 4 * self.limits.max_bytes + COMPACT_MIN_BYTES:
            _set_aside(path, f"is {size} bytes, more than a queue of at most {self.limits.max_bytes} holds")
            return [], False
        entries: list[Entry] = []
        try:
            with path.open("rb") as handle:
                lines = list(handle)
        except OSError as exc:
            raise QueueError(f"--state-dir queue {path}: {_cause(exc)}") from None
        torn = bool(lines) and not lines[-1].endswith(b"\n")
        if torn:
            log.warning("queue: %s: dropped a last line cut short by a crash (never acknowledged)", path)
            lines.pop()
        for number, raw in enumerate(lines, 1):
            try:
                entry = _entry(raw)
                if entries and entry.seq <= entries[-1].seq:
                    raise ValueError("sequence numbers out of order")
            except (ValueError, PayloadError, RecursionError) as exc:
                _set_aside(path, f"line {number} is not a queued notification ({str(exc)[:100]})")
                return [], False
            entries.append(entry)
        return entries, torn

    # ---- the HTTP side -------------------------------------------------------------------------

    def put(self, alerts: Sequence[Alert]) -> Entry:
        """Queue a notification, durably when there is a file; QueueFull or QueueError otherwise."""
        with self._io:
            with self._cond:
                if self._closed:
                    raise QueueError("the receiver is shutting down")
                seq = self._next_seq
                pending, pending_bytes = len(self._pending), self._bytes
            at = self.clock()
            line = _line(seq, at, alerts)
            if pending >= self.limits.max_entries:
                raise QueueFull(f"{pending} notifications waiting (at most {self.limits.max_entries})")
            if pending_bytes + len(line) > self.limits.max_bytes:
                raise QueueFull(
                    f"{pending_bytes} bytes of notifications waiting, this one {len(line)} "
                    f"(at most {self.limits.max_bytes})"
                )
            if self.path is not None:
                self._append(line)
            entry = Entry(seq, at, tuple(alerts), len(line))
            with self._cond:
                self._next_seq = seq + 1
                self._pending[seq] = entry
                self._untaken.append(entry)
                self._bytes += entry.size
                self._cond.notify_all()
        return entry

    def _append(self, line: bytes) -> None:
        """Append one line, flushed and fsynced; a failed write is cut off again, so the next
        line never joins a torn one."""
        assert self.path is not None
        try:
            with self.path.open("ab") as handle:
                start = handle.tell()
                try:
                    handle.write(line)
                    handle.flush()
                    os.fsync(handle.fileno())
                except OSError:
                    with contextlib.suppress(OSError):
                        handle.truncate(start)
                    raise
            self._file_bytes = start + len(line)
        except OSError as exc:
            self.write_errors += 1
            raise QueueError(f"queue {self.path}: {_cause(exc)}") from None

    # ---- the dispatcher's side -----------------------------------------------------------------

    def take(self, timeout: float | None = None) -> Entry | None:
        """The next notification not yet taken, in order; None after `close()` or the timeout."""
        with self._cond:
            self._cond.wait_for(lambda: self._untaken or self._closed, timeout)
            if self._closed or not self._untaken:
                return None
            return self._untaken.popleft()

    def done(self, seq: int) -> None:
        """Mark a taken notification acted on: recorded in the done file, then gone from the queue."""
        with self._io:
            with self._cond:
                entry = self._pending.get(seq)
                if entry is None:
                    return
                left_bytes = self._bytes - entry.size
            done = self._done.add(seq)
            if self.done_path is not None:
                try:
                    atomicfile.write_text(self.done_path, done.to_json() + "\n")
                except atomicfile.WriteFailed as exc:  # it stays in the file: acted on again later
                    self.write_errors += 1
                    log.error("queue: %s (notification %d may be acted on again after a restart)", exc, seq)
            self._done = done
            if self.path is not None and self._file_bytes > max(COMPACT_MIN_BYTES, 2 * left_bytes):
                with self._cond:
                    left = [e for e in self._pending.values() if e.seq != seq]
                try:
                    self._rewrite(left)
                except (OSError, atomicfile.WriteFailed) as exc:
                    self.write_errors += 1
                    log.error("queue: cannot compact %s: %s", self.path, _cause(exc))
            with self._cond:
                del self._pending[seq]
                self._bytes -= entry.size
                self._cond.notify_all()

    def _rewrite(self, entries: list[Entry]) -> None:
        """Replace the queue file by the lines of `entries` (atomically: no line is ever lost)."""
        assert self.path is not None
        data = b"".join(_line(e.seq, e.at, e.alerts) for e in entries)
        atomicfile.write_bytes(self.path, data)
        self._file_bytes = len(data)

    # ---- both ----------------------------------------------------------------------------------

    def drain(self, timeout: float) -> bool:
        """Wait until every queued notification has been acted on; False when `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout)

    def close(self) -> None:
        """Refuse new notifications and wake the dispatcher; what is pending stays in the file."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def describe(self) -> str:
        return f"file {self.path}" if self.path is not None else "memory"

    def stats(self) -> QueueStats:
        with self._cond:
            pending, size = len(self._pending), self._bytes
        return QueueStats(self.describe(), pending, size, self.limits.max_entries, self.limits.max_bytes)


def _cause(exc: BaseException) -> str:
    if isinstance(exc, atomicfile.WriteFailed):
        return exc.cause
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
