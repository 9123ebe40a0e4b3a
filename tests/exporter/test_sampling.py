"""Sampling the simulated node: MIG, MPS, faults, Xid events, collector switches, isolation."""

from __future__ import annotations

import gc
import logging
import time

import pynvml
import pytest

from gpulens.exporter.app import GC_YOUNG_THRESHOLD, Exporter
from gpulens.exporter.collectors import DEFAULT_ENABLED
from tests.exporter.conftest import make_exporter
from tests.exporter.expo import present, samples, value
from tests.sim.static_node import StaticNode
from tests.support.waiting import wait_until


def text_of(exporter: Exporter) -> str:
    return exporter.render(exporter.sample_once()).text.decode()


def test_every_family_has_help_and_type(exporter: Exporter) -> None:
    text = text_of(exporter)
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    helps = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}
    assert names == helps
    assert len(names) > 50
    for line in text.splitlines():
        if line.startswith("# HELP"):
            assert len(line.split(None, 3)) == 4, f"empty HELP: {line}"


def test_device_wide_values_stay_on_the_parent_of_a_mig_gpu(exporter: Exporter) -> None:
    text = text_of(exporter)
    assert all("gpu_instance" not in s.labels for s in samples(text, "gpu_power_watts"))
    assert value(text, "gpu_power_watts", gpu="0") == 70.0
    assert value(text, "gpu_utilization_ratio", gpu="0") is None  # NOT_SUPPORTED on MIG: absent
    infos = samples(text, "gpu_mig_instance_info")
    assert sorted((s.labels["gpu_instance"], s.labels["mig_profile"]) for s in infos) == [
        ("1", "3g.40gb"),
        ("2", "2g.20gb"),
        ("4", "1g.10gb"),
    ]
    assert value(text, "gpu_mig_memory_used_bytes", gpu="0", gpu_instance="1") == 1024**3
    assert value(text, "gpu_mig_processes", gpu="0", gpu_instance="2") == 1
    assert value(text, "gpu_info", gpu="0")  # identity is there
    assert samples(text, "gpu_info")[0].labels["mig_mode"] == "enabled"


def test_mig_instances_that_change_are_picked_up_without_restart(
    exporter: Exporter, node: StaticNode
) -> None:
    text_of(exporter)
    node.update(0, mig_instances=node.gpu_state(0).mig_instances[:1])
    text = text_of(exporter)
    assert [s.labels["gpu_instance"] for s in samples(text, "gpu_mig_instance_info")] == ["1"]


def test_mps_server_and_clients(exporter: Exporter) -> None:
    text = text_of(exporter)
    assert value(text, "gpu_mps_server_active", gpu="1") == 1
    assert value(text, "gpu_mps_clients", gpu="1") == 2
    assert value(text, "gpu_mps_server_active", gpu="2") == 0
    assert value(text, "gpu_mps_clients", gpu="2") == 0


def test_memory_used_excludes_reserved(exporter: Exporter) -> None:
    text = text_of(exporter)
    total = present(text, "gpu_memory_total_bytes", gpu="3")
    used = present(text, "gpu_memory_used_bytes", gpu="3")
    free = present(text, "gpu_memory_free_bytes", gpu="3")
    reserved = present(text, "gpu_memory_reserved_bytes", gpu="3")
    assert used + free + reserved == total
    assert reserved == 512 * 1024**2


def test_lost_gpu_is_down_while_the_others_are_served(exporter: Exporter, node: StaticNode) -> None:
    text_of(exporter)
    node.update(2, lost=True)
    text = text_of(exporter)
    assert value(text, "gpu_up", gpu="2") == 0
    assert value(text, "gpu_info", gpu="2") == 1  # identity kept for joins and alerts
    assert value(text, "gpu_power_watts", gpu="2") is None
    assert value(text, "gpu_up", gpu="3") == 1
    assert value(text, "gpu_power_watts", gpu="3") == 55.0
    assert value(text, "gpulens_collector_success", collector="power_thermal") == 0
    assert value(text, "gpulens_nvml_up") == 1


