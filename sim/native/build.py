"""Build the native simulated NVML library from its C source, with the system C compiler.

The library is compiled on first use into a cache directory named after a hash of the sources
and the compile command (so an upgrade rebuilds, and every process of one version shares one
build), as `libnvidia-ml.so.1` with that soname: a directory a program's LD_LIBRARY_PATH can
name. Nothing is downloaded. `python -m gpulens.sim.native.build` (the Makefile's `native`
target) builds it ahead of time and prints the directory.

The cache is `$GPULENS_NATIVE_DIR` when set, else `$XDG_CACHE_HOME/gpulens` (`~/.cache/gpulens`),
else a directory under the system's temporary directory when that is not writable.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from gpulens.sim.native.layout import check_library

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("simnvml.c", "layout.h")
LIBRARY = "libnvidia-ml.so.1"
FLAGS = (
    "-std=gnu11",
    "-O2",
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
    f"-Wl,-soname,{LIBRARY}",
)
LIBS = ("-lpthread", "-lm")

_loaded: ctypes.CDLL | None = None
_load_lock = threading.Lock()


class NativeBuildError(RuntimeError):
    """The library could not be built; the message is one line saying why and what to do."""


def compiler() -> str:
    """The C compiler: $CC, else cc, else gcc, else clang."""
    wanted = os.environ.get("CC")
    for candidate in ([wanted] if wanted else []) + ["cc", "gcc", "clang"]:
        path = shutil.which(shlex.split(candidate)[0]) if candidate else None
        if path:
            return candidate
    raise NativeBuildError(
        "the native simulated NVML library needs a C compiler: none found "
        "(install one, e.g. `apt-get install gcc`, or set CC)"
    )


def _cache_root() -> Path:
    explicit = os.environ.get("GPULENS_NATIVE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    root = base / "gpulens"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"gpulens-{os.getuid()}"


def _digest(cc: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (SOURCE_DIR / name).read_bytes())
    h.update(" ".join((cc, *FLAGS, *LIBS)).encode())
    return h.hexdigest()[:16]


def library_dir() -> Path:
    """The directory holding the built `libnvidia-ml.so.1` (built now if it is not there)."""
    cc = compiler()
    directory = _cache_root() / f"native-{_digest(cc)}"
    if (directory / LIBRARY).is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:  # one build at a time; the others wait and reuse it
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / LIBRARY).is_file():
            _compile(cc, directory)
    return directory


def _compile(cc: str, directory: Path) -> None:
    partial = directory / f".{LIBRARY}.{os.getpid()}"
    command = [*shlex.split(cc), *FLAGS, "-o", str(partial), str(SOURCE_DIR / "simnvml.c"), *LIBS]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:
        raise NativeBuildError(f"cannot run the C compiler {cc!r}: {error.strerror}") from None
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip())
        raise NativeBuildError(f"building the native simulated NVML library failed: {first}")
    os.replace(partial, directory / LIBRARY)
    link = directory / "libnvidia-ml.so"  # for `cc ... -lnvidia-ml`
    if not link.exists():
        with contextlib.suppress(FileExistsError):
            link.symlink_to(LIBRARY)


def library_path() -> Path:
    return library_dir() / LIBRARY


def load() -> ctypes.CDLL:
    """The library, loaded into this process once (RTLD_GLOBAL, so that pynvml's own
    `CDLL("libnvidia-ml.so.1")` in this process finds this one by its soname)."""
    global _loaded
    with _load_lock:
        if _loaded is None:
            lib = ctypes.CDLL(str(library_path()), mode=ctypes.RTLD_GLOBAL)
            check_library(lib)
            _loaded = lib
        return _loaded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpulens.sim.native.build", description=__doc__.splitlines()[0]
    )
    parser.parse_args(argv)
    try:
        print(library_dir())
    except NativeBuildError as error:
        print(f"gpulens: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
