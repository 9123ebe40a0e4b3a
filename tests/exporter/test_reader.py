"""The GPU reader: one thread reads every GPU in order; the watchdog gives up on a hung one only."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from gpulens.exporter.reader import HUNG_OUTCOME, Failed, GpuReader


@pytest.fixture
def reader() -> Iterator[GpuReader[str]]:
    r: GpuReader[str] = GpuReader()
    yield r
    r.close()


def test_every_gpu_is_read_once_on_one_thread(reader: GpuReader[str]) -> None:
    threads: dict[int, int] = {}

    def read(index: int) -> str:
        threads[index] = threading.get_ident()
        return f"gpu{index}"

    outcomes = reader.read_all([0, 1, 2, 3], read, deadline=5.0)
    assert outcomes == {0: "gpu0", 1: "gpu1", 2: "gpu2", 3: "gpu3"}
    assert len(set(threads.values())) == 1
    assert threading.get_ident() not in threads.values()


def test_the_same_thread_serves_the_next_cycle(reader: GpuReader[str]) -> None:
    seen: set[int] = set()

    def read(index: int) -> str:
        seen.add(threading.get_ident())
        return "ok"

    for _ in range(3):
        reader.read_all([0, 1], read, deadline=5.0)
    assert len(seen) == 1
    assert reader.threads == 1


def test_a_read_that_raises_is_that_gpus_failure_only(reader: GpuReader[str]) -> None:
    boom = RuntimeError("boom")

    def read(index: int) -> str:
        if index == 1:
            raise boom
        return "ok"

    outcomes = reader.read_all([0, 1, 2], read, deadline=5.0)
    assert outcomes[0] == "ok" and outcomes[2] == "ok"
    assert outcomes[1] == Failed(boom)


def test_a_hung_gpu_is_reported_and_the_gpus_after_it_are_still_read(reader: GpuReader[str]) -> None:
    release = threading.Event()

    def read(index: int) -> str:
        if index == 1:
            release.wait(30)
        return f"gpu{index}"

    outcomes = reader.read_all([0, 1, 2, 3], read, deadline=0.05)
    assert outcomes == {0: "gpu0", 1: HUNG_OUTCOME, 2: "gpu2", 3: "gpu3"}
    assert reader.stuck(1)
    assert not reader.stuck(2)
    release.set()


def test_a_hung_gpu_stays_stuck_until_its_call_returns_then_its_thread_exits(reader: GpuReader[str]) -> None:
    release = threading.Event()
    returned = threading.Event()

    def read(index: int) -> str:
        if index == 0 and not release.is_set():
            release.wait(30)
            returned.set()
        return "ok"

    reader.read_all([0, 1], read, deadline=0.05)
    assert reader.stuck(0)
    assert reader.threads == 2  # the abandoned one is still in its call
    release.set()
    returned.wait(5)
    for _ in range(200):  # the abandoned thread clears the mark under the lock right after
        if not reader.stuck(0):
            break
        threading.Event().wait(0.01)
    assert not reader.stuck(0)
    assert reader.read_all([0, 1], read, deadline=5.0) == {0: "ok", 1: "ok"}


def test_a_hang_on_the_last_gpu_ends_the_cycle(reader: GpuReader[str]) -> None:
    release = threading.Event()

    def read(index: int) -> str:
        if index == 2:
            release.wait(30)
        return "ok"

    assert reader.read_all([0, 1, 2], read, deadline=0.05) == {0: "ok", 1: "ok", 2: HUNG_OUTCOME}
    release.set()


def test_no_gpus_reads_nothing(reader: GpuReader[str]) -> None:
    assert reader.read_all([], lambda index: "ok", deadline=1.0) == {}
    assert reader.threads == 0
