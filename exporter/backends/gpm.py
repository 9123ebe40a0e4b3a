"""Profiling-level activity from NVML GPM (GPU Performance Monitoring, Hopper and newer).

GPM reports averages between two samples. Instead of sleeping inside a sample, the profiler keeps
the previous GPM sample per device and per GPU instance and computes the metrics over the whole
sampling interval; the first sample of a device therefore has no values yet. Each metric's own
`nvmlReturn` is checked, NaN is treated as absent, and percentages become ratios 0..1. The
whole-GPU PCIe and NVLink rates (MiB/s) are kept as bytes per second.

Samples younger than 100 ms (GPM's internal refresh) are not used as a window: the older sample is
kept until the window is long enough.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import struct
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pynvml

from gpulens.exporter.backends.nvml import _ABSENT, _LOST, AreaError, GpuLostError, error_text
from gpulens.exporter.snapshot import MigSample, ProfilerAnswer, ProfilingSource

# snapshot PROFILING_KEYS -> NVML_GPM_METRIC_* id (all percentages)
GPM_METRICS: tuple[tuple[str, int], ...] = (
    ("graphics", 1),  # GRAPHICS_UTIL
    ("sm", 2),  # SM_UTIL
    ("sm_occupancy", 3),  # SM_OCCUPANCY
    ("tensor", 5),  # ANY_TENSOR_UTIL
    ("dram", 10),  # DRAM_BW_UTIL
    ("fp64", 11),
    ("fp32", 12),
    ("fp16", 13),
)
# whole-GPU rates in MiB/s, kept in the snapshot as bytes per second (the dcgm-exporter compatibility
# families DCGM_FI_PROF_PCIE_*_BYTES / NVLINK_*_BYTES read them; no native family does)
GPM_RATES: tuple[tuple[str, int], ...] = (
    ("pcie_tx_bytes_per_second", pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC),
    ("pcie_rx_bytes_per_second", pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC),
    ("nvlink_tx_bytes_per_second", pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC),
    ("nvlink_rx_bytes_per_second", pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC),
)
_RATE_KEYS = frozenset(key for key, _ in GPM_RATES)
MIB = 1024 * 1024
MIN_WINDOW_SECONDS = 0.1


# c_nvmlGpmMetric_t: metricId, nvmlReturn, value, then metricInfo (three name/unit pointers, not read)
_METRIC = struct.Struct("@IId24x")
if _METRIC.size != ctypes.sizeof(pynvml.c_nvmlGpmMetric_t):  # pragma: no cover - a layout change
    raise ImportError("c_nvmlGpmMetric_t no longer has the layout read here")
_SAMPLES = struct.Struct("@PP")  # sample1, sample2
_SAMPLES_OFFSET = pynvml.c_nvmlGpmMetricsGet_t.sample1.offset
_METRICS_OFFSET = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset
if pynvml.c_nvmlGpmMetricsGet_t.sample2.offset != _SAMPLES_OFFSET + ctypes.sizeof(ctypes.c_void_p):
    raise ImportError("c_nvmlGpmMetricsGet_t no longer has its two samples side by side")


class _Request:
    """An `nvmlGpmMetricsGet_t` as plain bytes: version, count and metric ids written once into a
    template, copied into the buffer before each call (outputs reset as in a fresh request), the two
    samples packed in, the answers unpacked with `struct`. pynvml's `_PrintableStructure` ran a hook
    on every field write and read: 64 requests and ~1,000 hooked attribute accesses per `large` cycle.
    One per thread and kind: a hung GPU's abandoned reader thread may still hold its own."""

    def __init__(self, wanted: tuple[tuple[str, int], ...]) -> None:
        self.wanted = wanted
        self.buffer = ctypes.create_string_buffer(ctypes.sizeof(pynvml.c_nvmlGpmMetricsGet_t))
        self.used = _METRICS_OFFSET + len(wanted) * _METRIC.size  # bytes NVML reads and writes
        header = pynvml.c_nvmlGpmMetricsGet_t()
        header.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        header.numMetrics = len(wanted)
        template = bytearray(bytes(header)[:_METRICS_OFFSET])
        for _, metric_id in wanted:
            template += _METRIC.pack(metric_id, 0, 0.0)
        self.template = bytes(template)

    def __call__(self, sample1: Any, sample2: Any) -> list[tuple[int, float]]:
        """[(nvmlReturn, value)] per wanted metric; raises NVMLError when the call fails."""
        buffer = self.buffer
        ctypes.memmove(buffer, self.template, self.used)
        _SAMPLES.pack_into(buffer, _SAMPLES_OFFSET, _address(sample1), _address(sample2))
        ret = pynvml._nvmlGetFunctionPointer("nvmlGpmMetricsGet")(buffer)
        if ret != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(ret)
        view = memoryview(buffer)[_METRICS_OFFSET : self.used]
        return [(ret, value) for _, ret, value in _METRIC.iter_unpack(view)]

    __name__ = "nvmlGpmMetricsGet"  # the NVML name in AreaError messages


