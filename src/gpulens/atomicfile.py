"""Atomic file and directory replacement: what gpulens writes for a user is all there or not at all.

A file is written under a hidden temporary name in its own directory (same filesystem, so the
rename cannot turn into a copy), flushed, fsynced, renamed over the target, and the directory is
fsynced so the rename itself survives a power cut. A failure at any byte (a full disk, EIO, a
signal) removes the temporary file and leaves the previous file as it was: no 0-byte or truncated
output, no stray temporary file.

Four shapes:

- `replace_file(path)`: one file (a textfile, a generated rule file).
- `FileSet`: several files written together: every part is written to its temporary name first
  and only when all are complete are they renamed, so a failure while writing (the only step that
  needs disk space) leaves the previous set whole. A kill *between* the renames still leaves a mix.
- `write_set(root, texts)`: several files that are only meaningful together (a report: its
  jobs.json and plan.json are read together as `--previous`), swapped in as a whole with one
  rename. The set lives in a version directory `.<stem>-<random>` under `root`; `.<stem>-current`
  is a symlink to the current version, replaced by one `rename(2)` (the commit); each file's
  user-facing path (`root/report.html`) is a symlink through it (`.<stem>-current/report.html`),
  made once. A kill at any instant leaves every path reading the old set or every path the new
  one; the next run removes what a killed one left (temporary names, versions no longer current,
  links to files the set no longer has). Files of the old layout (regular files at those paths)
  are first adopted into a version by hard links, so the switch itself is never a mix either.
  Where symlinks cannot be made it falls back to `FileSet`.
- `replace_directory(path)`: a directory that is only meaningful as a whole (a history: its
  `meta.json` describes its `samples.parquet`). The new directory is built beside the old one and
  swapped in with one `renameat2(RENAME_EXCHANGE)`: readers see the old directory or the new one,
  never a mix, and a crash at any instant leaves one complete history at the path.

Errors are `WriteFailed`: one line naming the file and the cause (`No space left on device`).
Every file is created through `_create`, the single seam where tests inject a full disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import io
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO, TextIO

TEMP_MARK = ".tmp-"  # hidden temporary names: `.<name>.tmp-<random>`
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class WriteFailed(Exception):
    """A file could not be written; the message is one line: `<path>: cannot write: <cause>`."""

    def __init__(self, path: Path | str, cause: str) -> None:
        self.path = Path(path)
        self.cause = cause
        super().__init__(f"{path}: cannot write: {cause}")


def _cause(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text or type(exc).__name__


def temp_name(path: Path) -> Path:
    """A fresh hidden name beside `path`."""
    return path.with_name(f".{path.name}{TEMP_MARK}{secrets.token_hex(4)}")


def is_temp(path: Path) -> bool:
    return path.name.startswith(".") and TEMP_MARK in path.name


def _default_mode() -> int:
    """What `open(path, "w")` would give: 0666 less the umask (read without changing it)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    mask = os.umask(0o022)  # fallback; not thread-safe, only without /proc
    os.umask(mask)
    return 0o666 & ~mask


def _create(path: Path) -> BinaryIO:
    """Create `path` (which must not exist) for writing. The one seam for fault injection."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    return os.fdopen(fd, "wb")


def fsync_dir(directory: Path) -> None:
    """Make a rename or create in `directory` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory
            os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def create_file(path: Path, mode: int | None = None) -> Iterator[BinaryIO]:
    """Write a new file at `path` (inside a temporary directory): flushed and fsynced on success.

    Used for the parts of a directory built by `replace_directory`; on failure the caller removes
    the whole directory. The file gets `mode` (default: what the umask allows).
    """
    handle = _create(path)
    try:
        yield handle
        handle.flush()
        os.fchmod(handle.fileno(), _default_mode() if mode is None else mode)
        os.fsync(handle.fileno())
    finally:
        handle.close()


@contextlib.contextmanager
def create_text(path: Path, mode: int | None = None) -> Iterator[TextIO]:
    """`create_file` for text (UTF-8)."""
    with create_file(path, mode) as raw, _as_text(raw) as text:
        yield text


