"""Job mapping files written by Slurm prolog/epilog scripts, in both formats peers use.

dcgm-exporter (`--hpc-job-mapping-dir`)
    file named `<gpu index>` or `<gpu index>.<gpu instance id>`; every line one job id.
Princeton jobstats (`/run/gpustat`)
    file named by GPU index, `GPU-<uuid>` or `MIG-<uuid>`; content `<job id> <uid>`.

Both can share one directory: a line with one token is a dcgm-style job id, a line with a job id and
a numeric uid is jobstats-style; blank lines and `#` comments are ignored. The files are written by
root but the directory may be writable by others, so every file is treated as hostile: symlinks
that leave the directory, non-regular files (FIFOs would block), files over `max_bytes`, binary
content and malformed lines make that file skipped with one log line naming it, its size and the
reason class (never its content: a hard link to a secret file must not put its first line in the
log); every other file is still used.

The directory is refreshed every sample and must stay cheap with 100,000 files (a stat is ~6 µs, a
read ~20 µs, ~4x that on a loaded node, against an attribution deadline of 2 s):

- the listing is reused while the directory's own (inode, mtime) is unchanged and old enough not to
  hide a change made within the same timestamp tick ("racy", as git calls it);
- a file is re-read only when its (inode, mtime_ns, size) changed; one read less than a tick after
  its last modification is re-read once more;
- one refresh spends at most `budget` seconds on stats and reads (files never read first, then the
  others round-robin), so the first look at a huge directory is spread over several samples
  instead of missing the deadline of each (`FileState.PENDING` counts what waits);
- at most `max_files` entries are listed (`--job-mapping-max-files`): past that the refresh logs one
  line and uses the first `max_files` in directory order.

Log lines go through the attributor's bounded `LogOnce`: one line per bad file while it stays bad,
at most one per `REPEAT_SECONDS` for a file that flips between bad and good, and one summary line
when more files are bad than the table holds. `stats` (published after each refresh) feeds the
`gpulens_job_mapping_*` series.
"""

from __future__ import annotations

import enum
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from gpulens.exporter.attribution.logonce import LogOnce, Outcome

DEFAULT_MAX_BYTES = 64 * 1024
DEFAULT_MAX_FILES = 10_000
DEFAULT_BUDGET_SECONDS = 0.5
MIN_CHECKS = 64  # checked per refresh whatever the budget, so a starved refresh still progresses
REPEAT_SECONDS = 600.0  # a file logged as bad is logged again at most this often
RACY_NS = 100_000_000  # timestamp ticks are coarse (a jiffy): a version this fresh is re-read once
_INDEX_NAME = re.compile(r"^(\d{1,4})(?:\.(\d{1,4}))?$")
_UUID_NAME = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{1,80}$")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+/=-]{0,127}$")


class RejectReason(enum.StrEnum):
    """Why a mapping file was skipped: the `reason` label of gpulens_job_mapping_rejected_total."""

    SYMLINK_OUTSIDE = "symlink_outside"
    NOT_REGULAR = "not_regular"
    TOO_LARGE = "too_large"
    UNREADABLE = "unreadable"
    BINARY = "binary"
    NOT_UTF8 = "not_utf8"
    MALFORMED = "malformed"


class FileState(enum.StrEnum):
    """What became of a directory entry in the last refresh: the `state` label of
    gpulens_job_mapping_files."""

    USED = "used"  # parsed, names at least one job
    EMPTY = "empty"  # parsed, names no job (comments only: a GPU between jobs)
    REJECTED = "rejected"
    IGNORED = "ignored"  # name in neither format
    PENDING = "pending"  # not read yet: the refresh budget ran out first


