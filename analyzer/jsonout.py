"""The analyzer's JSON text (`recommend/profile --format json`), written by orjson.

A week of 10,000 jobs is ~30 MB of JSON: the standard library's encoder takes ~0.9 s for it even
through its C path (a float's repr each), orjson (Rust, well kept, an `[analyzer]` dependency)
~0.09 s. The text is indented by two spaces (orjson's one indent). Non-finite floats become
`null`, as `pipeline.jsonable` already makes them, so the output is always valid JSON; a type
JSON has no form for (Decimal, datetime, a dataclass) is written as its `str()`, as before.
orjson refuses integers past 64 bits: such a value (none of the analyzer's own) goes through the
standard library instead, with the same rules.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

OPTIONS = (
    orjson.OPT_INDENT_2
    | orjson.OPT_NON_STR_KEYS  # keys as json.dumps writes them: 1 -> "1", None -> "null"
    | orjson.OPT_SERIALIZE_NUMPY  # numpy scalars and arrays as numbers, never as their str()
    | orjson.OPT_PASSTHROUGH_DATETIME  # through `default=str`, as json.dumps(default=str) did
    | orjson.OPT_PASSTHROUGH_DATACLASS
)


def dumps(obj: Any) -> str:
    """`obj` as indented JSON text (NaN and infinities as null, unknown types as their str())."""
    try:
        return orjson.dumps(obj, default=str, option=OPTIONS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(_finite(obj), indent=2, default=str, allow_nan=False)


def _finite(obj: Any) -> Any:
    """`obj` with every non-finite float as None (the standard library writes them as NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj
