"""One pure call in a forked child while the parent goes on: the analyzer's second core.

The plan packs its jobs twice (from scratch and in place, `packing.fewest_moves`), ~0.5 s each
for 10,000 jobs, on one core of the usual 2-core analyzer host: the GIL keeps threads from
doing that at once, and a process pool would pickle the jobs in and re-import the analyzer.
A fork shares the parent's memory as it is, so only the child's answer is pickled (through a
pipe). The call must be pure (its result depends only on its arguments): when forking is not
possible or not safe, or the child fails, the parent computes it itself, with the same result,
and an error raises there with its own traceback.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Pending(Generic[T]):
    """A call running in a child (`pid`), or to be run here when it could not be."""

    call: Callable[[], T]
    pid: int = 0  # 0: not forked
    fd: int = -1  # the read end of the child's pipe

    def result(self) -> T:
        """The call's value: the child's answer, else the call made here."""
        if not self.pid:
            return self.call()
        chunks = []
        with os.fdopen(self.fd, "rb") as pipe:
            while chunk := pipe.read(1 << 20):
                chunks.append(chunk)
        self.fd = -1
        try:
            _, status = os.waitpid(self.pid, 0)
            exited_cleanly = os.waitstatus_to_exitcode(status) == 0
        except ChildProcessError:  # reaped already (a host program ignoring SIGCHLD)
            exited_cleanly = True  # a whole answer unpickles, a truncated one does not
        self.pid = 0
        if exited_cleanly and chunks:
            try:
                value: T = pickle.loads(b"".join(chunks))
                return value
            except Exception:  # a truncated answer: computed here instead
                pass
        return self.call()

    def close(self) -> None:
        """Stop a child whose answer is no longer wanted (the caller failed before `result`):
        it would otherwise wait on a full pipe for a reader that never comes."""
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Pending[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start(call: Callable[[], T], fork: bool = True) -> Pending[T]:
    """`call()` begun in a forked child; `Pending.result()` gives its value (use it as a context
    manager, so a child whose answer is not taken is stopped).

    Not forked (the call then runs in `result()`) when `fork` is False, where `os.fork` does not
    exist, or while other threads run: a lock one of them holds would stay held in the child.
    """
    if not fork or not hasattr(os, "fork") or threading.active_count() > 1:
        return Pending(call)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, then leave without the parent's exit work
        code = 1
        try:
            os.close(read)
            payload = pickle.dumps(call(), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write, "wb") as pipe:
                pipe.write(payload)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return Pending(call, pid, read)
