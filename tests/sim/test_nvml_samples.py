"""nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES): the driver's per-period GPU utilization
samples since the caller's lastSeen, with nvml.h's count handshake; the same on both drivers."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pynvml
import pytest

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import UTILIZATION_SAMPLES, build_node
from gpulens.sim.native.layout import UTIL_SAMPLES
from gpulens.sim.scenariofile import load_scenario
from tests.sim.static_node import START, StaticNode, example_node, installed

US = 1_000_000
TRAINER = 2  # example_node's A100 running one training process
KEPT = ((START - 3, 10), (START - 2, 40), (START - 1, 70), (START, 100))


@pytest.fixture(name="node")
def _node(nvml_driver: str) -> Iterator[StaticNode]:
    for node, _ in installed(example_node(), nvml_driver):
        node.samples = {TRAINER: KEPT}
        yield node


def handle(i: int):
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def raw_samples(device, last_seen: int, capacity: int | None) -> tuple[int, int, list[tuple[int, int]]]:
    """(return code, *count, [(timeStamp, uiVal)]) of one call; capacity None passes NULL samples."""
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
    kind, count = ctypes.c_uint(0), ctypes.c_uint(capacity or 0)
    buffer = (pynvml.c_nvmlSample_t * max(capacity or 0, 1))()
    ret = fn(
        device,
        pynvml.NVML_GPU_UTILIZATION_SAMPLES,
        ctypes.c_ulonglong(last_seen),
        ctypes.byref(kind),
        ctypes.byref(count),
        buffer if capacity is not None else None,
    )
    got = [(int(s.timeStamp), int(s.sampleValue.uiVal)) for s in buffer[: count.value]] if capacity else []
    return ret, count.value, got


def test_samples_are_every_period_since_last_seen_oldest_first(node) -> None:
    kind, samples = pynvml.nvmlDeviceGetSamples(
        handle(TRAINER), pynvml.NVML_GPU_UTILIZATION_SAMPLES, int((START - 2) * US)
    )
    assert kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert [(s.timeStamp, s.sampleValue.uiVal) for s in samples] == [
        (int((START - 1) * US), 70),
        (int(START * US), 100),
    ]


def test_last_seen_zero_returns_every_kept_sample(node) -> None:
    _, samples = pynvml.nvmlDeviceGetSamples(handle(TRAINER), pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert [s.sampleValue.uiVal for s in samples] == [10, 40, 70, 100]


def test_a_null_buffer_asks_how_many_samples_can_be_queried(node) -> None:
    ret, count, _ = raw_samples(handle(TRAINER), int((START - 3) * US), None)
    assert (ret, count) == (pynvml.NVML_SUCCESS, 3)


def test_a_smaller_buffer_gets_the_oldest_samples_first(node) -> None:
    ret, count, got = raw_samples(handle(TRAINER), 0, 2)
    assert (ret, count, got) == (
        pynvml.NVML_SUCCESS,
        2,
        [(int((START - 3) * US), 10), (int((START - 2) * US), 40)],
    )


def test_a_zero_count_with_a_buffer_is_an_invalid_argument(node) -> None:
    ret, _, _ = raw_samples(handle(TRAINER), 0, 0)
    assert ret == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_nothing_newer_than_last_seen_is_not_found(node) -> None:
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetSamples(handle(TRAINER), pynvml.NVML_GPU_UTILIZATION_SAMPLES, int(START * US))


def test_mig_handles_and_mig_enabled_gpus_do_not_support_it(node) -> None:
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)
    for device in (handle(0), mig):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetSamples(device, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)


def test_sampling_types_the_node_does_not_keep_are_not_supported(node) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetSamples(handle(TRAINER), pynvml.NVML_TOTAL_POWER_SAMPLES, 0)


def test_both_drivers_keep_the_engines_number_of_samples() -> None:
    assert UTIL_SAMPLES == UTILIZATION_SAMPLES


def test_the_engine_keeps_one_sample_per_second_each_that_seconds_utilization() -> None:
    clock = ManualClock(START)
    node = build_node(load_scenario("bursty-pair"), clock=clock)
    clock.advance(40.0)
    samples = node.utilization_samples(1, clock.now())
    assert len(samples) == UTILIZATION_SAMPLES
    assert [t for t, _ in samples] == [float(t) for t in range(int(START) + 25, int(START) + 41)]
    assert samples[-1][1] == node.gpu_state(1).utilization_gpu_percent
