"""gpu_health_status: one verdict per GPU and system, from what the snapshot already holds."""

from __future__ import annotations

from dataclasses import replace

from gpulens.exporter.collectors.base import CollectorOptions
from gpulens.exporter.collectors.health_status import XID_WINDOW_SECONDS, collect
from gpulens.exporter.snapshot import (
    Area,
    ClockEventReason,
    ClocksReading,
    EccError,
    EccScope,
    GpuIdentity,
    GpuSample,
    HealthReading,
    NodeSnapshot,
    NvLinkSample,
    PcieNvlinkReading,
    PowerThermalReading,
    RetiredPageCause,
    TemperatureThreshold,
    XidCount,
)

NOW = 1_767_225_600.0
UUID = "GPU-00000000-0000-0000-0000-000000000000"
POWER = PowerThermalReading(
    temperature_celsius=45.0,
    temperature_thresholds=((TemperatureThreshold.SLOWDOWN, 87.0), (TemperatureThreshold.SHUTDOWN, 92.0)),
)
HEALTH = HealthReading(
    ecc_errors=((EccError.UNCORRECTED, EccScope.VOLATILE, 0), (EccError.CORRECTED, EccScope.VOLATILE, 3)),
    row_remap_pending=False,
    row_remap_failed=False,
)
HEALTHY = GpuSample(
    identity=GpuIdentity(index=0, uuid=UUID, model="NVIDIA H100 80GB HBM3"),
    up=True,
    power_thermal=POWER,
    clocks=ClocksReading(
        clock_events=(
            (ClockEventReason.HW_THERMAL_SLOWDOWN, False),
            (ClockEventReason.HW_POWER_BRAKE_SLOWDOWN, False),
        )
    ),
    health=HEALTH,
    pcie_nvlink=PcieNvlinkReading(nvlinks=(NvLinkSample(link=0, up=True), NvLinkSample(link=1, up=True))),
)


def with_health(**changes: object) -> GpuSample:
    """HEALTHY with its health reading changed."""
    return replace(HEALTHY, health=replace(HEALTH, **changes))  # type: ignore[arg-type]


def with_clock_event(reason: ClockEventReason) -> GpuSample:
    """HEALTHY with one clock event reason active."""
    return replace(HEALTHY, clocks=ClocksReading(clock_events=((reason, True),)))


def verdicts(gpu: GpuSample, xids: tuple[XidCount, ...] = ()) -> dict[str, float]:
    snapshot = NodeSnapshot(timestamp=NOW, duration_seconds=0.1, nvml_up=True, gpus=(gpu,), xids=xids)
    (family,) = list(collect(snapshot, CollectorOptions()))
    assert family.name == "gpu_health_status"
    rows = {}
    for s in family.samples:
        assert (s.labels["gpu"], s.labels["uuid"]) == ("0", UUID)
        rows[s.labels["system"]] = s.value
    return rows


def xid(code: int, seconds_ago: float) -> XidCount:
    return XidCount(gpu=0, uuid=UUID, xid=code, count=1, last_timestamp=NOW - seconds_ago)


def test_a_healthy_gpu_passes_every_system() -> None:
    assert verdicts(HEALTHY) == {s: 0.0 for s in ("pcie", "memory", "thermal", "power", "nvlink", "driver")}


def test_a_volatile_uncorrectable_ecc_error_fails_memory() -> None:
    gpu = with_health(ecc_errors=((EccError.UNCORRECTED, EccScope.VOLATILE, 1),))
    assert verdicts(gpu)["memory"] == 2.0


def test_a_pending_row_remap_warns_on_memory() -> None:
    assert verdicts(with_health(row_remap_pending=True))["memory"] == 1.0


def test_a_failed_row_remap_fails_memory_even_with_a_remap_pending() -> None:
    assert verdicts(with_health(row_remap_pending=True, row_remap_failed=True))["memory"] == 2.0


def test_retired_pages_at_dcgms_limit_fail_memory() -> None:
    below = with_health(
        retired_pages=((RetiredPageCause.SINGLE_BIT_ECC, 50), (RetiredPageCause.DOUBLE_BIT_ECC, 12))
    )
    at = with_health(
        retired_pages=((RetiredPageCause.SINGLE_BIT_ECC, 50), (RetiredPageCause.DOUBLE_BIT_ECC, 13))
    )
    assert verdicts(below)["memory"] == 0.0
    assert verdicts(at)["memory"] == 2.0


def test_thermal_slowdown_warns_and_the_shutdown_temperature_fails() -> None:
    slowing = with_clock_event(ClockEventReason.HW_THERMAL_SLOWDOWN)
    assert verdicts(slowing)["thermal"] == 1.0
    hot = replace(slowing, power_thermal=replace(POWER, temperature_celsius=92.0))
    assert verdicts(hot)["thermal"] == 2.0


def test_a_power_brake_warns_on_power() -> None:
    assert verdicts(with_clock_event(ClockEventReason.HW_POWER_BRAKE_SLOWDOWN))["power"] == 1.0


def test_a_present_nvlink_that_is_down_warns() -> None:
    links = (NvLinkSample(link=0, up=True), NvLinkSample(link=1, up=False))
    gpu = replace(HEALTHY, pcie_nvlink=PcieNvlinkReading(nvlinks=links))
    assert verdicts(gpu)["nvlink"] == 1.0


def test_xids_indict_their_system_while_recent() -> None:
    assert verdicts(HEALTHY, (xid(79, 30),))["pcie"] == 2.0
    assert verdicts(HEALTHY, (xid(74, 30),))["nvlink"] == 2.0
    assert verdicts(HEALTHY, (xid(119, 30),))["driver"] == 2.0
    assert verdicts(HEALTHY, (xid(79, XID_WINDOW_SECONDS + 1),))["pcie"] == 0.0


def test_application_xids_indict_nothing() -> None:
    assert set(verdicts(HEALTHY, (xid(13, 5), xid(31, 5), xid(43, 5))).values()) == {0.0}


def test_a_lost_gpu_fails_only_driver() -> None:
    assert verdicts(replace(HEALTHY, up=False, error="GPU is lost")) == {"driver": 2.0}


def test_a_system_whose_readings_failed_is_left_out() -> None:
    rows = verdicts(replace(HEALTHY, failed_areas=frozenset({Area.HEALTH})))
    assert "memory" not in rows
    assert rows["thermal"] == 0.0
