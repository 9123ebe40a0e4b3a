"""Job mapping files written by Slurm prolog/epilog scripts, in both formats peers use.

dcgm-exporter (`--hpc-job-mapping-dir`)
    file named `<gpu index>` or `<gpu index>.<gpu instance id>`; every line one job id.
Princeton jobstats (`/run/gpustat`)
    file named by GPU index, `GPU-<uuid>` or `MIG-<uuid>`; content `<job id> <uid>`.

Both can share one directory: a line with one token is a dcgm-style job id, a line with a job id and
a numeric uid is jobstats-style; blank lines and `#` comments are ignored. The files are written by
root but the directory may be writable by others, so every file is treated as hostile: symlinks
that leave the directory, non-regular files (FIFOs would block), files over `max_bytes`, binary
content and malformed lines make that file skipped with one log line naming it and the reason;
every other file is still used. Files are re-read only when their mtime/size changes.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from gpulens.exporter.attribution.logonce import LogOnce

DEFAULT_MAX_BYTES = 64 * 1024
_INDEX_NAME = re.compile(r"^(\d{1,4})(?:\.(\d{1,4}))?$")
_UUID_NAME = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{1,80}$")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+/=-]{0,127}$")


class MappingFormatError(ValueError):
    """A mapping file's content is not in either format."""


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
    """Entries of one file; raises MappingFormatError naming the first bad line."""
    if b"\0" in data:
        raise MappingFormatError("binary content (NUL bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MappingFormatError(f"not UTF-8 text (byte {exc.start})") from None
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
            shown = line[:40].encode("unicode_escape").decode("ascii")
            raise MappingFormatError(f"line {number} is {shown!r}; expected '<job id>' or '<job id> <uid>'")
    return tuple(entries)


class MappingDirectory:
    """The parsed mapping directory, re-listed every sample, files re-parsed only when changed."""

    def __init__(self, directory: Path, log: LogOnce, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._dir = directory
        self._log = log
        self._max_bytes = max_bytes
        self._parsed: dict[str, tuple[tuple[int, int, int], tuple[MappingEntry, ...] | None]] = {}
        self.entries: dict[MappingKey, tuple[MappingEntry, ...]] = {}

    def _reject(self, name: str, reason: str) -> None:
        self._log.warning(
            ("mapping-file", name, reason),
            "attribution: skipping job mapping file %s: %s",
            self._dir / name,
            reason,
        )

    def _read_file(
        self, entry: os.DirEntry[str]
    ) -> tuple[tuple[int, int, int], tuple[MappingEntry, ...] | None]:
        """(identity of the version read, entries or None when rejected)."""
        path = entry.path
        real_dir = os.path.realpath(self._dir)
        if entry.is_symlink():
            target = os.path.realpath(path)
            if os.path.dirname(target) != real_dir:
                self._reject(entry.name, f"symlink to {target} outside the mapping directory")
                return (0, 0, 0), None
            path = target
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            self._reject(entry.name, f"cannot open: {exc.strerror}")
            return (0, 0, 0), None
        try:
            info = os.fstat(fd)
            version = (info.st_ino, info.st_mtime_ns, info.st_size)
            cached = self._parsed.get(entry.name)
            if cached is not None and cached[0] == version:
                return cached
            if not stat.S_ISREG(info.st_mode):
                self._reject(entry.name, "not a regular file")
                return version, None
            if info.st_size > self._max_bytes:
                self._reject(
                    entry.name, f"{info.st_size} bytes, larger than the {self._max_bytes}-byte limit"
                )
                return version, None
            data = os.read(fd, self._max_bytes + 1)
        except OSError as exc:
            self._reject(entry.name, f"cannot read: {exc.strerror}")
            return (0, 0, 0), None
        finally:
            os.close(fd)
        if len(data) > self._max_bytes:
            self._reject(entry.name, f"larger than the {self._max_bytes}-byte limit")
            return version, None
        try:
            return version, parse_mapping_content(data)
        except MappingFormatError as exc:
            self._reject(entry.name, str(exc))
            return version, None

    def refresh(self) -> dict[MappingKey, tuple[MappingEntry, ...]]:
        """Re-list the directory; returns key -> entries of every acceptable, non-empty file."""
        try:
            dir_entries = list(os.scandir(self._dir))
            self._log.forget("mapping-dir-missing")
        except OSError as exc:
            self._log.warning(
                "mapping-dir-missing",
                "attribution: job mapping directory %s unreadable: %s",
                self._dir,
                exc.strerror,
            )
            self._parsed.clear()
            self.entries = {}
            return self.entries
        parsed: dict[str, tuple[tuple[int, int, int], tuple[MappingEntry, ...] | None]] = {}
        entries: dict[MappingKey, tuple[MappingEntry, ...]] = {}
        for entry in dir_entries:
            if entry.name.startswith("."):
                continue  # temporary files of atomic writers (prolog writes .name.tmp then renames)
            key = parse_mapping_name(entry.name)
            if key is None:
                self._log.info(
                    ("mapping-name", entry.name),
                    "attribution: ignoring %s: name is not <gpu>, <gpu>.<gpu_instance>, "
                    "GPU-<uuid> or MIG-<uuid>",
                    entry.path,
                )
                continue
            result = self._read_file(entry)
            parsed[entry.name] = result
            if result[1]:
                entries[key] = result[1]
        gone = set(self._parsed) - set(parsed)
        gone |= {name for name, (_, result) in parsed.items() if result is not None}  # fixed files re-arm
        if gone:
            self._log.forget_where(lambda k: isinstance(k, tuple) and len(k) == 3 and k[1] in gone)
        self._parsed = parsed
        self.entries = entries
        return entries
