"""Every C symbol the installed pynvml's covered wrappers look up exists in the simulator.

The wrappers are listed once, here. The symbols they need are read from pynvml's own source
(`_nvmlGetFunctionPointer("...")` in the wrapper and in any pynvml function it calls), so a new
nvidia-ml-py that switches a wrapper to a new `_vN` symbol fails this test instead of silently
raising FunctionNotFound at run time.
"""

from __future__ import annotations

import ast
import inspect

import pynvml
import pytest

from gpulens.sim.nvml import all_symbols

COVERED_WRAPPERS = [
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlSystemGetProcessName",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetHandleBySerial",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetBoardPartNumber",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetNumGpuCores",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetPowerManagementMode",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetMaxCustomerBoostClock",
    "nvmlDeviceGetClock",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetNumFans",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetPowerState",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetDisplayMode",
    "nvmlDeviceGetDisplayActive",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetPcieSpeed",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkVersion",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetDefaultEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetMemoryErrorCounter",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRemappedRows_v2",
    "nvmlEventSetCreate",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetAccountingMode",
    "nvmlDeviceGetAccountingBufferSize",
    "nvmlDeviceGetAccountingPids",
    "nvmlDeviceGetAccountingStats",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetAttributes",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmQueryIfStreamingEnabled",
    "nvmlGpmSetStreamingEnabled",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
]

# symbols nvitop looks up through _nvmlGetFunctionPointer itself, outside pynvml's wrappers
NVITOP_DIRECT = ["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMemoryInfo_v2"]


def _pynvml_functions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(pynvml))
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def needed_symbols(
    wrapper: str, functions: dict[str, ast.FunctionDef], seen: set[str] | None = None
) -> set[str]:
    """C symbols `wrapper` looks up, directly or through other pynvml functions it calls."""
    seen = set() if seen is None else seen
    if wrapper in seen:
        return set()
    seen.add(wrapper)
    symbols: set[str] = set()
    for node in ast.walk(functions[wrapper]):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "_nvmlGetFunctionPointer" and node.args:
            if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                symbols.add(node.args[0].value)
        elif node.func.id in functions and node.func.id.startswith("nvml"):
            symbols |= needed_symbols(node.func.id, functions, seen)
    return symbols


FUNCTIONS = _pynvml_functions()
PROVIDED = {symbol.name for symbol in all_symbols()}


def test_every_listed_wrapper_exists_in_the_installed_pynvml() -> None:
    assert [w for w in COVERED_WRAPPERS if w not in FUNCTIONS] == []


@pytest.mark.parametrize("wrapper", COVERED_WRAPPERS)
def test_symbols_of_covered_wrapper_exist_in_the_simulator(wrapper: str) -> None:
    needed = needed_symbols(wrapper, FUNCTIONS)
    assert needed, f"{wrapper} looks up no symbol: the source parser is broken"
    assert sorted(needed - PROVIDED) == []


def test_symbols_nvitop_fetches_directly_exist() -> None:
    assert sorted(set(NVITOP_DIRECT) - PROVIDED) == []


def test_the_parser_sees_versioned_symbols() -> None:
    assert needed_symbols("nvmlDeviceGetComputeRunningProcesses", FUNCTIONS) == {
        "nvmlDeviceGetComputeRunningProcesses_v3"
    }
    assert needed_symbols("nvmlDeviceGetMemoryInfo", FUNCTIONS) == {
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
    }


def test_the_library_exports_exactly_its_declared_symbols(sim_lib) -> None:
    assert set(sim_lib.symbol_names()) == PROVIDED
    assert all(callable(getattr(sim_lib, name)) for name in PROVIDED)
    assert not hasattr(sim_lib, "nvmlDeviceGetVgpuMetadata")  # absent -> FunctionNotFound in pynvml


@pytest.fixture
def sim_lib():
    from gpulens.sim.nvml import SimLib
    from tests.sim.static_node import example_node

    return SimLib(example_node())
