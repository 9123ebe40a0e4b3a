"""Temperature, power and energy, clocks and clock event reasons, fans, P-state and modes.

These are device-wide readings: on a MIG handle they are NOT_SUPPORTED (read the parent).
"""

from __future__ import annotations

import pynvml

from gpulens.sim.nvml._core import (
    DEV,
    PTR,
    UINT,
    Context,
    NvmlFail,
    SymbolTable,
    Target,
    in_struct,
    out_uint,
    out_ull,
)

TABLE = SymbolTable()

# board thresholds in °C (typical datacenter values: shutdown, slowdown, memory max, GPU max)
THRESHOLDS = {
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
    pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 95,
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87,
}


def physical(ctx: Context, handle: int) -> Target:
    target = ctx.device(handle)
    target.require_physical()
    return target


def _temperature(ctx: Context, handle: int, sensor: int) -> int:
    target = physical(ctx, handle)
    if sensor != pynvml.NVML_TEMPERATURE_GPU:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return target.state.temperature_c


@TABLE.define("nvmlDeviceGetTemperature", DEV, UINT, PTR)
def temperature(ctx: Context, handle: int, sensor: int, out: int) -> None:
    out_uint(out, _temperature(ctx, handle, sensor))


@TABLE.define("nvmlDeviceGetTemperatureV", DEV, PTR)
def temperature_v(ctx: Context, handle: int, info_ptr: int) -> None:
    info = in_struct(info_ptr, pynvml.c_nvmlTemperature_v1_t)
    if info.version != pynvml.nvmlTemperature_v1:
        raise NvmlFail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    info.temperature = _temperature(ctx, handle, info.sensorType)


@TABLE.define("nvmlDeviceGetTemperatureThreshold", DEV, UINT, PTR)
def temperature_threshold(ctx: Context, handle: int, kind: int, out: int) -> None:
    physical(ctx, handle)
    if kind not in THRESHOLDS:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    out_uint(out, THRESHOLDS[kind])


@TABLE.define("nvmlDeviceGetPowerUsage", DEV, PTR)
def power_usage(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, physical(ctx, handle).state.power_mw)


@TABLE.define("nvmlDeviceGetEnforcedPowerLimit", DEV, PTR)
def enforced_power_limit(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, physical(ctx, handle).state.power_limit_mw)


TABLE.alias("nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetEnforcedPowerLimit")


@TABLE.define("nvmlDeviceGetPowerManagementDefaultLimit", DEV, PTR)
def default_power_limit(ctx: Context, handle: int, out: int) -> None:
    state = physical(ctx, handle).state
    out_uint(out, state.default_power_limit_mw or state.power_limit_mw)


