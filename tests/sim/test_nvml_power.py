"""Temperature, power, energy, clocks, clock event reasons, fans and modes."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from gpulens.sim.nvml import SimLib
from tests.sim.static_node import StaticNode, example_node, installed


@pytest.fixture(name="sim")
def _sim(nvml_driver: str) -> Iterator[tuple[StaticNode, SimLib]]:
    yield from installed(example_node(), nvml_driver)


def handle(i: int):
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def mig0():
    return pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)


def test_temperature_both_apis(sim) -> None:
    assert pynvml.nvmlDeviceGetTemperature(handle(2), pynvml.NVML_TEMPERATURE_GPU) == 61
    assert pynvml.nvmlDeviceGetTemperatureV(handle(2), pynvml.NVML_TEMPERATURE_GPU) == 61


def test_temperature_of_an_unknown_sensor_is_invalid_argument(sim) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTemperature(handle(2), 7)


def test_temperature_threshold(sim) -> None:
    slowdown = pynvml.nvmlDeviceGetTemperatureThreshold(handle(2), pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    assert slowdown > 61


def test_power_limits_and_energy_in_nvml_units(sim) -> None:
    h = handle(2)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 212_000  # mW
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 400_000
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 400_000
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == 400_000
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200_000, 400_000]
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == 123_456_789  # mJ


def test_clocks_current_max_and_by_id(sim) -> None:
    h = handle(2)
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1410
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 1410
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) == 1215
    assert pynvml.nvmlDeviceGetClock(h, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_ID_CURRENT) == 1410
    boost = pynvml.nvmlDeviceGetClock(h, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_ID_CUSTOMER_BOOST_MAX)
    assert boost == 1410
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetClockInfo(h, 9)


def test_clock_event_reasons_and_the_deprecated_throttle_names(sim) -> None:
    node, _ = sim
    reasons = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    node.update(2, clock_event_reasons=reasons)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle(2)) == reasons
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle(2)) == reasons
    assert pynvml.nvmlDeviceGetSupportedClocksEventReasons(handle(2)) == 0x1FF
    assert pynvml.nvmlDeviceGetSupportedClocksThrottleReasons(handle(2)) == 0x1FF


def test_fan_is_not_supported_on_fanless_boards(sim) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(handle(2))


def test_fan_speed_when_the_board_has_one(sim) -> None:
    node, _ = sim
    node.update(3, fan_percent=47)
    assert pynvml.nvmlDeviceGetFanSpeed(handle(3)) == 47
    assert pynvml.nvmlDeviceGetFanSpeed_v2(handle(3), 0) == 47
    assert pynvml.nvmlDeviceGetNumFans(handle(3)) == 1


def test_performance_state_compute_and_persistence_mode(sim) -> None:
    assert pynvml.nvmlDeviceGetPerformanceState(handle(2)) == 0
    assert pynvml.nvmlDeviceGetComputeMode(handle(1)) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert pynvml.nvmlDeviceGetPersistenceMode(handle(2)) == pynvml.NVML_FEATURE_ENABLED


@pytest.mark.parametrize(
    "call",
    [
        lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        lambda h: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
        pynvml.nvmlDeviceGetPowerUsage,
        pynvml.nvmlDeviceGetEnforcedPowerLimit,
        pynvml.nvmlDeviceGetTotalEnergyConsumption,
        lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        pynvml.nvmlDeviceGetCurrentClocksEventReasons,
        pynvml.nvmlDeviceGetPerformanceState,
        lambda h: pynvml.nvmlDeviceGetTotalEccErrors(h, 0, 0),
        lambda h: pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES),
    ],
)
def test_device_wide_readings_are_not_supported_on_mig_devices(sim, call) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        call(mig0())


def test_compute_mode_works_on_mig_devices(sim) -> None:
    assert pynvml.nvmlDeviceGetComputeMode(mig0()) == pynvml.NVML_COMPUTEMODE_DEFAULT
