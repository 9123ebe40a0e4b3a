"""The packer's first-fit indexes answer exactly what a scan over every GPU answers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer.freetime import Capacity, FreeTime

TIMES = st.integers(0, 40).map(float)
SPAN = st.tuples(TIMES, TIMES).map(sorted).map(tuple)
# (slot, interval, keep): an interval added to a slot, taken back again unless `keep`
PLACEMENTS = st.lists(st.tuples(st.integers(0, 11), SPAN, st.booleans()), max_size=40)


def naive_free(
    held: dict[int, list[tuple[float, float]]], start: float, end: float, allowed: int
) -> list[int]:
    """The scan `bins.fits` does for an exclusive job: each allowed slot, in order, no interval meets."""
    return [
        s
        for s in range(allowed.bit_length())
        if allowed >> s & 1 and not any(a <= end and start <= b for a, b in held.get(s, []))
    ]


@settings(max_examples=300, deadline=None)
@given(
    PLACEMENTS, st.lists(SPAN, min_size=1, max_size=8), st.integers(0, 4095), st.sampled_from([1, 2, 3, 16])
)
def test_free_slots_equal_a_scan_over_every_slot(placements, queries, allowed, block):
    times = [t for _, span, _ in placements for t in span] + [t for span in queries for t in span]
    index = FreeTime(times, block=block)
    held: dict[int, list[tuple[float, float]]] = {}
    for slot, (a, b), keep in placements:
        index.add(slot, a, b)
        held.setdefault(slot, []).append((a, b))
        if not keep:  # a tentative placement taken back leaves no trace
            index.remove(slot, a, b)
            held[slot].remove((a, b))
    for start, end in queries:
        assert list(index.free(start, end, allowed)) == naive_free(held, start, end, allowed)


def test_a_time_that_is_not_a_number_is_refused():
    try:
        FreeTime([0.0, float("nan")])
    except ValueError:
        return
    raise AssertionError("NaN accepted")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(-1, 100)), max_size=60),
    st.integers(0, 100),
    st.integers(0, 25),
)
def test_first_slot_with_room_equals_a_scan(updates, need, at):
    tree = Capacity(21)
    room = [-1] * 21
    for slot, value in updates:
        tree.set(slot, value)
        room[slot] = value
    expected = next((s for s in range(at, 21) if room[s] >= need), None)
    assert tree.first(need, at) == expected
