"""SIGTERM and SIGHUP end a `gpulens` command the way Ctrl-C does: by unwinding, not by dying.

Python's default for SIGTERM and SIGHUP is to die at once, skipping every `finally` and `with`
exit: the simulator's temporary directories, a half-built history beside `--out` and the native
driver's shared-memory file would all stay behind. `install()` turns both into `Terminated`, raised
in the main thread, so everything on the way out runs; the command then exits 128 + the signal
number, as a shell reports a killed program. `Terminated` is a BaseException (like
KeyboardInterrupt) so that `except Exception` handlers do not swallow it.

A signal the parent set to be ignored (`nohup` ignores SIGHUP) stays ignored, and daemons that
handle signals themselves (`gpulens remediate serve` logs SIGHUP) install their own handlers over
these.

A daemon whose handler only records the signal for its main loop (the exporter's) calls
`request(signum)` as well; work that can run long in the main thread (parsing a user's YAML file,
`gpulens.safeload`) calls `check()` now and then, which raises `Terminated` once a stop was
requested, so a SIGTERM is never held up until the work is done.

Ctrl-C (SIGINT) raises `Interrupted`, a KeyboardInterrupt of our own, rather than the bare one
Python's default handler raises. CPython 3.11 marks a bare KeyboardInterrupt that leaves code run
from a string (every `@dataclass` builds its methods with `exec`, so lazy imports do) as unhandled
even when the command catches it further up; `python -m` then kills itself with SIGINT on the way
out instead of returning the 130 the command chose. The interpreter compares the exact type, so a
subclass is never marked, and every `except KeyboardInterrupt` still catches it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):  # named like KeyboardInterrupt, which it mirrors
    """The process was asked to stop by `signum`."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


_requested: int | None = None  # a stop recorded by a daemon's handler, not yet acted on


def request(signum: int) -> None:
    """Note that the process was asked to stop by `signum` (from a recording signal handler)."""
    global _requested
    _requested = signum


def check() -> None:
    """Raise `Terminated` if a stop was requested (`request`); cheap enough to call in loops."""
    if _requested is not None:
        raise Terminated(_requested)


def clear() -> None:
    """Forget a requested stop (a daemon that has stopped, or one starting afresh in-process)."""
    global _requested
    _requested = None


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT), raised by `install()`'s handler (why a subclass: the module docstring)."""


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted


def install() -> None:
    """Make SIGTERM and SIGHUP raise `Terminated` and SIGINT `Interrupted` (main thread only;
    ignored signals, and handlers someone else installed, stay as they are)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in SIGNALS:
        with contextlib.suppress(OSError, ValueError):
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _raise)
    with contextlib.suppress(OSError, ValueError):
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupt)
