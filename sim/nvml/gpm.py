"""GPM (GPU Performance Monitoring): Hopper and newer only.

Two samples taken some time apart give, through `nvmlGpmMetricsGet`, the average activity over
the interval between them: percentages 0..100 and bandwidths in MiB/s. The simulated node
answers with `SimNode.activity_between` over exactly that interval.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from dataclasses import dataclass

import pynvml

from gpulens.sim.nvml._core import (
    DEV,
    MIB,
    PTR,
    UINT,
    Context,
    NvmlFail,
    SymbolTable,
    Target,
    in_struct,
    out_ptr,
    out_uint,
)
from gpulens.sim.state import ActivityState

TABLE = SymbolTable()

G = pynvml


@dataclass
class GpmSample:
    """A sample buffer: which GPU (or GPU instance) it was taken on, and when."""

    gpu_index: int | None = None
    gpu_instance_id: int | None = None
    time: float | None = None


def _percent(attribute: str) -> Callable[[ActivityState, Target], float]:
    return lambda a, t: 100.0 * getattr(a, attribute)


def _mib(attribute: str, links: bool = False) -> Callable[[ActivityState, Target], float]:
    return lambda a, t: getattr(a, attribute) / MIB


def _per_link(attribute: str, link: int) -> Callable[[ActivityState, Target], float]:
    def value(a: ActivityState, t: Target) -> float:
        active = [s for s in t.state.nvlinks if s.active]
        if not any(s.link == link for s in active):
            raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return float(getattr(a, attribute)) / MIB / len(active)

    return value


def _zero(a: ActivityState, t: Target) -> float:
    return 0.0


# metric id -> (short name, unit, value); idle media engines read 0
METRICS: dict[int, tuple[str, str, Callable[[ActivityState, Target], float]]] = {
    G.NVML_GPM_METRIC_GRAPHICS_UTIL: ("gr_util", "%", _percent("graphics")),
    G.NVML_GPM_METRIC_SM_UTIL: ("sm_util", "%", _percent("sm")),
    G.NVML_GPM_METRIC_SM_OCCUPANCY: ("sm_occupancy", "%", _percent("sm_occupancy")),
    G.NVML_GPM_METRIC_INTEGER_UTIL: ("integer_util", "%", _percent("integer")),
    G.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("any_tensor_util", "%", _percent("tensor")),
    G.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: ("dfma_tensor_util", "%", _zero),
    G.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: ("hmma_tensor_util", "%", _percent("tensor")),
    G.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: ("imma_tensor_util", "%", _zero),
    G.NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram_bw_util", "%", _percent("dram")),
    G.NVML_GPM_METRIC_FP64_UTIL: ("fp64_util", "%", _percent("fp64")),
    G.NVML_GPM_METRIC_FP32_UTIL: ("fp32_util", "%", _percent("fp32")),
    G.NVML_GPM_METRIC_FP16_UTIL: ("fp16_util", "%", _percent("fp16")),
    G.NVML_GPM_METRIC_PCIE_TX_PER_SEC: ("pcie_tx", "MiB/sec", _mib("pcie_tx_bytes_per_second")),
    G.NVML_GPM_METRIC_PCIE_RX_PER_SEC: ("pcie_rx", "MiB/sec", _mib("pcie_rx_bytes_per_second")),
    G.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: (
        "nvlink_total_rx",
        "MiB/sec",
        _mib("nvlink_rx_bytes_per_second"),
    ),
    G.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: (
        "nvlink_total_tx",
        "MiB/sec",
        _mib("nvlink_tx_bytes_per_second"),
    ),
}
for _link in range(18):
    for _direction in ("RX", "TX"):
        _id = getattr(G, f"NVML_GPM_METRIC_NVLINK_L{_link}_{_direction}_PER_SEC")
        _attr = f"nvlink_{_direction.lower()}_bytes_per_second"
        METRICS[_id] = (f"nvlink_l{_link}_{_direction.lower()}", "MiB/sec", _per_link(_attr, _link))
for _name in dir(G):  # the media engines: NVDEC, NVJPG, NVOFA
    if _name.startswith(("NVML_GPM_METRIC_NVDEC_", "NVML_GPM_METRIC_NVJPG_", "NVML_GPM_METRIC_NVOFA_")):
        METRICS[getattr(G, _name)] = (_name[len("NVML_GPM_METRIC_") :].lower(), "%", _zero)


class _MetricInfo(ctypes.Structure):
    """`c_metricInfo_t` with the strings as raw addresses (the callee hands out its own copies)."""

    _fields_ = [("shortName", ctypes.c_void_p), ("longName", ctypes.c_void_p), ("unit", ctypes.c_void_p)]


class _Metric(ctypes.Structure):
    """`c_nvmlGpmMetric_t`'s layout as a plain ctypes struct: pynvml's `_PrintableStructure`
    intercepts every attribute access, which made filling the request the bulk of this call."""

    _fields_ = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_double),
        ("metricInfo", _MetricInfo),
    ]


assert ctypes.sizeof(_Metric) == ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)
_METRICS_OFFSET = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset


def gpm_supported(target: Target) -> bool:
    return target.identity.model.gpm_supported


@TABLE.define("nvmlGpmQueryDeviceSupport", DEV, PTR)
def query_device_support(ctx: Context, handle: int, out: int) -> None:
    support = in_struct(out, pynvml.c_nvmlGpmSupport_t)
    if support.version != pynvml.NVML_GPM_SUPPORT_VERSION:
        raise NvmlFail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    support.isSupportedDevice = int(gpm_supported(ctx.device(handle)))


@TABLE.define("nvmlGpmQueryIfStreamingEnabled", DEV, PTR)
def query_streaming(ctx: Context, handle: int, out: int) -> None:
    target = ctx.device(handle)
    if not gpm_supported(target):
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    out_uint(out, int(target.index in ctx.gpm_streaming))


@TABLE.define("nvmlGpmSetStreamingEnabled", DEV, UINT)
def set_streaming(ctx: Context, handle: int, state: int) -> None:
    """Streaming only changes how the driver buffers samples; the values served are the same."""
    target = ctx.device(handle)
    if not gpm_supported(target) or target.is_mig:
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if state not in (0, 1):
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    with ctx.lock:
        (ctx.gpm_streaming.add if state else ctx.gpm_streaming.discard)(target.index)


@TABLE.define("nvmlGpmSampleAlloc", PTR)
def sample_alloc(ctx: Context, out: int) -> None:
    out_ptr(out, ctx.new_object(GpmSample()))


@TABLE.define("nvmlGpmSampleFree", PTR)
def sample_free(ctx: Context, address: int) -> None:
    ctx.free_object(address, GpmSample)


def _take(ctx: Context, target: Target, gpu_instance_id: int | None, address: int) -> None:
    if not gpm_supported(target):
        raise NvmlFail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    sample = ctx.get_object(address, GpmSample)
    with ctx.lock:
        sample.gpu_index, sample.gpu_instance_id, sample.time = target.index, gpu_instance_id, ctx.now()


@TABLE.define("nvmlGpmSampleGet", DEV, PTR)
def sample_get(ctx: Context, handle: int, address: int) -> None:
    """On a MIG handle the sample covers that GPU instance."""
    target = ctx.device(handle)
    _take(ctx, target, target.mig.gpu_instance_id if target.mig else None, address)


@TABLE.define("nvmlGpmMigSampleGet", DEV, UINT, PTR)
def mig_sample_get(ctx: Context, handle: int, gpu_instance_id: int, address: int) -> None:
    target = ctx.device(handle)
    if target.is_mig or not target.mig_enabled:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if not any(m.gpu_instance_id == gpu_instance_id for m in target.state.mig_instances):
        raise NvmlFail(pynvml.NVML_ERROR_NOT_FOUND)
    _take(ctx, target, gpu_instance_id, address)


@TABLE.define("nvmlGpmMetricsGet", PTR)
def metrics_get(ctx: Context, request_ptr: int) -> None:
    request = in_struct(request_ptr, pynvml.c_nvmlGpmMetricsGet_t)
    if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
        raise NvmlFail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    if request.numMetrics > pynvml.NVML_GPM_METRIC_MAX:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    first = ctx.get_object(ctypes.cast(request.sample1, ctypes.c_void_p).value, GpmSample)
    second = ctx.get_object(ctypes.cast(request.sample2, ctypes.c_void_p).value, GpmSample)
    if first.time is None or second.time is None:
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if (first.gpu_index, first.gpu_instance_id) != (second.gpu_index, second.gpu_instance_id):
        raise NvmlFail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    assert first.gpu_index is not None
    target = ctx.device(ctx.gpu_handle(first.gpu_index))
    start, end = sorted((first.time, second.time))
    activity = ctx.node.activity_between(first.gpu_index, first.gpu_instance_id, start, end)
    count = request.numMetrics
    metrics = (_Metric * count).from_address(request_ptr + _METRICS_OFFSET)
    for metric in metrics:
        known = METRICS.get(metric.metricId)
        if known is None:
            metric.nvmlReturn, metric.value = pynvml.NVML_ERROR_NOT_SUPPORTED, math.nan
            continue
        short, unit, compute = known
        try:
            metric.value = compute(activity, target) if end > start else math.nan
            metric.nvmlReturn = pynvml.NVML_SUCCESS
        except NvmlFail as fail:
            metric.nvmlReturn, metric.value = fail.code, math.nan
        info = metric.metricInfo
        info.shortName, info.longName, info.unit = _info_strings(ctx, metric.metricId, short, unit)


def _info_strings(ctx: Context, metric_id: int, short: str, unit: str) -> tuple[int, int, int]:
    """Addresses of the metric's short name, long name and unit (made once per library)."""
    key = f"gpm:{metric_id}:info"
    cached = ctx.addresses.get(key)
    if cached is None:
        cached = ctx.addresses[key] = (
            ctx.c_string(f"gpm:{metric_id}:short", short),
            ctx.c_string(f"gpm:{metric_id}:long", short.replace("_", " ")),
            ctx.c_string(f"gpm:{metric_id}:unit", unit),
        )
    return cached
