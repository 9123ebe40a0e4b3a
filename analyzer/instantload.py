"""What the GPUs of a time-sliced packing pool carry at one instant: first fit without testing
every GPU job by job.

A time-sliced job fits a GPU when, at its start and at every later start of a job it meets, the
sums of memory, DRAM, load and interference and the number of jobs stay within their bounds
(`bins.GpuBin.within`). Nearly every refusal comes at the job's own start (97 % of ~64,000
fit tests for 10,000 jobs, each summing the GPU's jobs in Python). `InstantLoad` keeps every
placed interval of a pool in numpy columns and gives, for one instant, the slots (a GPU's
position in the pool) already past a bound there: one masked `bincount` per column over the
pool instead of a Python sum per GPU. It only rules GPUs out, with a margin above each bound so
that a sum rounded differently can never rule out a GPU the exact test accepts; the exact test
still decides for every other GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

COLUMNS = ("memory", "dram", "load", "p95")  # the summed attributes of `bins.Item`
MARGIN = 1e-6  # relative: far above float rounding of a few hundred sums, far below any real load


class InstantLoad:
    """Closed intervals with per-interval attributes, each held by a slot; removable."""

    def __init__(self, capacity: int = 64) -> None:
        size = max(1, capacity)
        self._start = np.empty(size)
        self._end = np.empty(size)
        self._slot = np.zeros(size, dtype=np.intp)
        self._live = np.zeros(size, dtype=bool)
        self._values = {name: np.zeros(size) for name in COLUMNS}
        self._used = 0
        self._slots = 0
        self._entries: dict[tuple[int, int], list[int]] = {}  # (slot, key) -> rows, latest last

    def _grow(self) -> None:
        size = 2 * len(self._start)
        self._start = np.resize(self._start, size)
        self._end = np.resize(self._end, size)
        self._slot = np.resize(self._slot, size)
        live = np.zeros(size, dtype=bool)
        live[: self._used] = self._live[: self._used]
        self._live = live
        self._values = {name: np.resize(column, size) for name, column in self._values.items()}

    def add(self, slot: int, key: int, start: float, end: float, values: Sequence[float]) -> None:
        """Slot `slot` holds [start, end] with `values` (in COLUMNS order); `key` names it for
        `remove` (the caller's id of the job)."""
        if self._used == len(self._start):
            self._grow()
        row = self._used
        self._used += 1
        self._start[row], self._end[row], self._slot[row] = start, end, slot
        self._live[row] = True
        for name, value in zip(COLUMNS, values, strict=True):
            self._values[name][row] = value
        self._slots = max(self._slots, slot + 1)
        self._entries.setdefault((slot, key), []).append(row)

    def remove(self, slot: int, key: int) -> None:
        """Take back the latest `add` of `key` on `slot`."""
        rows = self._entries[(slot, key)]
        self._live[rows.pop()] = False
        if not rows:
            del self._entries[(slot, key)]

    def over(self, at: float, own: Sequence[float], bounds: Sequence[tuple[str, float]]) -> list[bool]:
        """Per slot: whether a job with `own` values starting at `at` would take some sum past its
        bound at that instant for sure. `bounds` are (attribute, bound) as `bins.GpuBin.within`
        takes them ("count": the number of jobs), `own` the job's values in the same order."""
        used = self._used
        active = self._live[:used] & (self._start[:used] <= at) & (at <= self._end[:used])
        slots = self._slot[:used][active]
        refused = np.zeros(self._slots, dtype=bool)
        for (name, bound), x in zip(bounds, own, strict=True):
            if name == "count":  # whole numbers: no rounding to allow for
                refused |= np.bincount(slots, minlength=self._slots) + x > bound
                continue
            sums = np.bincount(slots, weights=self._values[name][:used][active], minlength=self._slots)
            refused |= sums + x > bound + MARGIN * max(1.0, abs(bound))
        return refused.tolist()
