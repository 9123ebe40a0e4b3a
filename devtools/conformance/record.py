"""Run the probes through pynvml and record what came back: shape, types, values or the error.

The record is plain JSON so a run on a borrowed GPU machine can be committed and replayed as a
regression test against the simulator later (`tests/data/real-<model>.json`).
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Iterable
from typing import Any

from gpulens.devtools.conformance.probes import GPU_PROBES, MIG_PROBES, SYSTEM_PROBES, Probe

RECORD_VERSION = 1
MAX_ITEMS = 4  # list items described in full; lengths are always recorded


def describe(value: Any, depth: int = 0) -> dict[str, Any]:
    """A JSON description of a pynvml return value: its type, shape and (bounded) value."""
    if depth > 6:
        return {"type": type(value).__name__}
    if value is None:
        return {"type": "None"}
    if isinstance(value, bool):
        return {"type": "bool", "value": value}
    if isinstance(value, int):
        return {"type": "int", "value": value}
    if isinstance(value, float):
        return {"type": "float", "value": None if math.isnan(value) else value, "nan": math.isnan(value)}
    if isinstance(value, str):
        return {"type": "str", "value": value[:200]}
    if isinstance(value, bytes):
        return {"type": "bytes", "value": value[:200].decode(errors="replace")}
    if isinstance(value, (list, tuple)):
        return {
            "type": type(value).__name__,
            "len": len(value),
            "items": [describe(item, depth + 1) for item in value[:MAX_ITEMS]],
        }
    if isinstance(value, dict):
        return {"type": "dict", "fields": {str(k): describe(v, depth + 1) for k, v in value.items()}}
    if isinstance(value, ctypes._SimpleCData):
        return {"type": f"ctypes.{type(value).__name__}", "value": value.value}
    if isinstance(value, ctypes.Structure):
        fields = {}
        for spec in value._fields_:
            name = spec[0]
            if name.startswith("_") or name in ("reserved", "metrics"):
                continue
            attr = getattr(value, name)
            fields[name] = (
                describe(attr, depth + 1)
                if not isinstance(attr, ctypes.Array)
                else {"type": "array", "len": len(attr)}
            )
        return {"type": f"struct.{type(value).__name__}", "fields": fields}
    if isinstance(value, ctypes._Pointer) or type(value).__name__.startswith("LP_"):
        return {"type": "handle", "null": not bool(value)}
    if hasattr(value, "__dict__"):  # nvmlFriendlyObject and similar attribute bags
        return {
            "type": type(value).__name__,
            "fields": {k: describe(v, depth + 1) for k, v in sorted(vars(value).items())},
        }
    return {"type": type(value).__name__, "repr": repr(value)[:200]}


def describe_error(exc: BaseException) -> dict[str, Any]:
    return {"error": type(exc).__name__, "code": getattr(exc, "value", None)}


def run_probe(nv: Any, probe: Probe, handle: Any) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        result = describe(probe.call(nv, handle))
    except Exception as exc:  # every outcome is data here, including library mismatches
        result = describe_error(exc)
    result["seconds"] = round(time.perf_counter() - started, 4)
    return result


def _mig_handles(nv: Any, handle: Any) -> Iterable[tuple[int, Any]]:
    try:
        count = nv.nvmlDeviceGetMaxMigDeviceCount(handle)
    except Exception:
        return
    for slot in range(count):
        try:
            yield slot, nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except Exception:  # empty slots answer NOT_FOUND
            continue


def record_node(nv: Any, label: str) -> dict[str, Any]:
    """Initialise NVML, run every probe on every GPU and MIG device, shut down. Never raises."""
    record: dict[str, Any] = {"version": RECORD_VERSION, "label": label, "system": {}, "gpus": []}
    try:
        nv.nvmlInit()
    except Exception as exc:
        record["init_error"] = describe_error(exc)
        return record
    try:
        record["system"] = {p.name: run_probe(nv, p, None) for p in SYSTEM_PROBES}
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            gpu: dict[str, Any] = {
                "index": index,
                "probes": {p.name: run_probe(nv, p, handle) for p in GPU_PROBES},
                "mig": [],
            }
            for slot, mig in _mig_handles(nv, handle):
                gpu["mig"].append(
                    {"slot": slot, "probes": {p.name: run_probe(nv, p, mig) for p in MIG_PROBES}}
                )
            record["gpus"].append(gpu)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception as exc:
            record["shutdown_error"] = describe_error(exc)
    return record