def _address(sample: Any) -> int:
    """The address an `nvmlGpmSample_t` (a ctypes pointer) holds."""
    return ctypes.cast(sample, ctypes.c_void_p).value or 0


_REQUESTS = threading.local()


def _request(rates: bool) -> _Request:
    """This thread's metrics request, whole-GPU (with the PCIe/NVLink rates) or per GPU instance."""
    cache: dict[bool, _Request] = _REQUESTS.__dict__.setdefault("requests", {})
    made = cache.get(rates)
    if made is None:
        made = cache[rates] = _Request(GPM_METRICS + GPM_RATES if rates else GPM_METRICS)
    return made


class _Unsupported(Exception):
    """This device or instance cannot give a GPM sample (e.g. a MIG parent on some drivers)."""


def _gpm_call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if exc.value in _LOST:
            raise GpuLostError(error_text(exc)) from exc
        if exc.value in _ABSENT:
            raise _Unsupported(error_text(exc)) from exc
        raise AreaError(f"{getattr(fn, '__name__', fn)}: {error_text(exc)}") from exc


class GpmProfiler:
    """Keeps one previous GPM sample per (GPU index, GPU instance or None)."""

    source = ProfilingSource.GPM

    def __init__(
        self,
        clock: Callable[[], float],
        interval: float,
        logger: logging.Logger | None = None,
        rates: bool = True,
    ) -> None:
        self.clock = clock
        self.interval = interval
        # the whole-GPU PCIe/NVLink rates only feed the compatibility families: without them the
        # driver is not asked (on a real H200 nvmlGpmMetricsGet is the costliest call of a cycle,
        # ~6 ms of CPU for 12 metrics, computed inside libnvidia-ml)
        self.rates = rates
        self.log = logger or logging.getLogger("gpulens.exporter.gpm")
        self._supported: dict[int, bool] = {}
        self._previous: dict[tuple[int, int | None], tuple[Any, float]] = {}
        self._spare: dict[tuple[int, int | None], Any] = {}  # a free sample buffer per device
        self._lock = threading.Lock()

    def supported(self, index: int, handle: Any) -> bool:
        known = self._supported.get(index)
        if known is not None:
            return known
        try:
            support = pynvml.nvmlGpmQueryDeviceSupport(handle)
            ok = bool(support.isSupportedDevice)
        except pynvml.NVMLError as exc:
            if exc.value in _LOST:
                raise GpuLostError(error_text(exc)) from exc
            ok = False
        self._supported[index] = ok
        return ok

    def read(self, index: int, handle: Any, mig_instances: Sequence[MigSample]) -> ProfilerAnswer:
        """(source, whole-GPU values, {gpu_instance: values}); source NVML when GPM is unsupported."""
        if not self.supported(index, handle):
            return ProfilingSource.NVML, (), {}
        gpu_values = self._window((index, None), lambda s: pynvml.nvmlGpmSampleGet(handle, s))
        mig_values: dict[int, tuple[tuple[str, float], ...]] = {}
        present = {m.gpu_instance for m in mig_instances}
        for gi in sorted(present):
            mig_values[gi] = self._window((index, gi), partial(pynvml.nvmlGpmMigSampleGet, handle, gi))
        with self._lock:
            stale = [
                k
                for k in {*self._previous, *self._spare}
                if k[0] == index and k[1] is not None and k[1] not in present
            ]
        for key in stale:
            self._free(key)
        return self.source, gpu_values, mig_values

    def _window(
        self, key: tuple[int, int | None], take: Callable[[Any], Any]
    ) -> tuple[tuple[str, float], ...]:
        with self._lock:
            sample = self._spare.pop(key, None)  # the buffer of the window before last
        if sample is None:
            try:
                sample = _gpm_call(pynvml.nvmlGpmSampleAlloc)
            except _Unsupported:
                return ()
        try:
            _gpm_call(take, sample)
        except _Unsupported:
            pynvml.nvmlGpmSampleFree(sample)
            self._free(key)
            return ()  # this window only: the other instances and the parent still count
        except (AreaError, GpuLostError):
            pynvml.nvmlGpmSampleFree(sample)
            raise
        now = self.clock()  # the simulated clock when simulating, so history runs get windows too
        with self._lock:
            previous = self._previous.get(key)
        if previous is not None and now - previous[1] < MIN_WINDOW_SECONDS:
            with self._lock:  # too short a window: keep the older sample
                self._spare[key] = sample
            return ()
        values: tuple[tuple[str, float], ...] = ()
        if previous is not None:
            try:
                values = self._metrics(previous[0], sample, rates=self.rates and key[1] is None)
            except _Unsupported:
                values = ()
            except BaseException:
                self._free(key)
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlGpmSampleFree(sample)
                raise
        with self._lock:
            if previous is not None:  # two buffers per device, reused in turn: no alloc/free per sample
                self._spare[key] = previous[0]
            self._previous[key] = (sample, now)
        return values

    @staticmethod
    def _metrics(sample1: Any, sample2: Any, rates: bool = False) -> tuple[tuple[str, float], ...]:
        request = _request(rates)  # PCIe/NVLink rates: whole GPU only
        answers = _gpm_call(request, sample1, sample2)
        out: list[tuple[str, float]] = []
        for (key, _), (ret, value) in zip(request.wanted, answers, strict=True):
            if ret != pynvml.NVML_SUCCESS:
                if ret in _LOST:
                    raise GpuLostError("GPM metric: GPU is lost")
                if ret not in _ABSENT:
                    logging.getLogger("gpulens.exporter.gpm").debug("GPM metric %s: return %d", key, ret)
                continue
            if math.isnan(value):
                continue
            if key in _RATE_KEYS:
                out.append((key, max(0.0, value * MIB)))
            else:
                out.append((key, min(1.0, max(0.0, value / 100.0))))
        return tuple(out)

    def _free(self, key: tuple[int, int | None]) -> None:
        with self._lock:
            entry = self._previous.pop(key, None)
            spare = self._spare.pop(key, None)
        for buffer in (None if entry is None else entry[0], spare):
            if buffer is not None:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlGpmSampleFree(buffer)

    def forget(self, index: int) -> None:
        """Drop state of a GPU that was lost; support is probed again when it comes back."""
        self._supported.pop(index, None)
        with self._lock:
            keys = [k for k in {*self._previous, *self._spare} if k[0] == index]
        for key in keys:
            self._free(key)

    def close(self) -> None:
        with self._lock:
            keys = list({*self._previous, *self._spare})
        for key in keys:
            self._free(key)
        self._supported = {}
