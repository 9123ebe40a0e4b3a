"""The sampling cycle's hottest NVML calls made through ctypes directly, not through pynvml's wrappers.

Why: pynvml's process-list wrappers call the C function twice (size, then fill), allocate a
`_PrintableStructure` array and turn every entry into an `nvmlFriendlyObject` through
`__getattribute__` hooks: on the `large` node (~200 processes over 64 device and MIG handles, three
lists each) that was the biggest single cost of a sampling cycle. The C functions, their arguments
and the structure layouts are NVML's ABI, which the real `libnvidia-ml.so.1` and the simulated
drivers share; the function pointers come from pynvml (`_nvmlGetFunctionPointer`, the same cache its
own wrappers use), and a failing return raises pynvml's own `NVMLError`, so the backend's error
mapping (`nvml._call`) treats these exactly as it treats pynvml's calls.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterable
from typing import Any

import pynvml

NO_INSTANCE = 0xFFFFFFFF
_NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value

# c_nvmlProcessInfo_v2_t / _v3_t: pid, usedGpuMemory, gpuInstanceId, computeInstanceId (natively aligned)
_PROCESS = struct.Struct("@IQII")
if _PROCESS.size != ctypes.sizeof(pynvml.c_nvmlProcessInfo_v3_t):  # pragma: no cover - a layout change
    raise ImportError("c_nvmlProcessInfo_v3_t no longer has the (pid, memory, GI, CI) layout")

# (pid, used memory bytes or None, GPU instance or None, compute instance or None)
RawProcess = tuple[int, int | None, int | None, int | None]


class ProcessList:
    """One of NVML's process-list calls (`nvmlDevice<Get...>RunningProcesses_v3`), in one C call.

    The buffer is sized from the largest list seen so far (doubled plus slack, as pynvml sizes its
    second call), so a steady node answers in one call instead of pynvml's two; a list that grew
    past it gets INSUFFICIENT_SIZE with the needed count and is asked again with room for it.
    Entries are unpacked with one `struct.iter_unpack` over the filled part of the buffer.
    """

    def __init__(self, symbol: str, name: str, capacity: int = 16) -> None:
        self.symbol = symbol
        self.__name__ = name  # the NVML name in AreaError messages
        # shared by reader threads (an abandoned one may still run); a stale read only costs a retry
        self._capacity = capacity

    def __call__(self, handle: Any) -> list[RawProcess]:
        fn = pynvml._nvmlGetFunctionPointer(self.symbol)
        capacity = self._capacity
        for _ in range(4):  # the list may keep growing between the calls
            count = ctypes.c_uint(capacity)
            buffer = ctypes.create_string_buffer(capacity * _PROCESS.size)
            ret = fn(handle, ctypes.byref(count), buffer)
            if ret == pynvml.NVML_SUCCESS:
                used = min(count.value, capacity) * _PROCESS.size
                return [_raw(entry) for entry in _PROCESS.iter_unpack(memoryview(buffer)[:used])]
            if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                raise pynvml.NVMLError(ret)
            capacity = count.value * 2 + 5
            self._capacity = max(self._capacity, capacity)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)


def _raw(entry: tuple[int, int, int, int]) -> RawProcess:
    pid, memory, gi, ci = entry
    return (
        pid,
        None if memory == _NOT_AVAILABLE else memory,
        None if gi == NO_INSTANCE else gi,
        None if ci == NO_INSTANCE else ci,
    )


def process_lists() -> tuple[ProcessList, ProcessList, ProcessList]:
    """(compute, graphics, MPS) listers, one set per backend (each keeps its own buffer size)."""
    return (
        ProcessList("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses"),
        ProcessList("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses"),
        ProcessList("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses"),
    )


# nvmlFieldValue_t: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, then the value
# union (8 bytes, read below with the format of the member its valueType names)
_FIELD = struct.Struct("@IIqqII8x")
if _FIELD.size != ctypes.sizeof(pynvml.c_nvmlFieldValue_t):  # pragma: no cover - a layout change
    raise ImportError("c_nvmlFieldValue_t no longer has the layout read here")
_VALUE_OFFSET = pynvml.c_nvmlFieldValue_t.value.offset
# the same entry with its value union as an unsigned long long, for one unpack of a whole array
_FLAT_ENTRY = "IIqqIIQ"
_FLAT_FIELDS = len(_FLAT_ENTRY)
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
if struct.calcsize("@" + _FLAT_ENTRY * 2) != 2 * _FIELD.size:  # pragma: no cover - a layout change
    raise ImportError("c_nvmlFieldValue_t arrays no longer have the layout read here")
# nvmlValueType_t -> the native struct format of the union member holding it
_VALUE_FORMATS: dict[int, struct.Struct] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: struct.Struct("@d"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: struct.Struct("@I"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: struct.Struct("@L"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: struct.Struct("@Q"),
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: struct.Struct("@q"),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: struct.Struct("@i"),
    getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): struct.Struct("@H"),
}


class FieldRequest:
    """A fixed list of `nvmlDeviceGetFieldValues` requests, kept as the bytes of a request array.

    Each call copies the template into a fresh buffer (one `create_string_buffer`), makes the C call
    and unpacks the answers with `struct`: no ctypes structure is built or read attribute by
    attribute (a hundred entries per GPU and cycle, most of them NVLink's).
    """

    __name__ = "nvmlDeviceGetFieldValues"  # the NVML name in AreaError messages

    def __init__(self, requests: Iterable[int | tuple[int, int]]) -> None:
        self.keys: tuple[tuple[int, int], ...] = tuple(
            (r, 0) if isinstance(r, int) else (int(r[0]), int(r[1])) for r in requests
        )
        self._template = b"".join(_FIELD.pack(fid, scope, 0, 0, 0, 0) for fid, scope in self.keys)
        # the whole answer array at once, each value union read as unsigned long long
        self._flat = struct.Struct("@" + _FLAT_ENTRY * len(self.keys))

    def _fill(self, handle: Any) -> ctypes.Array[ctypes.c_char]:
        buffer = ctypes.create_string_buffer(self._template, len(self._template))
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        ret = fn(handle, ctypes.c_int32(len(self.keys)), buffer)
        if ret != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(ret)
        return buffer

    def __call__(
        self, handle: Any
    ) -> tuple[dict[tuple[int, int], float | int], list[tuple[tuple[int, int], int]]]:
        """({request: value} of the entries that succeeded with a value, [(request, nvmlReturn)] of
        those that failed). The common answer (every entry succeeded, all unsigned long long: the
        NVLink and PCIe counters) is read with one `struct` unpack of the whole array and no
        per-entry Python; anything else goes entry by entry (a NaN double counts as no value)."""
        if not self.keys:
            return {}, []
        buffer = self._fill(handle)
        flat = self._flat.unpack(buffer)
        if not any(flat[5::_FLAT_FIELDS]) and flat[4::_FLAT_FIELDS].count(_ULL) == len(self.keys):
            return dict(zip(self.keys, flat[6::_FLAT_FIELDS], strict=True)), []
        found: dict[tuple[int, int], float | int] = {}
        failed: list[tuple[tuple[int, int], int]] = []
        for key, ret, value in self._entries(buffer):
            if ret != pynvml.NVML_SUCCESS:
                failed.append((key, ret))
            elif value is not None:
                found[key] = value
        return found, failed

    def _entries(
        self, buffer: ctypes.Array[ctypes.c_char]
    ) -> list[tuple[tuple[int, int], int, float | int | None]]:
        out: list[tuple[tuple[int, int], int, float | int | None]] = []
        offset = _VALUE_OFFSET
        for key, entry in zip(self.keys, _FIELD.iter_unpack(buffer), strict=True):
            value: float | int | None = None
            entry_ret = entry[5]
            if entry_ret == pynvml.NVML_SUCCESS:
                member = _VALUE_FORMATS.get(entry[4])
                if member is not None:
                    value = member.unpack_from(buffer, offset)[0]
                    if value != value:  # NaN: no value
                        value = None
            out.append((key, entry_ret, value))
            offset += _FIELD.size
        return out
