"""`--compat nvidia_gpu_exporter`: utkuozdemir/nvidia_gpu_exporter's `nvidia_smi_*` names, labels and
units from the same snapshot (its naming: internal/exporter/exporter.go `knownUnitSuffixes`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.core import Metric

from gpulens.exporter.collectors.base import CollectorOptions
from gpulens.exporter.collectors.nvidia_gpu_exporter_compat import collect, smi_uuid
from gpulens.exporter.compat import CompatError, CompatSpec, parse_compat
from gpulens.exporter.render import render
from gpulens.exporter.snapshot import (
    Area,
    ClockEventReason,
    ClocksReading,
    ComputeMode,
    DeviceReading,
    EccError,
    EccScope,
    GpuIdentity,
    GpuSample,
    HealthReading,
    MemoryReading,
    MigMode,
    MigReading,
    MigSample,
    NodeSnapshot,
    PowerThermalReading,
    ProcessesReading,
    ProcessKind,
    ProcessSample,
    XidCount,
)
from tests.dcgm.conftest import Sim, family, one, series, two_samples

MIB = 1024 * 1024
UUID = "GPU-AB12CD34-0000-1111-2222-333344445555"
PLAIN = "ab12cd34-0000-1111-2222-333344445555"


def gpu(**readings: Any) -> GpuSample:
    """GPU 0, up, MIG disabled, with the given area readings (and `failed_areas`, `mig_mode`)."""
    identity = GpuIdentity(
        index=0, uuid=UUID, model="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0", serial="165"
    )
    return GpuSample(identity=identity, **{"up": True, "mig_mode": MigMode.DISABLED, **readings})


def scrape(*gpus: GpuSample, **node: object) -> list[Metric]:
    snapshot = NodeSnapshot(
        timestamp=1.0,
        duration_seconds=0.1,
        nvml_up=True,
        driver_version="550.54.15",
        cuda_version="12.4",
        gpus=gpus,
        **node,  # type: ignore[arg-type]
    )
    return list(collect(snapshot, CollectorOptions()))


def test_units_follow_nvidia_smi_s_suffixes() -> None:
    families = scrape(
        gpu(
            device=DeviceReading(utilization_ratio=0.42),
            memory=MemoryReading(memory_used_bytes=706 * MIB + 12345),
            clocks=ClocksReading(
                sm_clock_hertz=1_980e6, clock_event_seconds=((ClockEventReason.SW_POWER_CAP, 2.5),)
            ),
            power_thermal=PowerThermalReading(power_watts=433.78, temperature_celsius=53.0),
        )
    )
    assert one(families, "nvidia_smi_utilization_gpu_ratio", uuid=PLAIN) == 0.42
    assert one(families, "nvidia_smi_memory_used_bytes", uuid=PLAIN) == 706 * MIB  # whole MiB, as printed
    assert one(families, "nvidia_smi_clocks_current_sm_clock_hz", uuid=PLAIN) == 1_980e6
    assert one(families, "nvidia_smi_power_draw_watts", uuid=PLAIN) == 433.78
    assert one(families, "nvidia_smi_temperature_gpu", uuid=PLAIN) == 53
    assert one(families, "nvidia_smi_clocks_event_reasons_counters_sw_power_cap_seconds", uuid=PLAIN) == 2.5


def test_help_is_the_field_as_nvidia_smi_returns_it() -> None:
    families = scrape(
        gpu(
            device=DeviceReading(utilization_ratio=0.1),
            memory=MemoryReading(memory_total_bytes=80 * MIB),
            clocks=ClocksReading(sm_clock_hertz=1e9),
        )
    )
    helps = {f.name: f.documentation for f in families}
    assert helps["nvidia_smi_utilization_gpu_ratio"] == "utilization.gpu [%]"
    assert helps["nvidia_smi_memory_total_bytes"] == "memory.total [MiB]"
    assert helps["nvidia_smi_clocks_current_sm_clock_hz"] == "clocks.current.sm [MHz]"


def test_per_gpu_series_carry_only_the_lowercase_uuid_without_its_prefix() -> None:
    families = scrape(gpu(power_thermal=PowerThermalReading(temperature_celsius=40.0, power_watts=100.0)))
    node_level = {"nvidia_smi_last_collect_success", "nvidia_smi_compute_apps_last_collect_success"}
    per_gpu = [f for f in families if f.name not in node_level | {"nvidia_smi_gpu_info"}]
    assert len(per_gpu) > 5
    for f in per_gpu:
        for sample in f.samples:
            assert sample.labels == {"uuid": PLAIN}, f.name
    assert smi_uuid("MIG-1D2E-AA") == "1d2e-aa"


def test_gpu_info_carries_the_identity_labels_the_dashboards_join_on() -> None:
    ((labels, value),) = series(scrape(gpu()), "nvidia_smi_gpu_info")
    assert value == 1
    assert labels["uuid"] == PLAIN and labels["index"] == "0"
    assert labels["name"] == "NVIDIA H100 80GB HBM3"
    assert labels["driver_version"] == "550.54.15" and labels["cuda_version"] == "12.4"
    assert labels["pci_bus_id"] == "00000000:18:00.0"
    assert labels["driver_model_current"] == "[N/A]"  # what nvidia-smi prints on Linux
    assert one(scrape(gpu()), "nvidia_smi_index", uuid=PLAIN) == 0


def test_values_nvidia_smi_reports_as_n_a_have_no_series() -> None:
    families = scrape(
        gpu(
            device=DeviceReading(fan_speed_ratio=None),
            power_thermal=PowerThermalReading(memory_temperature_celsius=None, temperature_celsius=41.0),
            health=HealthReading(recovery_action=None),
        )
    )
    assert family(families, "nvidia_smi_fan_speed_ratio") is None
    assert family(families, "nvidia_smi_temperature_memory") is None
    assert family(families, "nvidia_smi_gpu_recovery_action") is None


def test_a_failed_area_drops_its_fields_only() -> None:
    families = scrape(
        gpu(
            power_thermal=PowerThermalReading(temperature_celsius=41.0),
            device=DeviceReading(utilization_ratio=0.5),
            failed_areas=frozenset({Area.DEVICE}),
        )
    )
    assert family(families, "nvidia_smi_utilization_gpu_ratio") is None
    assert one(families, "nvidia_smi_temperature_gpu", uuid=PLAIN) == 41


def test_a_lost_gpu_has_no_series_but_its_xid_counters_stay() -> None:
    lost = GpuSample(identity=GpuIdentity(index=0, uuid=UUID), up=False)
    xid = XidCount(gpu=0, uuid=UUID, xid=79, count=2, last_timestamp=1_700_000_000.0)
    families = scrape(lost, xids=(xid,))
    assert family(families, "nvidia_smi_gpu_info") is None
    assert one(families, "nvidia_smi_xid_errors_total", uuid=PLAIN, xid="79") == 2
    assert one(families, "nvidia_smi_xid_last_timestamp_seconds", uuid=PLAIN, xid="79") == 1_700_000_000.0


def test_enums_become_nvidia_smi_s_numbers() -> None:
    families = scrape(
        gpu(
            device=DeviceReading(
                performance_state=0, compute_mode=ComputeMode.EXCLUSIVE_PROCESS, persistence_mode=True
            ),
            clocks=ClocksReading(
                clock_events=((ClockEventReason.GPU_IDLE, False), (ClockEventReason.SW_POWER_CAP, True))
            ),
            health=HealthReading(recovery_action=0, fabric_state=3),
        )
    )
    assert one(families, "nvidia_smi_pstate", uuid=PLAIN) == 0
    assert one(families, "nvidia_smi_compute_mode", uuid=PLAIN) == 3
    assert one(families, "nvidia_smi_persistence_mode", uuid=PLAIN) == 1
    assert one(families, "nvidia_smi_clocks_event_reasons_gpu_idle", uuid=PLAIN) == 0
    assert one(families, "nvidia_smi_clocks_event_reasons_sw_power_cap", uuid=PLAIN) == 1
    assert one(families, "nvidia_smi_gpu_recovery_action", uuid=PLAIN) == 0
    assert one(families, "nvidia_smi_fabric_state", uuid=PLAIN) == 3


def test_ecc_totals_are_per_error_and_scope() -> None:
    families = scrape(
        gpu(
            health=HealthReading(
                ecc_enabled=True,
                ecc_errors=(
                    (EccError.UNCORRECTED, EccScope.AGGREGATE, 4),
                    (EccError.CORRECTED, EccScope.VOLATILE, 9),
                ),
            )
        )
    )
    assert one(families, "nvidia_smi_ecc_errors_uncorrected_aggregate_total", uuid=PLAIN) == 4
    assert one(families, "nvidia_smi_ecc_errors_corrected_volatile_total", uuid=PLAIN) == 9
    assert one(families, "nvidia_smi_ecc_mode_current", uuid=PLAIN) == 1


def test_a_mig_gpu_has_no_whole_gpu_utilization_and_per_instance_series() -> None:
    instances = (
        MigSample(
            gpu_instance=2,
            compute_instance=0,
            profile="3g.40gb",
            uuid="MIG-AAAA",
            memory_total_bytes=40 * 1024 * MIB,
            memory_used_bytes=10 * 1024 * MIB,
            memory_reserved_bytes=MIB,
            profiling=(("sm", 0.6), ("tensor", 0.3)),
        ),
    )
    families = scrape(
        gpu(
            mig_mode=MigMode.ENABLED,
            device=DeviceReading(utilization_ratio=0.9),
            mig=MigReading(instances),
        )
    )
    assert family(families, "nvidia_smi_utilization_gpu_ratio") is None  # [N/A] on MIG
    assert one(families, "nvidia_smi_mig_mode_current", uuid=PLAIN) == 1
    ((info, _),) = series(families, "nvidia_smi_mig_info")
    assert info == {
        "uuid": PLAIN,
        "mig_uuid": "aaaa",
        "gpu_instance_id": "2",
        "compute_instance_id": "0",
        "profile": "3g.40gb",
    }
    key = {"uuid": PLAIN, "gpu_instance_id": "2"}
    assert one(families, "nvidia_smi_mig_memory_used_bytes", **key) == 10 * 1024 * MIB
    assert one(families, "nvidia_smi_mig_memory_free_bytes", **key) == 30 * 1024 * MIB - MIB
    assert one(families, "nvidia_smi_mig_sm_activity_ratio", **key) == 0.6
    assert one(families, "nvidia_smi_mig_tensor_activity_ratio", **key) == 0.3
    assert family(families, "nvidia_smi_mig_graphics_activity_ratio") is None


def test_compute_apps_list_compute_processes_and_count_zero_on_an_idle_gpu() -> None:
    procs = (
        ProcessSample(pid=10, kind=ProcessKind.COMPUTE, used_memory_bytes=2 * MIB + 5, name="./gpu_burn"),
        ProcessSample(pid=11, kind=ProcessKind.GRAPHICS, used_memory_bytes=MIB, name="Xorg"),
    )
    idle = GpuSample(identity=GpuIdentity(index=1, uuid="GPU-FF"), up=True)
    families = scrape(gpu(processes=ProcessesReading(processes=procs)), idle)
    ((labels, _),) = series(families, "nvidia_smi_compute_app_info")
    assert labels == {"uuid": PLAIN, "pid": "10", "process_name": "./gpu_burn"}
    assert one(families, "nvidia_smi_compute_app_used_memory_bytes", pid="10") == 2 * MIB
    assert one(families, "nvidia_smi_compute_apps", uuid=PLAIN) == 1
    assert one(families, "nvidia_smi_compute_apps", uuid="ff") == 0
    assert one(families, "nvidia_smi_compute_apps_last_collect_success") == 1
    assert one(families, "nvidia_smi_count", uuid="ff") == 2


def test_a_failed_process_read_reports_collection_failure_not_idle() -> None:
    families = scrape(gpu(failed_areas=frozenset({Area.PROCESSES})))
    assert one(families, "nvidia_smi_compute_apps_last_collect_success") == 0
    assert family(families, "nvidia_smi_compute_apps") is None


def test_the_exposition_keeps_the_peer_s_names_in_both_formats() -> None:
    rendered = render(
        scrape(
            gpu(
                power_thermal=PowerThermalReading(energy_joules=12.5),
                health=HealthReading(
                    ecc_enabled=True, ecc_errors=((EccError.CORRECTED, EccScope.VOLATILE, 1),)
                ),
            )
        )
    )
    for text in (rendered.text.decode(), rendered.openmetrics.decode()):
        assert f'\nnvidia_smi_energy_joules_total{{uuid="{PLAIN}"}} 12.5' in text
        assert f'\nnvidia_smi_ecc_errors_corrected_volatile_total{{uuid="{PLAIN}"}} 1.0' in text
    assert "# TYPE nvidia_smi_ecc_errors_corrected_volatile_total gauge\n" in rendered.text.decode()


def test_the_mode_parses_alone_and_beside_the_others() -> None:
    assert parse_compat("nvidia_gpu_exporter") == CompatSpec(nvidia_gpu_exporter=True)
    spec = parse_compat("dcgm, jobstats,nvidia_gpu_exporter")
    assert spec.dcgm is not None and spec.jobstats and spec.nvidia_gpu_exporter
    with pytest.raises(CompatError, match="nvidia_gpu_exporter takes no version"):
        parse_compat("nvidia_gpu_exporter=2")


# ---- on the simulated node: the fields only this view reads ------------------------------------


@pytest.fixture
def h100(simulate: Callable[[str], Sim]) -> list[Metric]:
    sim = simulate("dgx-h100")
    return two_samples(sim.exporter(compat="nvidia_gpu_exporter"), sim)


def test_the_simulated_node_serves_the_fields_only_nvidia_smi_shows(h100: list[Metric]) -> None:
    ((info, _),) = series(h100, "nvidia_smi_gpu_info", index="3")
    uuid = info["uuid"]
    assert not uuid.startswith("gpu-") and uuid == uuid.lower()
    for name in (
        "nvidia_smi_clocks_current_graphics_clock_hz",
        "nvidia_smi_clocks_current_video_clock_hz",
        "nvidia_smi_clocks_max_graphics_clock_hz",
        "nvidia_smi_clocks_max_memory_clock_hz",
    ):
        value = one(h100, name, uuid=uuid)
        assert value is not None and value > 1e8, name
    assert one(h100, "nvidia_smi_gpu_recovery_action", uuid=uuid) == 0
    assert one(h100, "nvidia_smi_fabric_state", uuid=uuid) == 3  # an NVSwitch board: registered
    names = {labels["process_name"] for labels, _ in series(h100, "nvidia_smi_compute_app_info", uuid=uuid)}
    assert names and "" not in names
    assert one(h100, "gpulens_collector_success", collector="nvidia_gpu_exporter_compat") == 1


def test_the_mode_is_off_by_default_and_reads_nothing_extra(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("dgx-h100")
    exporter = sim.exporter()
    families = two_samples(exporter, sim)
    assert not [f.name for f in families if f.name.startswith("nvidia_smi_")]
    snapshot = exporter.sample_once()
    for g in snapshot.gpus:
        assert g.clocks is not None and g.health is not None and g.processes is not None
        assert g.clocks.graphics_clock_hertz is None and g.health.fabric_state is None
        assert all(p.name is None for p in g.processes.processes)


def test_the_openmetrics_exposition_passes_the_strict_parser(h100: list[Metric]) -> None:
    """Gauges whose nvidia-smi field ends in `.total` keep the name, which OpenMetrics allows."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    parsed = {f.name: f.type for f in text_string_to_metric_families(render(h100).openmetrics.decode())}
    assert parsed["nvidia_smi_ecc_errors_corrected_volatile_total"] == "gauge"
    assert parsed["nvidia_smi_energy_joules"] == "counter"
    assert parsed["nvidia_smi_mig_info"] == "gauge"
