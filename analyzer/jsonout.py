"""`json.dumps(obj, indent=1, default=str)`, byte for byte, without its pure-Python encoder.

With an indent the standard library encodes every token in Python (10,000 jobs: ~1.5 s, a
generator step per token); without one it uses its C encoder. A dict or list of plain values
(most of the analyzer's JSON: one dict per job) is indented by the C encoder itself, with the
newline and indent as its item separator (a string's newline is escaped, so the separator
cannot occur inside a value); only containers holding containers are walked here. orjson is
not a dependency and indents by two spaces only.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

_CONTAINERS = (dict, list, tuple)
_PLAIN = json.JSONEncoder(default=str)  # a scalar, or a dict key through {key: 0}


@cache
def _flat(separator: str) -> json.JSONEncoder:
    """The C encoder that writes a flat container's items one per line."""
    return json.JSONEncoder(separators=(separator, ": "), default=str)


def dumps(obj: Any, indent: int = 1) -> str:
    """The text `json.dumps(obj, indent=indent, default=str)` gives."""
    return _encode(obj, 0, " " * indent)


def _key(key: object) -> str:
    if isinstance(key, str):
        return json.encoder.encode_basestring_ascii(key)
    return _PLAIN.encode({key: 0})[1:-4]  # the stdlib's own conversion (floats, bools, None)


def _encode(obj: Any, level: int, unit: str) -> str:
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        inner = "\n" + unit * (level + 1)
        close = "\n" + unit * level + "}"
        flat = _flat("," + inner)
        if not any(isinstance(v, _CONTAINERS) for v in obj.values()):
            return "{" + inner + flat.encode(obj)[1:-1] + close
        parts: list[str] = []
        run: dict = {}  # consecutive plain items: one C call each run
        for key, value in obj.items():
            if isinstance(value, _CONTAINERS):
                if run:
                    parts.append(flat.encode(run)[1:-1])
                    run = {}
                parts.append(_key(key) + ": " + _encode(value, level + 1, unit))
            else:
                run[key] = value
        if run:
            parts.append(flat.encode(run)[1:-1])
        return "{" + inner + ("," + inner).join(parts) + close
    if isinstance(obj, list | tuple):
        if not obj:
            return "[]"
        inner = "\n" + unit * (level + 1)
        close = "\n" + unit * level + "]"
        if not any(isinstance(v, _CONTAINERS) for v in obj):
            return "[" + inner + _flat("," + inner).encode(list(obj))[1:-1] + close
        return "[" + inner + ("," + inner).join(_encode(v, level + 1, unit) for v in obj) + close
    return _PLAIN.encode(obj)
