"""Which GPUs of a packing pool are free over a time interval: first fit for exclusive jobs in
about log time per job instead of a test against every GPU of the pool.

An exclusive job fits a GPU when none of the GPU's jobs meets its lifetime (closed intervals,
`bins.GpuBin._overlapping`). `FreeTime` answers "the free slots, lowest first" with a segment
tree over blocks of the pool's time points holding bitsets of slots (a slot is a GPU's position
in the pool): a slot whose interval covers a whole tree node is marked `cover` there, every node
an interval touches is marked `touch`. A slot's interval meets a query exactly when one of the
query's nodes is touched by it or lies under a node it covers; inside the query's two end
blocks a slot with an interval ending there is only "maybe" busy and is checked against its own
intervals. Python integers serve as the bitsets (no library offers a dynamic first-fit over
interval sets); counts let a tentative placement be taken back (`packing._merge`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

BLOCK = 16  # time points per leaf: the tree's memory is nodes x slots bits, the end-block checks ~2 x BLOCK


def set_bits(mask: int) -> Iterator[int]:
    """The set bits of `mask` (slots), lowest first."""
    while mask:
        low = mask & -mask
        mask ^= low
        yield low.bit_length() - 1


class FreeTime:
    """Slots (0, 1, ...) holding closed intervals whose endpoints are among `times`."""

    def __init__(self, times: Iterable[float], block: int = BLOCK) -> None:
        points = sorted(set(times))
        if any(math.isnan(t) for t in points):
            raise ValueError("a time point is NaN: intervals cannot be ordered")
        self._pos = {t: i for i, t in enumerate(points)}
        self._block = max(1, block)
        self._points = len(points)
        blocks = max(1, -(-len(points) // self._block))
        self._size = 1 << (blocks - 1).bit_length()
        self._cover = [0] * (2 * self._size)
        self._touch = [0] * (2 * self._size)
        self._part = [0] * blocks
        self._counts: dict[tuple[int, int, int], int] = {}  # (array, node, slot) -> intervals
        self._spans: dict[int, list[tuple[float, float]]] = {}

    def _blocks(self, start: float, end: float) -> tuple[int, int, list[int]]:
        """The blocks [lo, hi] the interval covers whole, and the ones it only partly touches."""
        first, last = self._pos[start], self._pos[end]
        if first > last:
            raise ValueError(f"interval ends ({end}) before it starts ({start})")
        k0, k1 = first // self._block, last // self._block
        lo = k0 if first == k0 * self._block else k0 + 1
        hi = k1 if last == min((k1 + 1) * self._block, self._points) - 1 else k1 - 1
        partial = sorted({k for k in (k0, k1) if not lo <= k <= hi})
        return lo, hi, partial

    def _canonical(self, lo: int, hi: int) -> list[int]:
        """The tree nodes that together span blocks lo..hi exactly."""
        out: list[int] = []
        lo, hi = lo + self._size, hi + self._size + 1
        while lo < hi:
            if lo & 1:
                out.append(lo)
                lo += 1
            if hi & 1:
                hi -= 1
                out.append(hi)
            lo >>= 1
            hi >>= 1
        return out

    @staticmethod
    def _with_ancestors(nodes: Iterable[int]) -> set[int]:
        out: set[int] = set()
        for node in nodes:
            while node and node not in out:
                out.add(node)
                node >>= 1
        return out

    def _mark(self, array: int, masks: list[int], node: int, slot: int, step: int) -> None:
        key = (array, node, slot)
        count = self._counts.get(key, 0) + step
        if count:
            self._counts[key] = count
        else:
            del self._counts[key]
        if count == 1 and step == 1:
            masks[node] |= 1 << slot
        elif count == 0:
            masks[node] &= ~(1 << slot)

    def _change(self, slot: int, start: float, end: float, step: int) -> None:
        lo, hi, partial = self._blocks(start, end)
        whole = self._canonical(lo, hi) if lo <= hi else []
        for node in whole:
            self._mark(0, self._cover, node, slot, step)
        for node in self._with_ancestors([*whole, *(self._size + k for k in partial)]):
            self._mark(1, self._touch, node, slot, step)
        for k in partial:
            self._mark(2, self._part, k, slot, step)

    def add(self, slot: int, start: float, end: float) -> None:
        """`slot` holds [start, end] from now on."""
        self._change(slot, start, end, 1)
        self._spans.setdefault(slot, []).append((start, end))

    def remove(self, slot: int, start: float, end: float) -> None:
        """Take back one `add(slot, start, end)`."""
        self._spans[slot].remove((start, end))
        self._change(slot, start, end, -1)

    def free(self, start: float, end: float, allowed: int) -> Iterator[int]:
        """The slots of the bitset `allowed` holding no interval that meets [start, end], lowest first."""
        lo, hi, partial = self._blocks(start, end)
        whole = self._canonical(lo, hi) if lo <= hi else []
        busy = 0
        for node in whole:
            busy |= self._touch[node]
        for node in self._with_ancestors([*whole, *(self._size + k for k in partial)]):
            busy |= self._cover[node]
        maybe = 0
        for k in partial:
            maybe |= self._part[k]
        for slot in set_bits(allowed & ~busy):
            if maybe >> slot & 1 and any(a <= end and start <= b for a, b in self._spans.get(slot, ())):
                continue
            yield slot


class Capacity:
    """Each slot's room (an integer, -1 for none) and the first slot at or after a position with
    at least a given room: a max segment tree, so first fit over MPS GPUs skips the full ones in
    log time instead of one test each."""

    def __init__(self, slots: int) -> None:
        self._size = 1 << max(0, slots - 1).bit_length()
        self._max = [-1] * (2 * self._size)

    def set(self, slot: int, room: int) -> None:
        node = slot + self._size
        self._max[node] = room
        node >>= 1
        while node:
            self._max[node] = max(self._max[2 * node], self._max[2 * node + 1])
            node >>= 1

    def first(self, need: int, at: int = 0) -> int | None:
        """The lowest slot >= `at` whose room is >= `need` (None when there is none)."""
        if at >= self._size:
            return None
        node = at + self._size
        while True:
            if self._max[node] >= need:
                while node < self._size:  # down to the leftmost such leaf
                    node = 2 * node if self._max[2 * node] >= need else 2 * node + 1
                return node - self._size
            while node & 1:  # a right child: up to the first ancestor with a right sibling
                node >>= 1
            if not node:
                return None
            node += 1
