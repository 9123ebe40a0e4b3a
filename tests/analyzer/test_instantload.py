"""The time-sliced pool's instant index only rules out GPUs the exact fit test refuses, and
packing with it gives the GPUs a test of every GPU gives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer import packing
from gpulens.analyzer.bins import GpuBin, Item
from gpulens.analyzer.instantload import COLUMNS, InstantLoad
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.thresholds import load_thresholds

TIMES = st.integers(0, 30).map(float)
SHARE = st.sampled_from([0.0, 0.05, 0.1, 0.2, 0.25, 0.3, 0.45, 0.6, 1 / 3])
GIB = 1024**3


@st.composite
def jobs(draw: st.DrawFn, job_id: str) -> Item:
    start = draw(TIMES)
    return Item(
        job_id=job_id,
        kind=Kind.TIME_SLICING.value,
        model="H100-80GB",
        start=start,
        end=start + draw(st.integers(0, 12)),
        gpus=1,
        memory=draw(st.sampled_from([1, 5, 10, 20, 30, 40])) * GIB,
        sm=draw(SHARE),
        load=draw(SHARE),
        used_hours=1.0,
        p95=draw(SHARE),
        dram=draw(SHARE),
    )


ITEMS = st.integers(0, 40).flatmap(lambda n: st.tuples(*(jobs(f"job-{k:03d}") for k in range(n))))
BOUNDS = (("memory", 80.0 * GIB), ("dram", 0.8), ("count", 4), ("load", 0.9), ("p95", 0.75))


def test_a_gpu_past_a_bound_at_the_instant_is_ruled_out() -> None:
    load = InstantLoad()
    load.add(0, 1, 0.0, 10.0, [60.0 * GIB, 0.1, 0.1, 0.1])
    load.add(1, 2, 0.0, 10.0, [10.0 * GIB, 0.1, 0.1, 0.1])
    assert load.over(5.0, [30.0 * GIB, 0.1, 1, 0.1, 0.1], BOUNDS) == [True, False]


def test_a_job_that_ended_before_the_instant_does_not_count() -> None:
    load = InstantLoad()
    load.add(0, 1, 0.0, 4.0, [60.0 * GIB, 0.1, 0.1, 0.1])
    assert load.over(5.0, [30.0 * GIB, 0.1, 1, 0.1, 0.1], BOUNDS) == [False]


def test_the_job_count_has_its_own_bound() -> None:
    load = InstantLoad()
    for key in range(4):
        load.add(0, key, 0.0, 10.0, [0.0, 0.0, 0.0, 0.0])
    assert load.over(1.0, [0.0, 0.0, 1, 0.0, 0.0], BOUNDS) == [True]


def test_a_removed_placement_leaves_no_trace() -> None:
    load = InstantLoad(capacity=1)
    load.add(0, 7, 0.0, 10.0, [70.0 * GIB, 0.0, 0.0, 0.0])
    load.add(0, 8, 0.0, 10.0, [1.0 * GIB, 0.0, 0.0, 0.0])  # grows past its first capacity
    load.remove(0, 7)
    assert load.over(1.0, [30.0 * GIB, 0.0, 1, 0.0, 0.0], BOUNDS) == [False]


@settings(max_examples=200, deadline=None)
@given(ITEMS, st.lists(st.integers(0, 5), max_size=40), jobs("probe"))
def test_a_gpu_ruled_out_is_one_the_exact_fit_test_refuses(items, slots, probe) -> None:
    gpus = [GpuBin(name=f"g{n}", model="H100-80GB", mode=Kind.TIME_SLICING.value) for n in range(6)]
    load = InstantLoad()
    for item, slot in zip(items, slots, strict=False):
        gpus[slot].items.append(item)
        load.add(slot, id(item), item.start, item.end, [getattr(item, c) for c in COLUMNS])
    own = [1 if name == "count" else getattr(probe, name) for name, _ in BOUNDS]
    for slot, ruled_out in enumerate(load.over(probe.start, own, BOUNDS)):
        if ruled_out:
            assert not gpus[slot].within(probe, BOUNDS)


@settings(max_examples=100, deadline=None)
@given(ITEMS, st.booleans())
def test_packing_with_the_index_equals_testing_every_gpu(items, in_place) -> None:
    th = load_thresholds(None)
    with_index = packing.pack([replace(i) for i in items], th, in_place=in_place)
    scanned = pack_testing_every_gpu([replace(i) for i in items], th, in_place)
    assert [(b.name, [i.job_id for i in b.items]) for b in with_index] == scanned


def pack_testing_every_gpu(items: list[Item], th, in_place: bool) -> list[tuple[str, list[str]]]:
    """`packing.pack` with an index that never rules out a GPU: `fits` decides every GPU."""

    class Nothing(InstantLoad):
        def over(self, at: float, own: Sequence[float], bounds: Sequence[tuple[str, float]]) -> list[bool]:
            return []

    original = packing.InstantLoad
    packing.InstantLoad = Nothing  # type: ignore[misc]
    try:
        return [(b.name, [i.job_id for i in b.items]) for b in packing.pack(items, th, in_place=in_place)]
    finally:
        packing.InstantLoad = original  # type: ignore[misc]