@contextlib.contextmanager
def _as_text(raw: BinaryIO) -> Iterator[TextIO]:
    """UTF-8 text over `raw`, flushed into it and detached, so that its owner closes it."""
    text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
    try:
        yield text
        text.flush()
    finally:
        text.detach()


def _target_mode(path: Path) -> int:
    """An existing file keeps its permissions; a new one gets what the umask allows."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return _default_mode()


class FileSet:
    """Files written together: all parts go to temporary names, renamed only once all are complete.

    `with FileSet() as files: files.write_text(path, text)`; leaving the block normally commits,
    an exception (or `abort()`) removes every temporary file. Errors are `WriteFailed`.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []  # (temporary, target)

    def __enter__(self) -> FileSet:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()

    @contextlib.contextmanager
    def open(self, path: str | Path) -> Iterator[BinaryIO]:
        """A binary handle whose content becomes `path` at commit."""
        target = Path(path)
        tmp = temp_name(target)
        try:
            handle = _create(tmp)
        except OSError as exc:
            raise WriteFailed(target, _cause(exc)) from None
        self._staged.append((tmp, target))
        try:
            try:
                yield handle
                handle.flush()
                os.fchmod(handle.fileno(), _target_mode(target))
                os.fsync(handle.fileno())
            finally:
                handle.close()
        except OSError as exc:
            raise WriteFailed(target, _cause(exc)) from None

    @contextlib.contextmanager
    def open_text(self, path: str | Path) -> Iterator[TextIO]:
        """A UTF-8 text handle whose content becomes `path` at commit."""
        with self.open(path) as raw, _as_text(raw) as text:
            yield text

    def write_text(self, path: str | Path, text: str) -> None:
        with self.open_text(path) as handle:
            handle.write(text)

    def write_bytes(self, path: str | Path, data: bytes) -> None:
        with self.open(path) as handle:
            handle.write(data)

    def commit(self) -> None:
        """Rename every part into place (no space needed), then make the renames durable."""
        staged, self._staged = self._staged, []
        directories: set[Path] = set()
        for i, (tmp, target) in enumerate(staged):
            try:
                os.replace(tmp, target)
            except OSError as exc:
                for rest, _ in staged[i:]:
                    with contextlib.suppress(OSError):
                        os.unlink(rest)
                raise WriteFailed(target, _cause(exc)) from None
            directories.add(target.parent)
        for directory in directories:
            fsync_dir(directory)

    def abort(self) -> None:
        staged, self._staged = self._staged, []
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@contextlib.contextmanager
def replace_file(path: str | Path) -> Iterator[BinaryIO]:
    """One file replaced atomically: `with replace_file(p) as handle: handle.write(...)`."""
    with FileSet() as files, files.open(path) as handle:
        yield handle


def write_text(path: str | Path, text: str) -> None:
    """`Path.write_text`, atomically (UTF-8)."""
    with FileSet() as files:
        files.write_text(path, text)


def write_bytes(path: str | Path, data: bytes) -> None:
    """`Path.write_bytes`, atomically."""
    with FileSet() as files:
        files.write_bytes(path, data)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False  # an old kernel or a filesystem without exchange
    raise OSError(code, os.strerror(code), str(b))


