"""`--compat jobstats`: the series Princeton jobstats queries, with the labels its exporter gives them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client.core import Metric

from tests.dcgm.conftest import Sim, one, series, two_samples

LABELS = {"ordinal", "minor_number", "uuid", "name", "GPU_I_ID", "jobid", "userid"}


@pytest.fixture
def h100(simulate: Callable[[str], Sim]) -> list[Metric]:
    sim = simulate("dgx-h100")
    return two_samples(sim.exporter(compat="jobstats"), sim)


def test_a_job_s_gpu_has_its_job_id_as_value_and_label(h100: list[Metric]) -> None:
    ((labels, value),) = series(h100, "nvidia_gpu_jobId", ordinal="3")
    assert value == 5110 and labels["jobid"] == "5110"
    assert set(labels) == LABELS
    ((uid_labels, uid),) = series(h100, "nvidia_gpu_jobUid", ordinal="3")
    assert uid_labels == labels and uid == float(labels["userid"]) > 0


def test_usage_series_carry_the_same_labels_as_the_job_series(h100: list[Metric]) -> None:
    ((job, _),) = series(h100, "nvidia_gpu_jobId", ordinal="3")
    for name in ("nvidia_gpu_duty_cycle", "nvidia_gpu_memory_used_bytes", "nvidia_gpu_memory_total_bytes"):
        assert [labels for labels, _ in series(h100, name, ordinal="3")] == [job], name


def test_units_are_the_jobstats_exporter_s(h100: list[Metric]) -> None:
    g = {"gpu": "3"}
    assert one(h100, "nvidia_gpu_duty_cycle", ordinal="3") == pytest.approx(
        one(h100, "gpu_utilization_ratio", **g) * 100  # type: ignore[operator]
    )
    assert one(h100, "nvidia_gpu_memory_total_bytes", ordinal="3") == one(h100, "gpu_memory_total_bytes", **g)
    used = one(h100, "gpu_memory_used_bytes", **g) + one(h100, "gpu_memory_reserved_bytes", **g)  # type: ignore[operator]
    assert (
        one(h100, "nvidia_gpu_memory_used_bytes", ordinal="3") == used
    )  # NVML v1 "used" includes the reserve
    assert one(h100, "nvidia_gpu_power_usage_milliwatts", ordinal="3") == pytest.approx(
        one(h100, "gpu_power_watts", **g) * 1000  # type: ignore[operator]
    )
    ratio = one(h100, "nvidia_gpu_graphics_util_percent", ordinal="3")
    assert ratio == one(h100, "gpu_graphics_active_ratio", **g) and 0 < ratio <= 1  # type: ignore[operator]


def test_a_mig_gpu_has_parent_and_per_instance_series_without_duty_cycle(h100: list[Metric]) -> None:
    devices = {
        labels["GPU_I_ID"]: labels for labels, _ in series(h100, "nvidia_gpu_memory_total_bytes", ordinal="0")
    }
    assert set(devices) == {"", "2", "3", "9", "10"}
    assert devices["9"]["name"] == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert devices["9"]["uuid"].startswith("MIG-") and devices["9"]["minor_number"] == "0"
    assert devices[""]["jobid"] == ""  # the jobs hold the instances, not the parent
    assert series(h100, "nvidia_gpu_duty_cycle", ordinal="0") == []
    assert {
        labels["jobid"] for labels, _ in series(h100, "nvidia_gpu_graphics_util_percent", ordinal="0")
    } >= {
        "5101",
        "5102",
        "5103",
        "5104",
    }


def test_a_gpu_shared_by_jobs_is_repeated_once_per_job(h100: list[Metric]) -> None:
    jobs = {labels["jobid"] for labels, _ in series(h100, "nvidia_gpu_duty_cycle", ordinal="2")}
    assert jobs == {"5107", "5108", "5109"}  # MPS on GPU 2: every job's query finds the GPU


def test_a_gpu_no_job_holds_has_no_job_series(h100: list[Metric]) -> None:
    assert series(h100, "nvidia_gpu_jobId", ordinal="7") == []
    ((labels, _),) = series(h100, "nvidia_gpu_duty_cycle", ordinal="7")
    assert labels["jobid"] == labels["userid"] == ""


def test_the_device_count_is_every_gpu(h100: list[Metric]) -> None:
    assert one(h100, "nvidia_gpu_num_devices") == 8


def test_the_minor_number_is_read_from_nvml(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("seed-case")
    exporter = sim.exporter(compat="jobstats")
    try:
        snapshot = exporter.sample_once()
        families = exporter.families(snapshot)
    finally:
        exporter.close()
    assert [g.identity.minor_number for g in snapshot.gpus] == [i.minor_number for i in sim.node.identities]
    labelled = {
        labels["ordinal"]: labels["minor_number"]
        for labels, _ in series(families, "nvidia_gpu_memory_total_bytes")
    }
    assert labelled == {str(i.index): str(i.minor_number) for i in sim.node.identities}