def test_gpu_that_comes_back_is_read_again(exporter: Exporter, node: StaticNode) -> None:
    node.update(2, lost=True)
    text_of(exporter)
    node.update(2, lost=False)
    text = text_of(exporter)
    assert value(text, "gpu_up", gpu="2") == 1
    assert value(text, "gpulens_collector_success", collector="power_thermal") == 1


def test_hung_gpu_is_reported_down_within_the_deadline_and_not_resubmitted(
    exporter: Exporter, node: StaticNode
) -> None:
    text_of(exporter)
    node.update(3, hang_seconds=1.5)
    first = exporter.sample_once()
    # reported hung: the sample ended at the 0.5 s deadline (after the 1.5 s hang it would be up)
    gpu3 = first.gpus[3]
    assert not gpu3.up and "hung" in gpu3.error
    assert first.gpus[2].up
    second = exporter.sample_once()  # the worker is still stuck: no new calls queued behind it
    assert not second.gpus[3].up and "has not returned" in second.gpus[3].error
    node.update(3, hang_seconds=0.0)
    wait_until(lambda: exporter.sample_once().gpus[3].up, "GPU 3 up again once its hung call returned")


def test_nvml_failing_at_start_serves_nvml_up_0_then_recovers(node: StaticNode) -> None:
    node.init_code = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    exporter = make_exporter(node)
    try:
        text = text_of(exporter)
        assert value(text, "gpulens_nvml_up") == 0
        assert value(text, "gpulens_gpus") == 0
        assert samples(text, "gpulens_nvml_error_info")
        assert not samples(text, "gpu_up")
        assert value(text, "gpulens_build_info", version=__import__("gpulens").__version__) == 1
        node.init_code = None
        node.clock.advance(0.5)
        assert value(text_of(exporter), "gpulens_nvml_up") == 0  # still backing off: no retry yet
        node.clock.advance(0.6)  # first retry after 1 s of backoff (on the exporter's clock)
        text = text_of(exporter)
        assert value(text, "gpulens_nvml_up") == 1
        assert value(text, "gpulens_gpus") == 4
        assert value(text, "gpu_up", gpu="0") == 1
    finally:
        exporter.close()


def test_xid_events_are_counted_per_gpu_and_per_mig_instance(exporter: Exporter, node: StaticNode) -> None:
    exporter.sample_once()  # registers the event set
    node.clock.advance(1)
    node.inject(2, data=79)
    node.inject(2, data=79)
    node.inject(0, data=94, gpu_instance_id=2, compute_instance_id=0)
    node.clock.advance(1)
    text = text_of(exporter)
    assert value(text, "gpu_xid_errors_total", gpu="2", xid="79") == 2
    assert value(text, "gpu_xid_errors_total", gpu="0", xid="94") == 1
    assert value(text, "gpu_mig_xid_errors_total", gpu="0", gpu_instance="2", xid="94") == 1
    assert value(text, "gpu_xid_last_timestamp_seconds", gpu="2", xid="79") == node.clock.now()


def test_the_watcher_thread_counts_every_event_between_samples(exporter: Exporter, node: StaticNode) -> None:
    exporter.sample_once()
    assert exporter.xid is not None
    exporter.xid.start(timeout_ms=50)
    exporter.sampler.poll_events_inline = False
    for _ in range(5):
        node.clock.advance(0.2)
        node.inject(1, data=31)
        time.sleep(0.12)
    node.clock.advance(0.2)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = text_of(exporter)
        if value(text, "gpu_xid_errors_total", gpu="1", xid="31") == 5:
            break
        time.sleep(0.05)
    assert value(text, "gpu_xid_errors_total", gpu="1", xid="31") == 5


