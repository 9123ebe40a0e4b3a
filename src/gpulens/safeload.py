"""YAML and JSON parsing bounded in nesting and size, for every file a user hands gpulens.

`yaml.safe_load` composes recursively and `json.loads` decodes recursively: a document nested a
thousand deep ends in a RecursionError (and a 3,000-line traceback) instead of a parse error, and
YAML aliases can make a small file stand for an exponentially large tree ("billion laughs") that
any code walking it then takes forever over. Here both refuse such input *before* recursing,
with the ordinary exception type of each library, so the callers' existing handlers turn it into
their one-line error:

- `load_yaml`: `yaml.YAMLError` (a `MarkedYAMLError` with the line and column) when a node is
  nested deeper than `MAX_DEPTH`, naming the path of keys down to it (`jobs[0].env.a`), when
  the document, aliases expanded, holds more than `MAX_NODES` nodes, or when a number is written
  with more than `MAX_NUMBER_CHARS` characters (Python refuses to convert integers of more than
  4,300 digits with a ValueError, and far shorter ones overflow a float).
- `load_json`: `json.JSONDecodeError` (a ValueError) when the document is nested deeper than the
  decoder's recursion limit (about 1,000 levels) or holds an integer longer than `MAX_NUMBER_CHARS`.
- `read_text`: a user's file as text: `InputError` (a ValueError, one line: `FILE: not UTF-8 text
  (byte 0xff at offset 0, ...)`) for bytes that are not UTF-8 or a file over its byte bound.
  `load_yaml_file` and `load_json_file` read through it; `read_yaml_file` words each way a YAML
  file fails (unreadable, not text, not YAML) as that one `InputError` line, for the callers
  that need nothing but the line.

Pure-Python YAML costs about 25 µs and, composed, 0.5 to 1 KiB per node, so `MAX_NODES` (50,000,
about seven times the largest scenario shipped) keeps the largest accepted document near a second
and tens of MiB; `MAX_YAML_BYTES` bounds the rest (long scalars and comments, 0.5 s per MiB).
Composing checks every 256 nodes whether a daemon recorded SIGTERM (`gpulens.exits.check`), so a
stop is never held up by parsing.

No configuration gpulens reads is more than about ten levels deep; 64 leaves room for any
hand-written YAML file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent
from yaml.nodes import Node, ScalarNode

from gpulens import exits

MAX_DEPTH = 64
MAX_NODES = 50_000
MAX_NUMBER_CHARS = 100  # a 64-bit integer has 20 digits, a float's shortest repr at most 24 chars
MAX_YAML_BYTES = 1 << 20  # the largest shipped scenario is 43 KB
CHECK_EVERY = 256  # nodes composed between looks for a pending termination
_NUMBER_TAGS = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})


class NestingError(ComposerError):
    """A YAML document beyond a bound: nested too deeply, too large once aliases are expanded, or
    holding an absurdly long number."""


class InputError(ValueError):
    """A user's file that is not what gpulens reads (not UTF-8 text, too large); one line naming it."""


def _path(keys: list[object]) -> str:
    out = ""
    for key in keys:
        if key is None:  # a mapping key being composed: its own position is the path so far
            continue
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out if len(out) <= 80 else out[:77] + "..."