@TABLE.define("nvmlDeviceGetPowerManagementLimitConstraints", DEV, PTR, PTR)
def power_limit_constraints(ctx: Context, handle: int, min_out: int, max_out: int) -> None:
    target = physical(ctx, handle)
    maximum = target.identity.model.power_limit_watts * 1000
    out_uint(min_out, maximum // 2)
    out_uint(max_out, maximum)


@TABLE.define("nvmlDeviceGetPowerManagementMode", DEV, PTR)
def power_management_mode(ctx: Context, handle: int, out: int) -> None:
    physical(ctx, handle)
    out_uint(out, pynvml.NVML_FEATURE_ENABLED)


@TABLE.define("nvmlDeviceGetTotalEnergyConsumption", DEV, PTR)
def total_energy(ctx: Context, handle: int, out: int) -> None:
    out_ull(out, physical(ctx, handle).state.energy_mj)


def current_clock(target: Target, clock_type: int) -> int:
    s = target.state
    clocks = {
        pynvml.NVML_CLOCK_GRAPHICS: s.graphics_clock_mhz,
        pynvml.NVML_CLOCK_SM: s.sm_clock_mhz,
        pynvml.NVML_CLOCK_MEM: s.memory_clock_mhz,
        pynvml.NVML_CLOCK_VIDEO: s.video_clock_mhz,
    }
    if clock_type not in clocks:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return clocks[clock_type]


def max_clock(target: Target, clock_type: int) -> int:
    model = target.identity.model
    clocks = {
        pynvml.NVML_CLOCK_GRAPHICS: model.max_sm_clock_mhz,
        pynvml.NVML_CLOCK_SM: model.max_sm_clock_mhz,
        pynvml.NVML_CLOCK_MEM: model.max_memory_clock_mhz,
        pynvml.NVML_CLOCK_VIDEO: model.max_sm_clock_mhz * 9 // 10,
    }
    if clock_type not in clocks:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return clocks[clock_type]


@TABLE.define("nvmlDeviceGetClockInfo", DEV, UINT, PTR)
def clock_info(ctx: Context, handle: int, clock_type: int, out: int) -> None:
    out_uint(out, current_clock(physical(ctx, handle), clock_type))


@TABLE.define("nvmlDeviceGetMaxClockInfo", DEV, UINT, PTR)
def max_clock_info(ctx: Context, handle: int, clock_type: int, out: int) -> None:
    out_uint(out, max_clock(physical(ctx, handle), clock_type))


@TABLE.define("nvmlDeviceGetMaxCustomerBoostClock", DEV, UINT, PTR)
def max_customer_boost_clock(ctx: Context, handle: int, clock_type: int, out: int) -> None:
    out_uint(out, max_clock(physical(ctx, handle), clock_type))


@TABLE.define("nvmlDeviceGetClock", DEV, UINT, UINT, PTR)
def clock(ctx: Context, handle: int, clock_type: int, clock_id: int, out: int) -> None:
    target = physical(ctx, handle)
    if clock_id == pynvml.NVML_CLOCK_ID_CURRENT:
        out_uint(out, current_clock(target, clock_type))
    elif clock_id in (pynvml.NVML_CLOCK_ID_APP_CLOCK_TARGET, pynvml.NVML_CLOCK_ID_APP_CLOCK_DEFAULT):
        # application clocks default to the base clock, about 3/4 of boost on these boards
        peak = max_clock(target, clock_type)
        out_uint(out, peak if clock_type == pynvml.NVML_CLOCK_MEM else peak * 3 // 4)
    elif clock_id == pynvml.NVML_CLOCK_ID_CUSTOMER_BOOST_MAX:
        out_uint(out, max_clock(target, clock_type))
    else:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)


@TABLE.define("nvmlDeviceGetCurrentClocksEventReasons", DEV, PTR)
def current_clock_event_reasons(ctx: Context, handle: int, out: int) -> None:
    out_ull(out, physical(ctx, handle).state.clock_event_reasons)


@TABLE.define("nvmlDeviceGetSupportedClocksEventReasons", DEV, PTR)
def supported_clock_event_reasons(ctx: Context, handle: int, out: int) -> None:
    out_ull(out, physical(ctx, handle).state.supported_clock_event_reasons)


TABLE.alias("nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetCurrentClocksEventReasons")
TABLE.alias("nvmlDeviceGetSupportedClocksThrottleReasons", "nvmlDeviceGetSupportedClocksEventReasons")


def _fan(ctx: Context, handle: int) -> int:
    fan = physical(ctx, handle).state.fan_percent
    if fan is None:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return fan


@TABLE.define("nvmlDeviceGetFanSpeed", DEV, PTR)
def fan_speed(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, _fan(ctx, handle))


@TABLE.define("nvmlDeviceGetFanSpeed_v2", DEV, UINT, PTR)
def fan_speed_v2(ctx: Context, handle: int, fan: int, out: int) -> None:
    speed = _fan(ctx, handle)
    if fan != 0:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    out_uint(out, speed)


@TABLE.define("nvmlDeviceGetNumFans", DEV, PTR)
def num_fans(ctx: Context, handle: int, out: int) -> None:
    _fan(ctx, handle)
    out_uint(out, 1)


@TABLE.define("nvmlDeviceGetPerformanceState", DEV, PTR)
def performance_state(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, physical(ctx, handle).state.performance_state)


TABLE.alias("nvmlDeviceGetPowerState", "nvmlDeviceGetPerformanceState")


@TABLE.define("nvmlDeviceGetComputeMode", DEV, PTR)
def compute_mode(ctx: Context, handle: int, out: int) -> None:
    """Works on MIG devices too (they inherit the parent's mode)."""
    out_uint(out, ctx.device(handle).state.compute_mode)


@TABLE.define("nvmlDeviceGetPersistenceMode", DEV, PTR)
def persistence_mode(ctx: Context, handle: int, out: int) -> None:
    out_uint(out, physical(ctx, handle).state.persistence_mode)


@TABLE.define("nvmlDeviceGetDisplayMode", DEV, PTR)
def display_mode(ctx: Context, handle: int, out: int) -> None:
    physical(ctx, handle)
    out_uint(out, pynvml.NVML_FEATURE_DISABLED)  # headless datacenter boards


TABLE.alias("nvmlDeviceGetDisplayActive", "nvmlDeviceGetDisplayMode")