def test_disabled_collectors_export_nothing_and_have_no_status(node: StaticNode) -> None:
    exporter = make_exporter(node, collectors=DEFAULT_ENABLED - {"health", "pcie_nvlink"})
    try:
        text = text_of(exporter)
    finally:
        exporter.close()
    assert not samples(text, "gpu_ecc_errors_total")
    assert not samples(text, "gpu_nvlink_link_up")
    assert not samples(text, "gpu_process_memory_used_bytes")  # processes is off by default
    assert value(text, "gpulens_collector_success", collector="health") is None
    assert value(text, "gpulens_collector_success", collector="device") == 1


def test_processes_collector_is_bounded(node: StaticNode) -> None:
    exporter = make_exporter(node, processes_max=2)
    try:
        text = text_of(exporter)
    finally:
        exporter.close()
    assert len(samples(text, "gpu_process_memory_used_bytes")) == 2
    assert value(text, "gpulens_processes_dropped") == 5
    biggest = max(samples(text, "gpu_process_memory_used_bytes"), key=lambda s: s.value)
    assert biggest.labels["pid"] == "40000"


def test_attribution_failure_only_fails_the_jobs_collector(exporter: Exporter) -> None:
    class Broken:
        def attribute(self, *args: object) -> list[object]:
            raise RuntimeError("procfs exploded")

        def close(self) -> None:
            pass

    exporter._attributor = Broken()
    text = text_of(exporter)
    assert value(text, "gpulens_collector_success", collector="jobs") == 0
    assert value(text, "gpulens_collector_success", collector="device") == 1
    assert not samples(text, "gpu_job_info")
    assert value(text, "gpu_up", gpu="0") == 1


def test_jobs_are_exported_per_gpu_and_instance(exporter: Exporter) -> None:
    text = text_of(exporter)
    mig_jobs = [s for s in samples(text, "gpu_job_info") if s.labels["gpu"] == "0"]
    assert sorted(s.labels["gpu_instance"] for s in mig_jobs) == ["1", "2", "4"]
    assert all(s.labels["sharing"] == "mig" for s in mig_jobs)
    memory = sum(s.value for s in samples(text, "gpu_job_memory_used_bytes") if s.labels["gpu"] == "2")
    assert memory == 10 * 1024**3


def test_gpm_profiling_needs_two_samples_and_reports_ratios(exporter: Exporter, node: StaticNode) -> None:
    first = text_of(exporter)
    assert not samples(first, "gpu_mig_sm_active_ratio")
    node.clock.advance(5)
    text = text_of(exporter)
    assert value(text, "gpulens_profiling_source_info", gpu="0", source="gpm") == 1
    assert value(text, "gpulens_profiling_source_info", gpu="2", source="nvml") == 1  # A100: no GPM
    assert abs(present(text, "gpu_mig_sm_active_ratio", gpu="0", gpu_instance="1") - 0.25) < 1e-6
    assert value(text, "gpu_sm_active_ratio", gpu="2") is None


def test_job_sm_utilization_with_the_default_collectors(node: StaticNode) -> None:
    exporter = make_exporter(node, collectors=DEFAULT_ENABLED)
    try:
        text = text_of(exporter)
    finally:
        exporter.close()
    assert value(text, "gpu_job_sm_utilization_ratio", gpu="2") == 0.37  # an exclusive job: the whole figure


def test_profiling_family_names_follow_the_contract(exporter: Exporter, node: StaticNode) -> None:
    text_of(exporter)
    node.clock.advance(5)
    text = text_of(exporter)
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    profiling = {n for n in names if n.endswith("_ratio") and ("_active_" in n or "occupancy" in n)}
    expected_gpu = {
        f"gpu_{k}_active_ratio" for k in ("graphics", "sm", "tensor", "dram", "fp64", "fp32", "fp16")
    }
    expected_mig = {
        f"gpu_mig_{k}_active_ratio" for k in ("graphics", "sm", "tensor", "dram", "fp64", "fp32", "fp16")
    }
    expected = expected_gpu | expected_mig | {"gpu_sm_occupancy_ratio", "gpu_mig_sm_occupancy_ratio"}
    assert profiling == expected