class MappingFormatError(ValueError):
    """A mapping file's content is not in either format; the message never quotes the content."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class MappingEntry:
    job_id: str
    uid: int | None = None  # jobstats files carry the job owner's uid


@dataclass(frozen=True)
class MappingKey:
    """What a file name designates: a GPU index (+ GPU instance) or a GPU / MIG UUID."""

    gpu: int | None = None
    gpu_instance: int | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class MappingStats:
    """The directory as of the last refresh (for the exporter's own series and its log lines)."""

    files: Mapping[FileState, int] = field(default_factory=dict)
    max_files: int = DEFAULT_MAX_FILES
    truncated: bool = False  # the directory holds more than max_files entries
    reads: int = 0  # file versions read since start
    rejected: Mapping[RejectReason, int] = field(default_factory=dict)  # since start, per version
    refresh_seconds: float = 0.0

    @property
    def listed(self) -> int:
        return sum(self.files.values())


@dataclass(frozen=True)
class _Version:
    """One read of one file: its identity when read (None: read it again), what it gave."""

    identity: tuple[int, int, int, int] | None
    entries: tuple[MappingEntry, ...] = ()
    rejected: RejectReason | None = None


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    """What says a file changed: inode (replaced by rename), mtime and size (rewritten), ctime
    (chmod: an unreadable file made readable)."""
    return (info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size)


def parse_mapping_name(name: str) -> MappingKey | None:
    """Key of a mapping file name, or None when the name is in neither format."""
    match = _INDEX_NAME.match(name)
    if match:
        gi = match.group(2)
        return MappingKey(gpu=int(match.group(1)), gpu_instance=int(gi) if gi is not None else None)
    if _UUID_NAME.match(name):
        return MappingKey(uuid=name)
    return None


def parse_mapping_content(data: bytes) -> tuple[MappingEntry, ...]:
    """Entries of one file; raises MappingFormatError naming the first bad line (by number only)."""
    if b"\0" in data:
        raise MappingFormatError(RejectReason.BINARY, "binary content (NUL bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MappingFormatError(RejectReason.NOT_UTF8, f"not UTF-8 text (byte {exc.start})") from None
    entries: list[MappingEntry] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        tokens = line.split()
        if len(tokens) == 1 and _JOB_ID.match(tokens[0]):
            entries.append(MappingEntry(job_id=tokens[0]))
        elif len(tokens) == 2 and _JOB_ID.match(tokens[0]) and tokens[1].isdigit() and len(tokens[1]) <= 10:
            entries.append(MappingEntry(job_id=tokens[0], uid=int(tokens[1])))
        else:
            raise MappingFormatError(
                RejectReason.MALFORMED,
                f"line {number} is neither '<job id>' nor '<job id> <uid>' ({len(tokens)} fields)",
            )
    return tuple(entries)


def shown_name(name: str) -> str:
    """A file name as a log line may carry it: control characters and non-ASCII escaped."""
    if name.isascii() and name.isprintable():
        return name
    return name.encode("unicode_escape", "backslashreplace").decode("ascii")


class MappingDirectory:
    """The parsed mapping directory, refreshed every sample in bounded time (module docstring)."""

    def __init__(
        self,
        directory: Path,
        log: LogOnce,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_files: int = DEFAULT_MAX_FILES,
        budget: float = DEFAULT_BUDGET_SECONDS,
    ) -> None:
        self._dir = directory
        self._log = log
        self._max_bytes = max_bytes
        self._max_files = max(1, max_files)
        self._budget = budget
        # the listing in use: mapping names in directory order with their keys, junk names apart
        self._names: list[str] = []
        self._keys: dict[str, MappingKey] = {}
        self._ignored: set[str] = set()
        self._listed_at: tuple[int, int] | None = None  # directory (inode, mtime_ns) of the listing
        self._truncated = False
        self._files: dict[str, _Version] = {}  # name -> the version last read (absent: pending)
        self._unread: list[str] = []  # pending names, checked before the round-robin goes on
        self._cursor = 0  # round-robin position in _names
        self._counts = dict.fromkeys(FileState, 0)
        self._entries: dict[MappingKey, tuple[MappingEntry, ...]] = {}
        self._entries_changed = False
        self._reads = 0
        self._rejected: dict[RejectReason, int] = {}
        self._summary_logged = -1e18
        self.entries: Mapping[MappingKey, tuple[MappingEntry, ...]] = MappingProxyType({})
        self.stats = MappingStats(max_files=self._max_files)
        self.listed = 0  # entries of the listing in use (updated before the files are checked)

    @property
    def directory(self) -> Path:
        return self._dir

    # ---- logging -------------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return f"{self._dir}/{shown_name(name)}"

    def _reject(self, name: str, reason: RejectReason, detail: str, size: int | None) -> Outcome:
        self._rejected[reason] = self._rejected.get(reason, 0) + 1
        sized = f" ({size} bytes)" if size is not None else ""
        return self._log.warning(
            ("mapping-file", name),
            "attribution: skipping job mapping file %s%s: %s: %s",
            self._path(name),
            sized,
            reason.value,
            detail,
        )

    def _summarise(self, unlogged: int) -> None:
        """One line for the problems the bounded log table had no room for."""
        now = time.monotonic()
        if unlogged and now - self._summary_logged >= REPEAT_SECONDS:
            self._summary_logged = now
            self._log.logger.warning(
                "attribution: %d more job mapping files in %s have problems that are not logged one by"
                " one (the log keeps %d); gpulens_job_mapping_files counts them by state",
                unlogged,
                self._dir,
                len(self._log),
            )

    # ---- listing -------------------------------------------------------------------------------
    def _list(self) -> bool:
        """Take the listing again unless the directory is unchanged; False when it is unreadable.

        Costs O(entries) only when the directory changed (a file created, deleted or renamed);
        a refresh of an unchanged directory costs O(files checked)."""
        try:
            info = os.stat(self._dir)
        except OSError as exc:
            self._unreadable(exc)
            return False
        identity = (info.st_ino, info.st_mtime_ns)
        if identity == self._listed_at:
            return True
        names: list[str] = []
        keys: dict[str, MappingKey] = {}
        ignored: set[str] = set()
        truncated = False
        try:
            with os.scandir(self._dir) as scan:
                for entry in scan:
                    name = entry.name
                    if name.startswith("."):
                        continue  # temporary files of atomic writers (prolog writes .name.tmp, renames)
                    if len(names) + len(ignored) >= self._max_files:
                        truncated = True
                        break
                    listed = len(names) + len(ignored)
                    if not listed % 1024:  # for the deadline's log line while a huge listing runs
                        self.listed = max(self.listed, listed)
                    key = self._keys.get(name) or parse_mapping_name(name)
                    if key is None:
                        ignored.add(name)
                    else:
                        names.append(name)
                        keys[name] = key
        except OSError as exc:
            self._unreadable(exc)
            return False
        self._log.forget("mapping-dir-missing")
        # a listing taken less than a tick after the directory's last change may miss a change
        # made in the same tick: take it again next time
        fresh = time.time_ns() - info.st_mtime_ns < RACY_NS
        self._listed_at = None if fresh else identity
        self._relisted(names, keys, ignored)
        if truncated:
            self._log.warning(
                "mapping-dir-truncated",
                "attribution: job mapping directory %s holds more than %d entries"
                " (--job-mapping-max-files); only the first %d in directory order are used",
                self._dir,
                self._max_files,
                self._max_files,
            )
        else:
            self._log.forget("mapping-dir-truncated")
        self._truncated = truncated
        return True

    def _relisted(self, names: list[str], keys: dict[str, MappingKey], ignored: set[str]) -> None:
        for name in ignored - self._ignored:
            self._log.info(
                ("mapping-name", name),
                "attribution: ignoring %s: name is not <gpu>, <gpu>.<gpu_instance>, GPU-<uuid> or MIG-<uuid>",
                self._path(name),
            )
        for name in self._ignored - ignored:
            self._log.drop(("mapping-name", name))
        for name in [n for n in self._keys if n not in keys]:  # deleted (or now past the limit)
            self._set(name, None)
            self._counts[FileState.PENDING] -= 1
            self._log.drop(("mapping-file", name))
        self._counts[FileState.PENDING] += sum(1 for n in keys if n not in self._keys)
        self._counts[FileState.IGNORED] = len(ignored)
        self._names, self._keys, self._ignored = names, keys, ignored
        self._unread = [n for n in names if n not in self._files]
        self.listed = len(names) + len(ignored)

    def _unreadable(self, exc: OSError) -> None:
        self._log.warning(
            "mapping-dir-missing",
            "attribution: job mapping directory %s unreadable: %s",
            self._dir,
            exc.strerror,
        )
        self._relisted([], {}, set())
        self._listed_at = None
        self._truncated = False

    # ---- reading -------------------------------------------------------------------------------
    def _check(self, name: str, real_dir: str) -> _Version | None:
        """The file's current version: the cached one when unchanged; None when it is gone."""
        path = os.path.join(self._dir, name)
        try:
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                target = os.path.realpath(path)
                if os.path.dirname(target) != real_dir:
                    detail = "symlink leads outside the mapping directory"
                    return self._rejected_version(name, RejectReason.SYMLINK_OUTSIDE, detail, None)
                path = target
                info = os.stat(path)
        except FileNotFoundError:
            if os.path.islink(path):  # a dangling symlink
                return self._rejected_version(name, RejectReason.UNREADABLE, "dangling symlink", None)
            return None
        except OSError as exc:
            return self._rejected_version(name, RejectReason.UNREADABLE, f"cannot stat: {exc.strerror}", None)
        cached = self._files.get(name)
        if cached is not None and cached.identity == _identity(info):
            return cached
        return self._read(name, path, info)

    def _rejected_version(
        self,
        name: str,
        reason: RejectReason,
        detail: str,
        size: int | None,
        identity: tuple[int, int, int, int] | None = None,
    ) -> _Version:
        cached = self._files.get(name)
        if cached is not None and cached.rejected is reason and cached.identity == identity:
            return cached  # same verdict on the same thing: counted and logged once
        self._reject(name, reason, detail, size)
        return _Version(identity, rejected=reason)

    def _read(self, name: str, path: str, info: os.stat_result) -> _Version:
        identity: tuple[int, int, int, int] | None = _identity(info)
        if not stat.S_ISREG(info.st_mode):
            reason = RejectReason.NOT_REGULAR
            return self._rejected_version(name, reason, "not a regular file", None, identity)
        if info.st_size > self._max_bytes:
            return self._rejected_version(
                name,
                RejectReason.TOO_LARGE,
                f"larger than the {self._max_bytes}-byte limit",
                info.st_size,
                identity,
            )
        self._reads += 1
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            return _Version(identity, rejected=self._note(name, RejectReason.UNREADABLE, exc, info.st_size))
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):  # replaced between the stat and the open
                return self._rejected_version(name, RejectReason.NOT_REGULAR, "not a regular file", None)
            identity = _identity(opened)
            data = os.read(fd, self._max_bytes + 1)
        except OSError as exc:
            return _Version(identity, rejected=self._note(name, RejectReason.UNREADABLE, exc, info.st_size))
        finally:
            os.close(fd)
        if len(data) > self._max_bytes:
            return self._rejected_version(
                name, RejectReason.TOO_LARGE, f"larger than the {self._max_bytes}-byte limit", len(data)
            )
        if time.time_ns() - opened.st_mtime_ns < RACY_NS:
            identity = None  # written within a tick of this read: read it again next time
        try:
            entries = parse_mapping_content(data)
        except MappingFormatError as exc:
            self._reject(name, exc.reason, str(exc), len(data))  # still bad after a change: not logged
            return _Version(identity, rejected=exc.reason)
        self._log.forget(("mapping-file", name), quiet_for=REPEAT_SECONDS)
        return _Version(identity, entries)

    def _note(self, name: str, reason: RejectReason, exc: OSError, size: int) -> RejectReason:
        self._reject(name, reason, f"cannot read: {exc.strerror}", size)
        return reason

    # ---- the refresh -----------------------------------------------------------------------------
    def _set(self, name: str, version: _Version | None) -> None:
        """Record `name`'s version (None: it is gone), keeping counts and entries in step."""
        old = self._files.get(name)
        if old is version:
            return
        self._counts[_state(old)] -= 1
        self._counts[_state(version)] += 1
        if version is None:
            del self._files[name]
        else:
            self._files[name] = version
        before = old.entries if old is not None else ()
        after = version.entries if version is not None else ()
        if before != after:
            key = self._keys[name]
            if after:
                self._entries[key] = after
            else:
                self._entries.pop(key, None)
            self._entries_changed = True

    def refresh(self) -> Mapping[MappingKey, tuple[MappingEntry, ...]]:
        """Bring the directory up to date (within the budget); returns key -> entries of every
        acceptable, non-empty file."""
        started = time.perf_counter()
        suppressed_before = self._log.suppressed
        self._entries_changed = False
        if self._list():
            self._check_files(started)
        if self._entries_changed:
            self.entries = MappingProxyType(dict(self._entries))  # the previous one stays as it was
        self._summarise(self._log.suppressed - suppressed_before)
        self._publish(started)
        return self.entries

    def _check_files(self, started: float) -> None:
        """Stat (and read when changed) files until the budget is spent: pending ones first, then
        the others round-robin."""
        deadline = started + self._budget
        real_dir = os.path.realpath(self._dir)
        checked = 0
        just_read: set[str] = set()
        while self._unread and (checked < MIN_CHECKS or time.perf_counter() < deadline):
            name = self._unread.pop()
            if name in self._keys and name not in self._files:
                self._set(name, self._check(name, real_dir))
                just_read.add(name)
                checked += 1
        names = self._names
        for _ in range(len(names) - len(just_read)):
            if checked >= MIN_CHECKS and time.perf_counter() >= deadline:
                break
            if self._cursor >= len(names):
                self._cursor = 0
            name = names[self._cursor]
            self._cursor += 1
            if name not in just_read:
                checked += 1
                self._set(name, self._check(name, real_dir))

    def _publish(self, started: float) -> None:
        self.stats = MappingStats(
            files=MappingProxyType(dict(self._counts)),
            max_files=self._max_files,
            truncated=self._truncated,
            reads=self._reads,
            rejected=MappingProxyType(dict(self._rejected)),
            refresh_seconds=time.perf_counter() - started,
        )


def _state(version: _Version | None) -> FileState:
    if version is None:
        return FileState.PENDING
    if version.rejected is not None:
        return FileState.REJECTED
    return FileState.USED if version.entries else FileState.EMPTY
