"""The GPU's utilization is read over the exporter's interval (nvmlDeviceGetSamples since the last
read), the same window as the processes' figures it is split by: a lone bursty job is not left with
a false remainder, and shares add up to the interval's figure."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from gpulens.exporter.app import Exporter
from gpulens.exporter.backends.utilsamples import interval_mean
from tests.exporter.conftest import make_exporter
from tests.exporter.expo import samples, value
from tests.sim.static_node import START, StaticNode

TRAINER = 2  # example_node's A100 with one compute process at 37 % SM
BURSTY = ((START - 3, 0), (START - 2, 0), (START - 1, 48), (START, 100))  # mean 37 %, last 100 %


@pytest.fixture(name="bursty")
def _bursty(node: StaticNode) -> Iterator[Exporter]:
    node.samples = {TRAINER: BURSTY}
    node.update(TRAINER, utilization_gpu_percent=100)  # GetUtilizationRates: the burst's last period
    ex = make_exporter(node, interval=4.0)
    try:
        yield ex
    finally:
        ex.close()


def _render(exporter: Exporter) -> str:
    return exporter.render(exporter.sample_once()).text.decode()


def test_gpu_utilization_is_the_mean_of_the_samples_over_the_interval(bursty: Exporter) -> None:
    text = _render(bursty)
    assert value(text, "gpu_utilization_ratio", gpu=str(TRAINER)) == pytest.approx(0.37)


def test_a_lone_bursty_job_gets_all_of_the_intervals_utilization(bursty: Exporter) -> None:
    text = _render(bursty)
    (job,) = [s for s in _job_rows(text) if s[0] == str(TRAINER)]
    assert job[1] == pytest.approx(0.37)
    assert value(text, "gpu_job_sm_unattributed_ratio", gpu=str(TRAINER)) == pytest.approx(0.0, abs=1e-9)


def test_time_sliced_processes_shares_add_up_to_the_interval_mean(node: StaticNode) -> None:
    node.samples = {TRAINER: BURSTY}
    base = node.gpu_state(TRAINER).processes[0]
    node.update(
        TRAINER,
        utilization_gpu_percent=100,
        processes=(
            dataclasses.replace(base, sm_util_percent=30),
            dataclasses.replace(base, pid=40_001, sm_util_percent=20),
        ),
    )
    ex = make_exporter(node, interval=4.0)
    try:
        text = _render(ex)
    finally:
        ex.close()
    jobs = sum(v for gpu, v in _job_rows(text) if gpu == str(TRAINER))
    unattributed = value(text, "gpu_job_sm_unattributed_ratio", gpu=str(TRAINER))
    assert jobs == pytest.approx(0.37)
    assert unattributed == pytest.approx(0.0, abs=1e-9)


def test_without_samples_the_last_period_stands(node: StaticNode) -> None:
    node.samples = {TRAINER: ()}  # NOT_FOUND: nothing since the last read
    ex = make_exporter(node, interval=4.0)
    try:
        text = _render(ex)
    finally:
        ex.close()
    assert value(text, "gpu_utilization_ratio", gpu=str(TRAINER)) == pytest.approx(0.41)


def test_samples_count_for_the_time_since_the_one_before() -> None:
    # idle for 1 s and 2 s around a busy half second: busy 0.5 s of 3.5 s (a plain mean says 1/3)
    points = [(2_000_000, 0.0), (2_500_000, 100.0), (4_500_000, 0.0)]
    assert interval_mean(points, previous_us=1_000_000) == pytest.approx(0.5 / 3.5)


def test_a_lone_first_sample_is_its_own_value() -> None:
    assert interval_mean([(2_000_000, 40.0)], previous_us=None) == pytest.approx(0.4)


def test_a_gap_older_than_the_buffer_is_not_the_first_samples_period() -> None:
    assert interval_mean([(100_000_000, 100.0), (101_000_000, 0.0)], previous_us=0) == pytest.approx(0.5)


def _job_rows(text: str) -> list[tuple[str, float]]:
    return [(s.labels["gpu"], s.value) for s in samples(text, "gpu_job_sm_utilization_ratio")]