def test_gpm_unsupported_for_instances_leaves_the_rest_of_profiling_working() -> None:
    from gpulens.sim.install import uninstall
    from gpulens.sim.nvml import SimLib
    from tests.sim.static_node import example_node

    node = example_node()
    lib = SimLib(node, exclude=["nvmlGpmMigSampleGet"])  # an older driver: FunctionNotFound
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    exporter = make_exporter(node)
    try:
        text_of(exporter)
        node.clock.advance(5)
        text = text_of(exporter)
    finally:
        exporter.close()
        uninstall()
    assert not samples(text, "gpu_mig_sm_active_ratio")
    assert value(text, "gpu_sm_active_ratio", gpu="1") is not None
    assert value(text, "gpulens_collector_success", collector="profiling") == 1


def test_a_hung_gpu_is_logged_once_while_it_stays_hung(
    exporter: Exporter, node: StaticNode, caplog: pytest.LogCaptureFixture
) -> None:
    text_of(exporter)
    node.update(3, hang_seconds=1.2)
    with caplog.at_level(logging.INFO, logger="gpulens"):
        exporter.sample_once()
        exporter.sample_once()  # still stuck: a different message, the same state
        node.update(3, hang_seconds=0.0)
        wait_until(lambda: exporter.sample_once().gpus[3].up, "GPU 3 up again once its hung call returned")
    gpu3 = [r for r in caplog.records if r.getMessage().startswith("GPU 3")]
    assert [r.levelno for r in gpu3] == [logging.WARNING, logging.INFO]


def test_event_wait_errors_are_logged_once_and_do_not_spin(
    exporter: Exporter, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    exporter.sample_once()
    calls = []

    def failing_wait(*_args: object) -> None:
        calls.append(1)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlEventSetWait", failing_wait)
    assert exporter.xid is not None
    with caplog.at_level(logging.INFO, logger="gpulens"):
        exporter.xid.start(timeout_ms=100)
        time.sleep(0.6)
        exporter.xid.stop()
    assert len(calls) <= 8, f"{len(calls)} waits in 0.6 s: the watcher spins"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "xid" in r.getMessage()]
    assert len(warnings) == 1


def test_clock_event_durations_are_counters_in_seconds(exporter: Exporter, node: StaticNode) -> None:
    node.update(2, clock_event_reason_ns={pynvml.nvmlClocksEventReasonHwThermalSlowdown: 2_500_000_000})
    text = text_of(exporter)
    assert value(text, "gpu_clock_event_seconds_total", gpu="2", reason="hw_thermal_slowdown") == 2.5
    assert value(text, "gpu_clock_event_seconds_total", gpu="2", reason="sw_power_cap") == 0


def test_disabling_every_collector_leaves_only_the_exporters_own_metrics(node: StaticNode) -> None:
    exporter = make_exporter(node, collectors=frozenset())
    try:
        text = text_of(exporter)
    finally:
        exporter.close()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert names and all(name.startswith("gpulens_") for name in names)
    assert value(text, "gpulens_gpus") == 4


def test_a_started_exporter_collects_young_objects_less_often_than_cpython_by_default(node) -> None:
    before = gc.get_threshold()
    gc.set_threshold(700, *before[1:])
    exporter = make_exporter(node)
    try:
        exporter.start()
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
    finally:
        exporter.close()
        gc.set_threshold(*before)


def test_an_embedding_program_that_switched_collection_off_keeps_it_off(node) -> None:
    before = gc.get_threshold()
    gc.set_threshold(0, *before[1:])
    exporter = make_exporter(node)
    try:
        exporter.start()
        assert gc.get_threshold()[0] == 0
    finally:
        exporter.close()
        gc.set_threshold(*before)