class _Mark:
    """`yaml.Mark` in a fifth of the memory (slots): every token, event and node holds two."""

    __slots__ = ("buffer", "column", "index", "line", "name", "pointer")

    def __init__(self, name: str, index: int, line: int, column: int, buffer: Any, pointer: Any) -> None:
        self.name, self.index, self.line, self.column = name, index, line, column
        self.buffer, self.pointer = buffer, pointer

    get_snippet = yaml.Mark.get_snippet
    __str__ = yaml.Mark.__str__


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts depth, (alias-expanded) nodes and number lengths while composing."""

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self._depth = 0
        self._keys: list[object] = []
        self._total = 0
        self._composed = 0
        self._sizes: dict[int, int] = {}  # id of an anchored node -> its size, aliases expanded

    def get_mark(self) -> Any:
        if self.stream is None:
            return _Mark(self.name, self.index, self.line, self.column, self.buffer, self.pointer)
        return _Mark(self.name, self.index, self.line, self.column, None, None)

    def _refuse(self, problem: str) -> NestingError:
        return NestingError(None, None, problem, self.peek_event().start_mark)

    def _count(self, n: int) -> None:
        self._total += n
        if self._total > MAX_NODES:
            raise self._refuse(
                f"more than {MAX_NODES} nodes once aliases are expanded (near {_path(self._keys)})"
            )

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if parent is not None:
            self._keys.append(index.value if isinstance(index, ScalarNode) else index)
        try:
            self._composed += 1
            if self._composed % CHECK_EVERY == 0:
                exits.check()
            event = self.peek_event()
            if isinstance(event, AliasEvent):
                if event.anchor in self.anchors:
                    self._count(self._sizes.get(id(self.anchors[event.anchor]), 1))
                return super().compose_node(parent, index)
            self._depth += 1
            if self._depth > MAX_DEPTH:
                where = _path(self._keys) or "the top level"
                line = event.start_mark.line + 1
                raise self._refuse(f"nested deeper than {MAX_DEPTH} levels at {where} (line {line})")
            anchor = getattr(event, "anchor", None)
            before = self._total
            node = super().compose_node(parent, index)
            self._depth -= 1
            if anchor is not None and node is not None:
                self._sizes[id(node)] = self._total - before + 1
            if (
                isinstance(node, ScalarNode)
                and node.tag in _NUMBER_TAGS
                and len(node.value) > MAX_NUMBER_CHARS
            ):
                where = _path(self._keys) or "the top level"
                raise NestingError(
                    None,
                    None,
                    f"with a number of {len(node.value)} characters at {where} "
                    f"(line {node.start_mark.line + 1}; at most {MAX_NUMBER_CHARS})",
                    node.start_mark,
                )
            self._count(1)
            return node
        finally:
            if parent is not None:
                self._keys.pop()


def load_yaml(text: str | bytes) -> Any:
    """`yaml.safe_load`, refusing documents nested deeper than MAX_DEPTH, larger than MAX_NODES or
    holding a number longer than MAX_NUMBER_CHARS."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _LongNumber(len(text))
    return int(text)


class _LongNumber(Exception):
    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length


def load_json(text: str | bytes) -> Any:
    """`json.loads`, with a document nested too deeply for the parser, or an integer longer than
    MAX_NUMBER_CHARS, as a `json.JSONDecodeError`.

    The C decoder guards its recursion (a clean RecursionError at about the interpreter's limit of
    1,000 levels, nothing unsafe before), so catching it costs nothing; a linear pre-scan of the
    brackets would bound the depth tighter but doubled the cost of a 23 MB Prometheus answer.
    """
    try:
        return json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        doc = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise json.JSONDecodeError("nested deeper than the parser's recursion limit", doc, 0) from None
    except _LongNumber as exc:
        doc = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise json.JSONDecodeError(
            f"a number of {exc.length} digits (at most {MAX_NUMBER_CHARS})", doc, _long_number_at(doc)
        ) from None


def _long_number_at(doc: str) -> int:
    """Where the first number longer than MAX_NUMBER_CHARS starts (only after one was found)."""
    import re

    found = re.search(rf"-?[0-9]{{{MAX_NUMBER_CHARS},}}", doc)
    return found.start() if found else 0


def _not_utf8(shown: str, data: bytes, exc: UnicodeDecodeError) -> InputError:
    hint = ""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(data) > 1 and b"\x00" in data[:2]):
        hint = ", which looks like UTF-16: save it as UTF-8"
    return InputError(f"{shown}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}{hint})")


def read_text(path: str | os.PathLike[str], max_bytes: int | None = None, shown: str | None = None) -> str:
    """A user's file as text. `InputError` (one line starting with `shown`, default the path) when
    it is not UTF-8 or holds more than `max_bytes`; OSError as raised, for the caller to word."""
    shown = str(path) if shown is None else shown
    with open(path, "rb") as handle:
        data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise InputError(f"{shown}: larger than {max_bytes:,} bytes, more than such a file ever needs")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8(shown, data, exc) from None


def load_yaml_file(path: str | Path, shown: str | None = None, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """`read_text` (at most `max_bytes`) then `load_yaml`: OSError, InputError or yaml.YAMLError."""
    return load_yaml(read_text(path, max_bytes, shown))


def read_yaml_file(
    path: str | Path,
    shown: str | None = None,
    max_bytes: int = MAX_YAML_BYTES,
    unreadable: str = "cannot read",
) -> Any:
    """`load_yaml_file`, every failure one `InputError` line starting with `shown` (default the
    path): `SHOWN: <unreadable>: <OS reason>`, the `read_text` line, or `SHOWN: not valid YAML: ...`
    with the parser's first line."""
    shown = str(path) if shown is None else shown
    try:
        return load_yaml_file(path, shown, max_bytes)
    except OSError as exc:
        raise InputError(f"{shown}: {unreadable}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise InputError(f"{shown}: not valid YAML: {str(exc).splitlines()[0]}") from exc


def load_json_file(path: str | Path, shown: str | None = None, max_bytes: int | None = None) -> Any:
    """`read_text` then `load_json`: OSError, InputError or json.JSONDecodeError (all but OSError
    are ValueErrors)."""
    return load_json(read_text(path, max_bytes, shown))
