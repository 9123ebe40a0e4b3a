"""The pynvml calls the conformance run makes, on a real GPU and on the simulator alike.

Each probe is one pynvml wrapper call with fixed arguments. Probes never change GPU settings: only
getters, event-set registration on a private set, and GPM sample reads. Scopes: `system` runs
once, `gpu` on every physical GPU, `mig` on every MIG device found.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Scope = Literal["system", "gpu", "mig"]

# Field ids probed through nvmlDeviceGetFieldValues (reference nvml-dcgm-api.md §1.3-1.5)
FIELD_IDS = (82, 3, 4, 5, 6, 29, 30, 31, 142, 143, 144, 145, 91, 185, 186, 197, 198)
# GPM metric ids (percent metrics and PCIe / NVLink rates)
GPM_METRIC_IDS = (1, 2, 3, 5, 10, 11, 12, 13, 20, 21, 60, 61)


@dataclass(frozen=True)
class Probe:
    name: str
    scope: Scope
    call: Callable[[Any, Any], Any]  # (pynvml module, handle or None) -> value


def _field_values(nv: Any, handle: Any) -> list[Any]:
    return list(nv.nvmlDeviceGetFieldValues(handle, list(FIELD_IDS)))


def _event_wait(nv: Any, handle: Any) -> Any:
    """Register for what the GPU supports on a private set and wait 100 ms: Timeout is expected."""
    event_set = nv.nvmlEventSetCreate()
    try:
        supported = nv.nvmlDeviceGetSupportedEventTypes(handle)
        nv.nvmlDeviceRegisterEvents(handle, supported & nv.nvmlEventTypeXidCriticalError, event_set)
        return nv.nvmlEventSetWait(event_set, 100)
    finally:
        nv.nvmlEventSetFree(event_set)


def _gpm(nv: Any, handle: Any, mig_parent_gi: tuple[Any, int] | None = None) -> dict[str, Any]:
    """Two GPM samples 200 ms apart and the metrics between them: per-metric return codes and values."""
    first, second = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    try:
        if mig_parent_gi is None:
            nv.nvmlGpmSampleGet(handle, first)
            time.sleep(0.2)
            nv.nvmlGpmSampleGet(handle, second)
        else:
            parent, gi = mig_parent_gi
            nv.nvmlGpmMigSampleGet(parent, gi, first)
            time.sleep(0.2)
            nv.nvmlGpmMigSampleGet(parent, gi, second)
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRIC_IDS)
        request.sample1, request.sample2 = first, second
        for i, metric in enumerate(GPM_METRIC_IDS):
            request.metrics[i].metricId = metric
        nv.nvmlGpmMetricsGet(request)
        return {
            str(metric): {
                "nvmlReturn": int(request.metrics[i].nvmlReturn),
                "value": float(request.metrics[i].value),
            }
            for i, metric in enumerate(GPM_METRIC_IDS)
        }
    finally:
        nv.nvmlGpmSampleFree(first)
        nv.nvmlGpmSampleFree(second)


def _gpm_mig(nv: Any, mig: Any) -> dict[str, Any]:
    parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    return _gpm(nv, mig, (parent, nv.nvmlDeviceGetGpuInstanceId(mig)))


def _recent_us() -> int:
    return int((time.time() - 1.0) * 1e6)


def _p(name: str, scope: Scope, call: Callable[[Any, Any], Any]) -> Probe:
    return Probe(name, scope, call)


SYSTEM_PROBES: tuple[Probe, ...] = (
    _p("nvmlSystemGetDriverVersion", "system", lambda nv, h: nv.nvmlSystemGetDriverVersion()),
    _p("nvmlSystemGetNVMLVersion", "system", lambda nv, h: nv.nvmlSystemGetNVMLVersion()),
    _p("nvmlSystemGetCudaDriverVersion", "system", lambda nv, h: nv.nvmlSystemGetCudaDriverVersion()),
    _p("nvmlSystemGetCudaDriverVersion_v2", "system", lambda nv, h: nv.nvmlSystemGetCudaDriverVersion_v2()),
    _p("nvmlDeviceGetCount", "system", lambda nv, h: nv.nvmlDeviceGetCount()),
    _p(
        "nvmlDeviceGetHandleByUUID(unknown)",
        "system",
        lambda nv, h: nv.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000"),
    ),
)

# probes valid on physical GPUs and MIG devices alike
_COMMON: tuple[tuple[str, Callable[[Any, Any], Any]], ...] = (
    ("nvmlDeviceGetName", lambda nv, h: nv.nvmlDeviceGetName(h)),
    ("nvmlDeviceGetUUID", lambda nv, h: nv.nvmlDeviceGetUUID(h)),
    ("nvmlDeviceGetIndex", lambda nv, h: nv.nvmlDeviceGetIndex(h)),
    ("nvmlDeviceGetMinorNumber", lambda nv, h: nv.nvmlDeviceGetMinorNumber(h)),
    ("nvmlDeviceGetSerial", lambda nv, h: nv.nvmlDeviceGetSerial(h)),
    ("nvmlDeviceGetPciInfo", lambda nv, h: nv.nvmlDeviceGetPciInfo(h)),
    ("nvmlDeviceGetArchitecture", lambda nv, h: nv.nvmlDeviceGetArchitecture(h)),
    ("nvmlDeviceGetCudaComputeCapability", lambda nv, h: nv.nvmlDeviceGetCudaComputeCapability(h)),
    ("nvmlDeviceGetUtilizationRates", lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h)),
    ("nvmlDeviceGetMemoryInfo", lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h)),
    ("nvmlDeviceGetMemoryInfo(v2)", lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)),
    ("nvmlDeviceGetBAR1MemoryInfo", lambda nv, h: nv.nvmlDeviceGetBAR1MemoryInfo(h)),
    ("nvmlDeviceGetTemperature", lambda nv, h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
    ("nvmlDeviceGetPowerUsage", lambda nv, h: nv.nvmlDeviceGetPowerUsage(h)),
    ("nvmlDeviceGetEnforcedPowerLimit", lambda nv, h: nv.nvmlDeviceGetEnforcedPowerLimit(h)),
    ("nvmlDeviceGetPowerManagementLimit", lambda nv, h: nv.nvmlDeviceGetPowerManagementLimit(h)),
    (
        "nvmlDeviceGetPowerManagementDefaultLimit",
        lambda nv, h: nv.nvmlDeviceGetPowerManagementDefaultLimit(h),
    ),
    ("nvmlDeviceGetTotalEnergyConsumption", lambda nv, h: nv.nvmlDeviceGetTotalEnergyConsumption(h)),
    ("nvmlDeviceGetClockInfo(SM)", lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
    ("nvmlDeviceGetClockInfo(MEM)", lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
    ("nvmlDeviceGetClockInfo(GRAPHICS)", lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_GRAPHICS)),
    ("nvmlDeviceGetMaxClockInfo(SM)", lambda nv, h: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
    ("nvmlDeviceGetMaxClockInfo(MEM)", lambda nv, h: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)),
    ("nvmlDeviceGetClock(SM,CURRENT)", lambda nv, h: nv.nvmlDeviceGetClock(h, nv.NVML_CLOCK_SM, 0)),
    ("nvmlDeviceGetCurrentClocksEventReasons", lambda nv, h: nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
    (
        "nvmlDeviceGetSupportedClocksEventReasons",
        lambda nv, h: nv.nvmlDeviceGetSupportedClocksEventReasons(h),
    ),
    ("nvmlDeviceGetFanSpeed", lambda nv, h: nv.nvmlDeviceGetFanSpeed(h)),
    ("nvmlDeviceGetPerformanceState", lambda nv, h: nv.nvmlDeviceGetPerformanceState(h)),
    ("nvmlDeviceGetComputeMode", lambda nv, h: nv.nvmlDeviceGetComputeMode(h)),
    ("nvmlDeviceGetPersistenceMode", lambda nv, h: nv.nvmlDeviceGetPersistenceMode(h)),
    ("nvmlDeviceGetPcieThroughput(TX)", lambda nv, h: nv.nvmlDeviceGetPcieThroughput(h, 0)),
    ("nvmlDeviceGetPcieReplayCounter", lambda nv, h: nv.nvmlDeviceGetPcieReplayCounter(h)),
    ("nvmlDeviceGetCurrPcieLinkGeneration", lambda nv, h: nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
    ("nvmlDeviceGetCurrPcieLinkWidth", lambda nv, h: nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
    ("nvmlDeviceGetFieldValues", _field_values),
    ("nvmlDeviceGetEccMode", lambda nv, h: nv.nvmlDeviceGetEccMode(h)),
    (
        "nvmlDeviceGetTotalEccErrors(corrected,volatile)",
        lambda nv, h: nv.nvmlDeviceGetTotalEccErrors(h, 0, 0),
    ),
    (
        "nvmlDeviceGetTotalEccErrors(uncorrected,aggregate)",
        lambda nv, h: nv.nvmlDeviceGetTotalEccErrors(h, 1, 1),
    ),
    (
        "nvmlDeviceGetMemoryErrorCounter(uncorrected,volatile,DRAM)",
        lambda nv, h: nv.nvmlDeviceGetMemoryErrorCounter(h, 1, 0, 2),
    ),
    ("nvmlDeviceGetRetiredPages(DBE)", lambda nv, h: nv.nvmlDeviceGetRetiredPages(h, 1)),
    ("nvmlDeviceGetRetiredPagesPendingStatus", lambda nv, h: nv.nvmlDeviceGetRetiredPagesPendingStatus(h)),
    ("nvmlDeviceGetRemappedRows", lambda nv, h: nv.nvmlDeviceGetRemappedRows(h)),
    ("nvmlDeviceGetNvLinkState(0)", lambda nv, h: nv.nvmlDeviceGetNvLinkState(h, 0)),
    ("nvmlDeviceGetNvLinkErrorCounter(0,REPLAY)", lambda nv, h: nv.nvmlDeviceGetNvLinkErrorCounter(h, 0, 0)),
    ("nvmlDeviceGetNvLinkVersion(0)", lambda nv, h: nv.nvmlDeviceGetNvLinkVersion(h, 0)),
    ("nvmlDeviceGetSupportedEventTypes", lambda nv, h: nv.nvmlDeviceGetSupportedEventTypes(h)),
    ("nvmlEventSetWait(100ms)", _event_wait),
    ("nvmlDeviceGetComputeRunningProcesses", lambda nv, h: nv.nvmlDeviceGetComputeRunningProcesses(h)),
    ("nvmlDeviceGetGraphicsRunningProcesses", lambda nv, h: nv.nvmlDeviceGetGraphicsRunningProcesses(h)),
    ("nvmlDeviceGetMPSComputeRunningProcesses", lambda nv, h: nv.nvmlDeviceGetMPSComputeRunningProcesses(h)),
    ("nvmlDeviceGetProcessUtilization", lambda nv, h: nv.nvmlDeviceGetProcessUtilization(h, _recent_us())),
    (
        "nvmlDeviceGetProcessesUtilizationInfo",
        lambda nv, h: nv.nvmlDeviceGetProcessesUtilizationInfo(h, _recent_us()),
    ),
    ("nvmlDeviceGetAccountingMode", lambda nv, h: nv.nvmlDeviceGetAccountingMode(h)),
    ("nvmlDeviceGetMigMode", lambda nv, h: nv.nvmlDeviceGetMigMode(h)),
    ("nvmlDeviceGetMaxMigDeviceCount", lambda nv, h: nv.nvmlDeviceGetMaxMigDeviceCount(h)),
    ("nvmlDeviceIsMigDeviceHandle", lambda nv, h: nv.nvmlDeviceIsMigDeviceHandle(h)),
    ("nvmlDeviceGetGpuInstanceId", lambda nv, h: nv.nvmlDeviceGetGpuInstanceId(h)),
    ("nvmlDeviceGetComputeInstanceId", lambda nv, h: nv.nvmlDeviceGetComputeInstanceId(h)),
    ("nvmlDeviceGetAttributes", lambda nv, h: nv.nvmlDeviceGetAttributes(h)),
    ("nvmlGpmQueryDeviceSupport", lambda nv, h: nv.nvmlGpmQueryDeviceSupport(h)),
)

GPU_PROBES: tuple[Probe, ...] = (
    *(_p(name, "gpu", call) for name, call in _COMMON),
    _p(
        "nvmlDeviceGetMigDeviceHandleByIndex(0)",
        "gpu",
        lambda nv, h: nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0),
    ),
    _p(
        "nvmlDeviceGetGpuInstanceProfileInfo(1_SLICE)",
        "gpu",
        lambda nv, h: nv.nvmlDeviceGetGpuInstanceProfileInfo(h, nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE),
    ),
    _p("nvmlGpmMetrics", "gpu", _gpm),
)

MIG_PROBES: tuple[Probe, ...] = (
    *(_p(name, "mig", call) for name, call in _COMMON),
    _p(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "mig",
        lambda nv, h: nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h),
    ),
    _p("nvmlGpmMigMetrics", "mig", _gpm_mig),
)
