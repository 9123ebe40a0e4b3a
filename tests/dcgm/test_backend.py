"""The DCGM profiling backend against the simulated DCGM (values, MIG entities, blanks, failures)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpulens.exporter.backends.dcgm import (
    FP64_BLANK,
    INT64_BLANK,
    NOT_SERVED,
    DcgmProfiler,
    DcgmSettings,
    _usable,
    parse_address,
)
from gpulens.exporter.snapshot import MigSample
from gpulens.sim.dcgm import BINDINGS_DIR, hostengine
from gpulens.sim.dcgm.hostengine import EngineOptions
from tests.dcgm.conftest import STEP, Sim

RATIOS = ("graphics", "sm", "sm_occupancy", "tensor", "dram", "fp64", "fp32", "fp16")


def profiler(sim: Sim, address: str | None = None, **kwargs: object) -> DcgmProfiler:
    settings = DcgmSettings(bindings=BINDINGS_DIR, address=address)
    return DcgmProfiler(settings, sim.clock.now, interval=STEP, **kwargs)  # type: ignore[arg-type]


def instances(sim: Sim, index: int) -> list[MigSample]:
    state = sim.node.gpu_state(index)
    return [
        MigSample(gpu_instance=m.gpu_instance_id, compute_instance=0, profile=m.profile.name, uuid=m.uuid)
        for m in state.mig_instances
    ]


@pytest.fixture
def a100(simulate: Callable[[str], Sim]) -> Sim:
    sim = simulate("k8s-a100-mixed")
    hostengine.install(sim.node)
    return sim


def test_first_read_has_no_values_until_one_watch_period_completes(a100: Sim) -> None:
    prof = profiler(a100)
    try:
        assert prof.read(2, a100.handle(2), []) == ("dcgm", (), {})
    finally:
        prof.close()


def test_gpu_values_are_the_scenario_activity_over_the_last_watch_period(a100: Sim) -> None:
    prof = profiler(a100)
    try:
        a100.clock.advance(STEP)
        source, values, _ = prof.read(2, a100.handle(2), [])
    finally:
        prof.close()
    expected = a100.activity(2)
    got = dict(values)
    assert source == "dcgm"
    for key in RATIOS:
        assert got[key] == pytest.approx(getattr(expected, key), abs=1e-9)
    assert got["sm"] > 0.3  # the exclusive training pod keeps GPU 2 busy
    assert got["pcie_rx_bytes_per_second"] == pytest.approx(expected.pcie_rx_bytes_per_second)


def test_gpu_instances_are_mapped_through_the_hierarchy_to_nvml_instance_ids(a100: Sim) -> None:
    engine = hostengine.current()
    assert engine is not None
    entity_ids = {e.entity_id for e in engine.hierarchy(engine.connect(None))}
    gi_ids = {m.gpu_instance for m in instances(a100, 1)}
    assert gi_ids == {3, 4, 11, 12, 13}
    assert entity_ids != gi_ids  # DCGM's own ids: a mapping is needed
    prof = profiler(a100)
    try:
        a100.clock.advance(STEP)
        source, _, mig = prof.read(1, a100.handle(1), instances(a100, 1))
    finally:
        prof.close()
    assert source == "dcgm"
    assert set(mig) == gi_ids
    for gi, values in mig.items():
        assert dict(values)["sm"] == pytest.approx(a100.activity(1, gi).sm, abs=1e-9)
    assert dict(mig[4])["sm"] > 0.3  # the LoRA trainer on GPU instance 4


def test_pcie_and_nvlink_rates_are_blank_on_gpu_instances(a100: Sim) -> None:
    prof = profiler(a100)
    try:
        a100.clock.advance(STEP)
        _, _, mig = prof.read(1, a100.handle(1), instances(a100, 1))
    finally:
        prof.close()
    assert all("pcie_tx_bytes_per_second" not in dict(values) for values in mig.values())


def test_instances_created_at_runtime_are_watched_from_the_next_sample(a100: Sim) -> None:
    prof = profiler(a100)
    try:
        a100.clock.advance(STEP)
        prof.read(1, a100.handle(1), instances(a100, 1))
        a100.node.destroy_mig_instance(1, 13)
        a100.clock.advance(STEP)
        _, _, gone = prof.read(1, a100.handle(1), instances(a100, 1))
        gi = a100.node.create_mig_instance(1, "1g.10gb", start=6)
        a100.clock.advance(STEP)
        _, _, first = prof.read(1, a100.handle(1), instances(a100, 1))
        a100.clock.advance(STEP)
        _, _, second = prof.read(1, a100.handle(1), instances(a100, 1))
    finally:
        prof.close()
    assert set(gone) == {3, 4, 11, 12}
    assert gi in first and first[gi] == ()  # a new watch: no completed period yet
    assert dict(second[gi])["sm"] == pytest.approx(0.0)


def test_a_lost_gpu_reads_blank_values_as_absent(a100: Sim) -> None:
    prof = profiler(a100)
    handle = a100.handle(3)
    try:
        a100.clock.advance(STEP)
        assert prof.read(3, handle, [])[1]
        a100.node.set_lost(3, True)
        a100.clock.advance(STEP)
        reading = prof.read(3, handle, [])
    finally:
        prof.close()
    assert reading == ("dcgm", (), {})


@pytest.mark.parametrize(
    ("value", "blank"),
    [
        (FP64_BLANK, True),
        (FP64_BLANK + 2, True),  # NOT_SUPPORTED
        (INT64_BLANK + 1, True),  # NOT_FOUND
        (float("nan"), True),
        ("<<<NULL>>>", True),
        (0.25, False),
        (0, False),
    ],
)
def test_blank_sentinels_nan_and_strings_are_absent(value: object, blank: bool) -> None:
    class Value:
        isBlank = False
        ts = 1_000_000

    v = Value()
    v.value = value  # type: ignore[attr-defined]
    result = _usable([v])
    assert (result is None) == blank
    if not blank:
        assert result is not None and result[1] == float(value) and not math.isnan(result[1])  # type: ignore[arg-type]


def test_values_flagged_blank_by_the_bindings_are_absent() -> None:
    class Value:
        isBlank = True
        value = 0.5
        ts = 1

    assert _usable([Value()]) is None


def test_stale_values_are_absent(a100: Sim) -> None:
    lag = [0.0]  # how far the host engine's newest values fall behind the exporter's clock
    settings = DcgmSettings(bindings=BINDINGS_DIR)
    prof = DcgmProfiler(settings, lambda: a100.clock.now() + lag[0], interval=STEP)
    try:
        a100.clock.advance(STEP)
        assert prof.read(2, a100.handle(2), [])[1]
        lag[0] = 60.0  # the engine's values stopped a minute ago
        a100.clock.advance(STEP)
        assert prof.read(2, a100.handle(2), []) == ("dcgm", (), {})
    finally:
        prof.close()


def test_addresses_parse_into_pydcgm_arguments() -> None:
    assert parse_address("unix:///run/nvidia-dcgm.sock") == {"unixSocketPath": "/run/nvidia-dcgm.sock"}
    assert parse_address("10.0.0.5:5555") == {"ipAddress": "10.0.0.5:5555"}
    assert parse_address("tcp://dcgm:5555") == {"ipAddress": "dcgm:5555"}


def test_a_standalone_host_engine_over_a_unix_socket(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("k8s-a100-mixed")
    hostengine.install(sim.node, EngineOptions(listen="unix:///run/dcgm.sock"))
    prof = profiler(sim, address="unix:///run/dcgm.sock")
    try:
        sim.clock.advance(STEP)
        assert prof.read(0, sim.handle(0), [])[0] == "dcgm"
    finally:
        prof.close()


# ---- failure modes: one clear line, then "not served" (the selector falls back) ----------------


def test_library_not_found_is_one_line_and_never_retried(
    simulate: Callable[[str], Sim], caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulate("k8s-a100-mixed")  # no simulated DCGM installed: libdcgm "missing"
    with caplog.at_level(logging.INFO, logger="gpulens"):
        prof = profiler(sim)
        try:
            assert prof.read(0, sim.handle(0), []) == NOT_SERVED
            assert not prof.connected
            # white-box: "never retried" has no outward sign short of waiting on the wall clock
            assert prof._retry is None  # permanent: no retry thread
        finally:
            prof.close()
    lines = [r.getMessage() for r in caplog.records if "DCGM" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "DCGMError_LibraryNotFound (-25)" in lines[0]


def test_missing_bindings_name_the_path(
    simulate: Callable[[str], Sim], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulate("k8s-a100-mixed")
    with caplog.at_level(logging.INFO, logger="gpulens"):
        prof = DcgmProfiler(DcgmSettings(bindings=tmp_path), sim.clock.now, interval=STEP)
        prof.close()
    assert any(f"--dcgm-bindings {tmp_path}: no pydcgm.py there" in r.getMessage() for r in caplog.records)


def test_unreachable_host_engine_is_logged_once_and_retried_until_it_answers(
    simulate: Callable[[str], Sim], caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulate("k8s-a100-mixed")
    engine = hostengine.install(sim.node, EngineOptions(reachable=False))
    with caplog.at_level(logging.INFO, logger="gpulens"):
        prof = profiler(sim, address="127.0.0.1:5555", backoff_start=0.05)
        try:
            assert prof.read(0, sim.handle(0), []) == NOT_SERVED
            time.sleep(0.3)  # several retries, still unreachable
            engine.set_options(reachable=True)
            deadline = time.monotonic() + 5
            while not prof.connected and time.monotonic() < deadline:
                time.sleep(0.02)
            assert prof.connected
        finally:
            prof.close()
    failures = [r.getMessage() for r in caplog.records if "ConnectionNotValid" in r.getMessage()]
    assert len(failures) == 1
    assert "DCGMError_ConnectionNotValid (-21)" in failures[0] and "127.0.0.1:5555" in failures[0]


def test_host_engine_dying_mid_run_stops_serving_without_raising(
    simulate: Callable[[str], Sim], caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulate("k8s-a100-mixed")
    engine = hostengine.install(sim.node)
    prof = profiler(sim, address="localhost:5555")
    try:
        sim.clock.advance(STEP)
        assert prof.read(0, sim.handle(0), [])[0] == "dcgm"
        engine.set_options(reachable=False)
        sim.clock.advance(STEP)
        with caplog.at_level(logging.INFO, logger="gpulens"):
            assert prof.read(0, sim.handle(0), []) == NOT_SERVED
            assert prof.read(2, sim.handle(2), []) == NOT_SERVED
    finally:
        prof.close()
    assert len([r for r in caplog.records if "DCGM profiling stopped" in r.getMessage()]) == 1


def test_profiling_module_not_loaded_is_explained(
    simulate: Callable[[str], Sim], caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulate("k8s-a100-mixed")
    hostengine.install(sim.node, EngineOptions(profiling_module=False))
    with caplog.at_level(logging.INFO, logger="gpulens"):
        prof = profiler(sim, backoff_start=60)
        try:
            assert prof.read(0, sim.handle(0), []) == NOT_SERVED
        finally:
            prof.close()
    (line,) = [r.getMessage() for r in caplog.records if "DCGM" in r.getMessage()]
    assert "DCGMError_ModuleNotLoaded (-33)" in line and "profiling module not loaded" in line


def test_a_gpu_dcgm_cannot_profile_is_left_to_the_fallback_alone(
    simulate: Callable[[str], Sim], caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulate("k8s-a100-mixed")
    hostengine.install(sim.node, EngineOptions(unsupported_gpus=frozenset({2})))
    with caplog.at_level(logging.INFO, logger="gpulens"):
        prof = profiler(sim)
        try:
            sim.clock.advance(STEP)
            assert prof.read(2, sim.handle(2), []) == NOT_SERVED
            assert prof.read(3, sim.handle(3), [])[0] == "dcgm"
        finally:
            prof.close()
    assert any(
        "DCGM cannot profile GPU 2: DCGMError_ProfilingNotSupported (-36)" in r.getMessage()
        for r in caplog.records
    )


def test_watches_use_the_sampling_interval_and_one_read_per_sample(a100: Sim) -> None:
    engine = hostengine.current()
    assert engine is not None
    prof = profiler(a100)
    try:
        a100.clock.advance(STEP)
        before = engine.calls.get("latest", 0)
        for index in range(4):
            prof.read(index, a100.handle(index), instances(a100, index))
        reads = engine.calls["latest"] - before
        handles = engine.open_handles()
        periods = engine.watch_periods_us()
    finally:
        prof.close()
    assert reads == 4  # one GetLatest per GPU group per sample, not per GPU instance or field
    assert (handles, periods) == (1, {int(STEP * 1_000_000)})
    assert engine.open_handles() == 0  # closed: handle released


def test_a_disconnect_and_the_failing_retries_after_it_make_one_line(
    simulate: Callable[[str], Sim], caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulate("k8s-a100-mixed")
    engine = hostengine.install(sim.node)
    prof = profiler(sim, address="localhost:5555", backoff_start=0.02)
    try:
        sim.clock.advance(STEP)
        assert prof.read(0, sim.handle(0), [])[0] == "dcgm"
        with caplog.at_level(logging.INFO, logger="gpulens"):
            engine.set_options(reachable=False)
            sim.clock.advance(STEP)
            assert prof.read(0, sim.handle(0), []) == NOT_SERVED
            deadline = time.monotonic() + 2
            while engine.calls.get("connect", 0) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)  # the background retries fail with the same error
    finally:
        prof.close()
    lines = [r.getMessage() for r in caplog.records if "DCGM" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("DCGM profiling stopped: DCGMError_ConnectionNotValid (-21)")


def test_a_gpu_whose_profiling_fields_all_read_not_supported_is_left_to_the_fallback(
    simulate: Callable[[str], Sim], caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulate("k8s-a100-mixed")
    hostengine.install(sim.node, EngineOptions(blank_gpus=frozenset({3})))
    with caplog.at_level(logging.INFO, logger="gpulens"):
        prof = profiler(sim)
        try:
            sim.clock.advance(STEP)
            assert prof.read(3, sim.handle(3), []) == NOT_SERVED
            sim.clock.advance(STEP)
            assert prof.read(3, sim.handle(3), []) == NOT_SERVED
            assert prof.read(2, sim.handle(2), [])[0] == "dcgm"
        finally:
            prof.close()
    lines = [r.getMessage() for r in caplog.records if "GPU 3" in r.getMessage()]
    assert lines == ["DCGM cannot profile GPU 3: every profiling field reads blank NOT_SUPPORTED"]
