"""No import loop between modules, inside a part too (docs/architecture.md, issue 33 item 4).

test_part_dependencies.py keeps the parts one-way; this keeps every module one-way. The graph is
built from the source of the whole package (every part and the core), counting each import
wherever it is (module level, inside a function, under `if TYPE_CHECKING:`, relative, or
`importlib.import_module` with a literal name): an import moved into a function still ties two
modules together, it only hides the loop from Python until the function runs. A loop is a
strongly connected group of more than one module; the test prints one cycle through each group
and the imports that make it, so the fix (moving the shared code to a module both can import)
starts from the message.
"""

from __future__ import annotations

import itertools
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.layout.test_part_dependencies import (
    CORE,
    PARTS,
    ROOT,
    _folder,
    _module_name,
    _package,
    import_statements,
)

Graph = dict[str, dict[str, list[str]]]  # importer -> imported -> ["file:line", ...]


@dataclass(frozen=True)
class Module:
    """One module of the package: its installed name, the package its relative imports start
    from, and its file."""

    name: str
    package: str
    path: Path


def package_modules() -> dict[str, Module]:
    """Every module of the package (each part and the core), by installed name."""
    modules = (
        Module(_module_name(part, path), _package(part, path), path)
        for part in (CORE, *PARTS)
        for path in sorted(_folder(part).rglob("*.py"))
    )
    return {m.name: m for m in modules}


def _resolve(name: str, known: Container[str]) -> str | None:
    """The module an imported name lands in: its longest known prefix (`gpulens.a.f` -> `gpulens.a`)."""
    pieces = name.split(".")
    for end in range(len(pieces), 0, -1):
        candidate = ".".join(pieces[:end])
        if candidate in known:
            return candidate
    return None


def imported_modules(source: str, package: str, known: Container[str]) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of a known module in `source`, wherever the import is.

    `from pkg import sub` imports the submodule `pkg.sub`; `from mod import func` the module `mod`.
    """
    for line, imported, names in import_statements(source, package):
        wanted = [f"{imported}.{n}" if f"{imported}.{n}" in known else imported for n in names]
        for name in wanted or [imported]:
            target = _resolve(name, known)
            if target is not None:
                yield line, target


def module_graph() -> Graph:
    """Every import from one module of the package to another, with where it is written."""
    modules = package_modules()
    graph: Graph = {}
    for module in modules.values():
        where = module.path.relative_to(ROOT)
        source = module.path.read_text(encoding="utf-8")
        for line, target in imported_modules(source, module.package, modules):
            if target == module.name:  # `from gpulens.pkg import name` in pkg/__init__.py: no edge
                continue
            places = graph.setdefault(module.name, {}).setdefault(target, [])
            if f"{where}:{line}" not in places:
                places.append(f"{where}:{line}")
    return graph


def loops(graph: Graph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, {})):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def one_cycle(graph: Graph, group: list[str]) -> list[str]:
    """A shortest cycle through the group's first module, staying inside the group: [a, b, ..., a]."""
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for nxt in sorted(graph.get(node, {})):
                if nxt not in members or nxt in came_from:
                    continue
                came_from[nxt] = node
                if nxt == start:
                    path = [start]
                    while path[-1] != start or len(path) == 1:
                        path.append(came_from[path[-1]])
                    return path[::-1]
                following.append(nxt)
        frontier = following
    raise AssertionError(f"{group} is not strongly connected")


def _edge(graph: Graph, a: str, b: str) -> str:
    return f"    {a} -> {b}  ({', '.join(graph[a][b])})"


def describe(graph: Graph, group: list[str]) -> str:
    """One cycle through the group, then every import between its modules (all of them tie it)."""
    cycle = "\n".join(_edge(graph, a, b) for a, b in itertools.pairwise(one_cycle(graph, group)))
    inside = "\n".join(_edge(graph, a, b) for a in group for b in sorted(graph.get(a, {})) if b in group)
    return (
        f"  loop among {len(group)} modules ({', '.join(group)}); one cycle:\n{cycle}\n"
        f"  every import inside the group:\n{inside}"
    )


def test_no_import_loop_between_modules() -> None:
    graph = module_graph()
    found = loops(graph)
    assert found == [], (
        "import loops between modules (move what both need into a module that imports neither; "
        "an import inside a function does not break a loop):\n" + "\n".join(describe(graph, g) for g in found)
    )


def test_the_graph_reads_the_package() -> None:
    """Function-level, relative and `from package import submodule` imports all become edges."""
    graph = module_graph()
    # analyzer/cli.py imports the trace importers inside a function
    assert "gpulens.analyzer.importers" in graph["gpulens.analyzer.cli"]
    # `from gpulens.exporter.collectors import clocks` is an edge to the submodule
    assert "gpulens.exporter.collectors.clocks" in graph["gpulens.exporter.collectors"]
    # `from gpulens.exporter.collectors.base import CollectorSpec` is an edge to the module
    assert "gpulens.exporter.collectors.base" in graph["gpulens.exporter.collectors"]


def test_imports_inside_functions_and_relative_ones_are_edges() -> None:
    known = {"gpulens.x", "gpulens.x.a", "gpulens.x.b", "gpulens.x.c", "gpulens.y"}
    source = (
        "from gpulens.x.a import helper\n"
        "from . import b\n"
        "def f():\n"
        "    from .c import thing\n"
        "    import gpulens.y\n"
        "    import json\n"
    )
    found = list(imported_modules(source, "gpulens.x", known))
    assert found == [(1, "gpulens.x.a"), (2, "gpulens.x.b"), (4, "gpulens.x.c"), (5, "gpulens.y")]


def test_a_planted_loop_is_found_and_printed() -> None:
    graph: Graph = {
        "m.a": {"m.b": ["a.py:3"]},
        "m.b": {"m.c": ["b.py:9"], "m.d": ["b.py:10"]},
        "m.c": {"m.a": ["c.py:20"]},  # inside a function, say: still a loop
        "m.d": {"m.e": ["d.py:1"]},
        "m.e": {"m.d": ["e.py:2"]},
        "m.f": {"m.a": ["f.py:1"]},
    }
    assert loops(graph) == [["m.a", "m.b", "m.c"], ["m.d", "m.e"]]
    assert one_cycle(graph, ["m.a", "m.b", "m.c"]) == ["m.a", "m.b", "m.c", "m.a"]
    assert "m.c -> m.a  (c.py:20)" in describe(graph, ["m.a", "m.b", "m.c"])


def test_a_one_way_graph_has_no_loop() -> None:
    graph: Graph = {"m.a": {"m.b": ["a.py:1"], "m.c": ["a.py:2"]}, "m.b": {"m.c": ["b.py:1"]}}
    assert loops(graph) == []
