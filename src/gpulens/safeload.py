"""YAML and JSON parsing bounded in nesting and size, for every file a user hands gpulens.

`yaml.safe_load` composes recursively and `json.loads` decodes recursively: a document nested a
thousand deep ends in a RecursionError (and a 3,000-line traceback) instead of a parse error, and
YAML aliases can make a small file stand for an exponentially large tree ("billion laughs") that
any code walking it then takes forever over. Here both refuse such input *before* recursing,
with the ordinary exception type of each library, so the callers' existing handlers turn it into
their one-line error:

- `load_yaml`: `yaml.YAMLError` (a `MarkedYAMLError` with the line and column) when a node is
  nested deeper than `MAX_DEPTH`, naming the path of keys down to it (`jobs[0].env.a`), or when
  the document, aliases expanded, holds more than `MAX_NODES` nodes.
- `load_json`: `json.JSONDecodeError` (a ValueError) when the document is nested deeper than the
  decoder's recursion limit (about 1,000 levels).

No configuration gpulens reads is more than about ten levels deep; 64 leaves room for any
hand-written YAML file.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent
from yaml.nodes import Node, ScalarNode

MAX_DEPTH = 64
MAX_NODES = 1_000_000


class NestingError(ComposerError):
    """A YAML document nested too deeply or too large once aliases are expanded."""


def _path(keys: list[object]) -> str:
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out if len(out) <= 80 else out[:77] + "..."


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts depth and (alias-expanded) nodes while composing."""

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self._depth = 0
        self._keys: list[object] = []
        self._total = 0
        self._sizes: dict[int, int] = {}

    def _count(self, n: int) -> None:
        self._total += n
        if self._total > MAX_NODES:
            mark = self.peek_event().start_mark
            raise NestingError(
                None,
                None,
                f"more than {MAX_NODES} nodes once aliases are expanded (near {_path(self._keys)})",
                mark,
            )

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if parent is not None:
            self._keys.append(index.value if isinstance(index, ScalarNode) else index)
        try:
            if self.check_event(AliasEvent):
                anchor = self.peek_event().anchor
                if anchor in self.anchors:
                    self._count(self._sizes.get(id(self.anchors[anchor]), 1))
                return super().compose_node(parent, index)
            self._depth += 1
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                where = _path(self._keys) or "the top level"
                raise NestingError(
                    None,
                    None,
                    f"nested deeper than {MAX_DEPTH} levels at {where} (line {mark.line + 1})",
                    mark,
                )
            before = self._total
            node = super().compose_node(parent, index)
            self._depth -= 1
            size = self._total - before + 1
            if node is not None:
                self._sizes[id(node)] = size
            self._count(1)
            return node
        finally:
            if parent is not None:
                self._keys.pop()


def load_yaml(text: str | bytes) -> Any:
    """`yaml.safe_load`, refusing documents nested deeper than MAX_DEPTH or larger than MAX_NODES."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_json(text: str | bytes) -> Any:
    """`json.loads`, with a document nested too deeply for the parser as a `json.JSONDecodeError`.

    The C decoder guards its recursion (a clean RecursionError at about the interpreter's limit of
    1,000 levels, nothing unsafe before), so catching it costs nothing; a linear pre-scan of the
    brackets would bound the depth tighter but doubled the cost of a 23 MB Prometheus answer.
    """
    try:
        return json.loads(text)
    except RecursionError:
        doc = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise json.JSONDecodeError("nested deeper than the parser's recursion limit", doc, 0) from None
