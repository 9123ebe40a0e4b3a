"""All GPUs of a cycle read one after the other on one reader thread, watched for hung calls.

Why one thread and not one per GPU: the reads are Python around short C calls, so GPUs never
overlapped usefully; eight worker threads only fought over the GIL (with the exporter's 0.5 ms
switch interval), each woke, handed a job over a queue and resolved a future per GPU and cycle,
and a driver that keeps per-thread state (the simulated one copies the published node per
thread) paid that eight times. On the `large` node that was about a third of a cycle's CPU.

Why a watchdog: a hung NVML call never returns, and Python cannot interrupt a thread in C. The
sampler's thread waits for the batch and watches the GPU being read: when one GPU's reads pass
`deadline`, that GPU is reported hung, its thread is abandoned to its stuck call, and a fresh
reader carries on with the GPUs after it. The stuck GPU is skipped (`stuck`) until its call
returns, then its abandoned thread exits. So one hung GPU costs one thread and one deadline in
the cycle it hangs, never the other GPUs' values.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Result = TypeVar("Result")


class Hung:
    """The outcome of a GPU whose reads did not return within the deadline."""

    __slots__ = ()


HUNG_OUTCOME = Hung()


@dataclass(frozen=True)
class Failed:
    """The outcome of a GPU whose read raised `error`."""

    error: BaseException


@dataclass
class _Batch(Generic[Result]):
    """One cycle's work; every field is read and written under the reader's lock."""

    indexes: tuple[int, ...]
    read: Callable[[int], Result]
    outcomes: dict[int, Result | Failed | Hung] = field(default_factory=dict)
    position: int = 0  # the next entry of `indexes` to read
    current: tuple[int, float] | None = None  # (GPU index, monotonic start) of the read in progress
    done: threading.Event = field(default_factory=threading.Event)


class _Runner:
    """One reader thread's identity: `abandoned` once the watchdog gave up on its call."""

    __slots__ = ("abandoned",)

    def __init__(self) -> None:
        self.abandoned = False


class GpuReader(Generic[Result]):
    """Reads batches of GPUs on one daemon thread; `read_all` is the bounded, watched call."""

    def __init__(self, name: str = "gpulens-gpu-reader", clock: Callable[[], float] = time.monotonic) -> None:
        self._name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._batch: _Batch[Result] | None = None
        self._runner: _Runner | None = None  # the thread currently serving batches
        self._stuck: set[int] = set()  # GPUs whose call has not returned (their thread abandoned)
        self._closed = False
        self._threads = 0  # reader threads alive, abandoned ones included (for tests and logs)

    def stuck(self, index: int) -> bool:
        """Whether a call on GPU `index` from an earlier cycle has not returned yet."""
        with self._lock:
            return index in self._stuck

    @property
    def threads(self) -> int:
        with self._lock:
            return self._threads

    def read_all(
        self, indexes: Sequence[int], read: Callable[[int], Result], deadline: float
    ) -> dict[int, Result | Failed | Hung]:
        """`read(index)` for every index, in order, on the reader thread; one outcome per index.

        A GPU whose `read` runs past `deadline` seconds is `HUNG_OUTCOME` (and `stuck` from then
        until the call returns); one that raised is `Failed`. Callers skip stuck GPUs themselves.
        """
        batch: _Batch[Result] = _Batch(tuple(indexes), read)
        if not batch.indexes:
            return {}
        with self._lock:
            if self._closed:
                raise RuntimeError("GpuReader is closed")
            self._batch = batch
            if self._runner is None:
                self._start_runner()
            self._wake.notify_all()
        while True:
            with self._lock:
                current = batch.current
            wait = deadline if current is None else current[1] + deadline - self._clock()
            if batch.done.wait(max(0.0, wait)):
                break
            with self._lock:
                if batch.done.is_set():
                    break
                if current is None or batch.current != current:
                    continue  # not started yet (a busy machine), or moved on to the next GPU
                if self._clock() - current[1] < deadline:
                    continue
                self._give_up(batch, current[0])
        with self._lock:
            if self._batch is batch:
                self._batch = None
            return dict(batch.outcomes)

    def _give_up(self, batch: _Batch[Result], index: int) -> None:
        """Under the lock: GPU `index` is hung; abandon its thread, carry on with a new one."""
        batch.outcomes[index] = HUNG_OUTCOME
        batch.current = None
        self._stuck.add(index)
        if self._runner is not None:
            self._runner.abandoned = True
        self._start_runner()
        if batch.position >= len(batch.indexes):
            batch.done.set()
        self._wake.notify_all()

    def _start_runner(self) -> None:
        """Under the lock: a fresh reader thread becomes the one serving batches."""
        runner = _Runner()
        self._runner = runner
        self._threads += 1
        threading.Thread(target=self._run, args=(runner,), name=self._name, daemon=True).start()

    def _run(self, runner: _Runner) -> None:
        try:
            self._serve(runner)
        finally:
            with self._lock:
                self._threads -= 1

    def _serve(self, runner: _Runner) -> None:
        while True:
            with self._lock:
                while not runner.abandoned and not self._closed and not self._pending():
                    self._wake.wait()
                if runner.abandoned or self._closed:
                    return
                batch = self._batch
                assert batch is not None
                index = batch.indexes[batch.position]
                batch.position += 1
                batch.current = (index, self._clock())
            try:
                outcome: Result | Failed = batch.read(index)
            except BaseException as exc:  # the sampler maps it (lost GPU, NVML error, a bug)
                outcome = Failed(exc)
            with self._lock:
                if runner.abandoned:  # the watchdog reported this GPU hung: its call returned now
                    self._stuck.discard(index)
                    return
                batch.outcomes[index] = outcome
                batch.current = None
                if batch.position >= len(batch.indexes):
                    batch.done.set()

    def _pending(self) -> bool:
        batch = self._batch
        return batch is not None and not batch.done.is_set() and batch.position < len(batch.indexes)

    def close(self) -> None:
        """Stop the serving thread after its current read (abandoned ones exit when they return)."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