@contextlib.contextmanager
def replace_directory(
    path: str | Path, replaceable: Callable[[Path], str | None] = lambda _: None
) -> Iterator[Path]:
    """Build a new directory and swap it in for `path` as a unit.

    Yields an empty temporary directory beside `path` (same filesystem); fill it with
    `create_file`. On success it takes `path`'s place in one atomic exchange and the previous
    directory is deleted afterwards; on any failure the temporary directory is removed and `path`
    is untouched. `replaceable(existing)` returns why an existing directory must not be replaced
    (it holds other files), or None; a symlinked `path` replaces the directory it points to.
    Errors are `WriteFailed` naming `path`.

    Where the exchange is not supported the old directory is first renamed aside to
    `.<name>.tmp-old-<random>` and then the new one renamed in: two renames, no data written
    between them, and the old one is deleted only after the new one is in place.
    """
    shown = Path(path)
    target = Path(os.path.realpath(path))
    try:
        exists = target.is_dir()
        if target.exists() and not exists:
            raise WriteFailed(shown, "exists and is not a directory")
        if exists and os.path.ismount(target):
            # its parent is another filesystem: the new directory cannot be built there and swapped
            raise WriteFailed(
                shown,
                "is a mount point, which cannot be replaced as a whole; "
                f"write to a directory inside it ({shown / 'history'})",
            )
        if exists:
            refusal = replaceable(target)
            if refusal:
                raise WriteFailed(shown, refusal)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(target)
        os.mkdir(tmp, 0o700)
    except OSError as exc:
        raise WriteFailed(shown, _cause(exc)) from None
    try:
        try:
            yield tmp
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode) if exists else 0o777 & ~_umask())
            fsync_dir(tmp)
            if exists:
                if _exchange(tmp, target):
                    fsync_dir(target.parent)
                    shutil.rmtree(tmp, ignore_errors=True)  # now the previous directory
                    return
                aside = target.with_name(f".{target.name}{TEMP_MARK}old-{secrets.token_hex(4)}")
                os.rename(target, aside)
                try:
                    os.rename(tmp, target)
                except OSError:
                    os.rename(aside, target)
                    raise
                fsync_dir(target.parent)
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(tmp, target)
                fsync_dir(target.parent)
        except OSError as exc:
            raise WriteFailed(shown, _cause(exc)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    return 0o666 & ~_default_mode()


# -- a set of files swapped in as a whole (a report) -------------------------------------------------


def _rename(src: Path, dst: Path) -> None:
    """`os.replace` for the steps of `write_set`: the one seam where tests fail or kill each step."""
    os.replace(src, dst)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on `directory` itself (no lock file), so two runs writing the same set
    never remove each other's versions; where directories cannot be locked, no lock."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _symlinks_work(root: Path) -> bool:
    probe = temp_name(root / ".symlink-probe")
    try:
        os.symlink(".", probe)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return True


class _SwappedSet:
    """The layout and steps of `write_set` under one root (see the module docstring)."""

    def __init__(self, root: Path, stem: str) -> None:
        self.root = root
        self.pointer = root / f".{stem}-current"
        self.version_name = re.compile(rf"\.{re.escape(stem)}-[0-9a-f]{{8}}")

    def new_version(self) -> Path:
        version = self.root / f"{self.pointer.name.removesuffix('-current')}-{secrets.token_hex(4)}"
        os.mkdir(version)
        return version

    def current(self) -> str | None:
        """The current version's name, None without one (a first run, or the old layout)."""
        try:
            target = os.readlink(self.pointer)
        except OSError:
            return None
        return target if self.version_name.fullmatch(target) and (self.root / target).is_dir() else None

    def link_target(self, rel: str) -> str:
        """What `root/rel` points at: the file under the current version."""
        depth = len(Path(rel).parts) - 1
        return "../" * depth + f"{self.pointer.name}/{rel}"

    def is_ours(self, path: Path, rel: str) -> bool:
        try:
            return os.readlink(path) == self.link_target(rel)
        except OSError:
            return False

    def point(self, version: str) -> None:
        """Make `version` current: a symlink under a temporary name renamed over the pointer."""
        tmp = temp_name(self.pointer)
        os.symlink(version, tmp)
        try:
            fsync_dir(self.root)
            _rename(tmp, self.pointer)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        fsync_dir(self.root)

    def link(self, rel: str) -> bool:
        """Make `root/rel` our symlink (over a regular file of the old layout); False if it was."""
        path = self.root / rel
        if self.is_ours(path, rel):
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(path)
        os.symlink(self.link_target(rel), tmp)
        try:
            _rename(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True

    def adopt(self, legacy: list[str]) -> None:
        """Regular files at the set's paths (the old layout) into a version, by hard links, then
        each path replaced by our link: every path reads the same bytes at every step."""
        version = self.new_version()
        try:
            current = self.current()
            if current is not None:
                shutil.copytree(self.root / current, version, dirs_exist_ok=True, copy_function=_link_or_copy)
            for rel in legacy:
                (version / rel).parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(version / rel)
                _link_or_copy(str(self.root / rel), str(version / rel))
            _fsync_tree(version)
            self.point(version.name)
        except BaseException:
            if self.current() != version.name:
                shutil.rmtree(version, ignore_errors=True)
            raise
        for rel in legacy:
            self.link(rel)
        fsync_dir(self.root)

    def clean(self, rels: list[str]) -> None:
        """Remove what a killed or finished run leaves: temporary names beside the set's paths and
        the pointer, versions that are not current, and our links that lead nowhere."""
        current = self.current()
        directories = {self.root} | {(self.root / rel).parent for rel in rels}
        with contextlib.suppress(OSError):  # where links of an earlier set may be (config/)
            directories |= {
                p
                for p in self.root.iterdir()
                if not p.name.startswith(".") and p.is_dir() and not p.is_symlink()
            }
        for directory in directories:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                path = Path(entry.path)
                if directory == self.root and self.version_name.fullmatch(entry.name):
                    if entry.name != current and entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(path, ignore_errors=True)
                    continue
                if is_temp(path) and self._temp_of_ours(path, rels):
                    with contextlib.suppress(OSError):
                        if entry.is_dir(follow_symlinks=False):
                            shutil.rmtree(path)
                        else:
                            os.unlink(path)
                    continue
                if entry.is_symlink() and not path.exists():
                    rel = str(path.relative_to(self.root))
                    if self.is_ours(path, rel):
                        with contextlib.suppress(OSError):
                            os.unlink(path)

    def _temp_of_ours(self, path: Path, rels: list[str]) -> bool:
        base = path.name[1:].split(TEMP_MARK, 1)[0]
        if base == self.pointer.name or base == ".symlink-probe":
            return True
        return any(Path(rel).name == base and (self.root / rel).parent == path.parent for rel in rels)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _fsync_tree(top: Path) -> None:
    for directory, _, _ in os.walk(top):
        fsync_dir(Path(directory))


def write_set(root: str | Path, texts: Mapping[str, str], stem: str = "report") -> None:
    """Write `texts` (path relative to `root` -> UTF-8 text) as one set, swapped in as a whole.

    See the module docstring for the layout. Other files under `root` are left alone; a file the
    previous set had and this one has not is removed. Errors are `WriteFailed` naming the
    user-facing path; the previous set is then whole and nothing temporary is left.
    """
    top = Path(root)
    rels = [str(Path(rel)) for rel in texts]
    try:
        top.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteFailed(top, _cause(exc)) from None
    if not _symlinks_work(top):
        with FileSet() as files:
            for rel, text in texts.items():
                (top / rel).parent.mkdir(parents=True, exist_ok=True)
                files.write_text(top / rel, text)
        return
    swapped = _SwappedSet(top, stem)
    with _locked(top):
        whole = top / rels[0] if rels else top  # named for the steps of the set as a whole
        shown = whole
        made: list[str] = []
        version: Path | None = None
        try:
            swapped.clean(rels)
            legacy = [rel for rel in rels if (top / rel).is_file() and not (top / rel).is_symlink()]
            if legacy:
                swapped.adopt(legacy)
            version = swapped.new_version()
            for rel, text in zip(rels, texts.values(), strict=True):
                shown = top / rel
                (version / rel).parent.mkdir(parents=True, exist_ok=True)
                with create_text(version / rel, _target_mode(top / rel)) as out:
                    out.write(text)
            _fsync_tree(version)
            for rel in rels:  # links for paths new to the set: they lead nowhere until the commit
                shown = top / rel
                if swapped.link(rel):
                    made.append(rel)
            shown = whole
            swapped.point(version.name)  # the commit
        except BaseException as exc:
            if version is not None and swapped.current() != version.name:
                shutil.rmtree(version, ignore_errors=True)
                for rel in made:
                    with contextlib.suppress(OSError):
                        os.unlink(top / rel)
            if isinstance(exc, OSError):
                raise WriteFailed(shown, _cause(exc)) from None
            raise
        with contextlib.suppress(OSError):
            swapped.clean(rels)
            fsync_dir(top)
