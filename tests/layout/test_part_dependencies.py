"""Dependencies between the parts go one way (docs/architecture.md, "Rules that keep the layout honest").

Every .py file of every part is parsed and every import is counted, at module level or inside a
function (an import moved into a function still ties two parts together), and so is
`importlib.import_module("gpulens....")` with a literal name. Each imported `gpulens.*` name maps
to its part (`gpulens.<part>...`) or to the shared core (any other `gpulens.*`). The part graph
must have no cycle, every edge must point to a lower layer of LAYERS, and the core imports no
part: `gpulens.cli` names the subcommands' modules as strings in its COMMANDS table and imports
them only when asked for.
"""

from __future__ import annotations

import ast
import graphlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = "core"
PARTS = ("exporter", "analyzer", "dashboards", "sim", "remediate", "mixin", "devtools")
# the intended shape, lowest first: a part imports only from layers below its own. The order as
# docs/architecture.md writes it is `ORDER_LINE`; change both together.
LAYERS: tuple[tuple[str, ...], ...] = (
    (CORE,),
    ("exporter", "analyzer", "dashboards", "remediate"),
    ("sim", "mixin"),
    ("devtools",),
)
ORDER_LINE = " <- ".join(", ".join(layer) for layer in LAYERS)

Edges = dict[tuple[str, str], list[str]]  # (importer part, imported part) -> "file:line: name"


def _folder(part: str) -> Path:
    return ROOT / "src/gpulens" if part == CORE else ROOT / part


def _module_name(part: str, path: Path) -> str:
    """The installed name of `path` (`sim/nvml/lib.py` -> `gpulens.sim.nvml.lib`)."""
    rel = path.relative_to(_folder(part)).with_suffix("")
    pieces = [p for p in rel.parts if p != "__init__"]
    return ".".join(["gpulens"] + ([] if part == CORE else [part]) + pieces)


def _package(part: str, path: Path) -> str:
    """The package a file's relative imports start from."""
    name = _module_name(part, path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def import_statements(
    source: str, package: str, filename: str = "<source>"
) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names) of every import in `source`, relative ones resolved, wherever they are.

    `names` are what `from module import ...` takes (each may be a submodule); empty for `import
    module` and `importlib.import_module("module")`.
    """
    pieces = package.split(".")
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(pieces[: len(pieces) - node.level + 1] if node.level else [])
            module = ".".join(p for p in (base, node.module or "") if p)
            yield node.lineno, module, tuple(alias.name for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value, ()


def imports_in(source: str, package: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """(line, module name) of every import in `source`: each module, and each name taken from it."""
    for line, module, names in import_statements(source, package, filename):
        yield line, module
        for name in names:  # `from gpulens import sim` imports the part gpulens.sim
            yield line, f"{module}.{name}"


def part_of(name: str) -> str | None:
    """The part a module name belongs to; None outside gpulens."""
    pieces = name.split(".")
    if pieces[0] != "gpulens":
        return None
    return pieces[1] if len(pieces) > 1 and pieces[1] in PARTS else CORE


def part_edges() -> Edges:
    edges: Edges = defaultdict(list)
    for part in (CORE, *PARTS):
        for path in sorted(_folder(part).rglob("*.py")):
            where = path.relative_to(ROOT)
            seen: set[tuple[str, int]] = set()
            source = path.read_text(encoding="utf-8")
            for line, name in imports_in(source, _package(part, path), str(where)):
                target = part_of(name)
                if target is None or target == part or (target, line) in seen:
                    continue
                seen.add((target, line))
                edges[(part, target)].append(f"{where}:{line}: {name}")
    return dict(edges)


def cycles(edges: Edges) -> list[list[str]]:
    """The strongly connected groups of more than one part (each holds a loop), sorted."""
    nodes = sorted({n for edge in edges for n in edge})
    reach = {n: {b for (a, b) in edges if a == n} for n in nodes}
    changed = True
    while changed:  # transitive closure: a handful of parts
        changed = False
        for n in nodes:
            more = set().union(*(reach[m] for m in reach[n])) - reach[n]
            if more:
                reach[n] |= more
                changed = True
    groups = {tuple(sorted(m for m in nodes if m == n or (m in reach[n] and n in reach[m]))) for n in nodes}
    return sorted(list(g) for g in groups if len(g) > 1)


def _describe(edges: Edges, keys: list[tuple[str, str]]) -> str:
    return "\n".join(f"  {a} -> {b}:\n    " + "\n    ".join(edges[(a, b)]) for a, b in sorted(keys))


def _topological_order(edges: Edges) -> str:
    sorter = graphlib.TopologicalSorter({a: set() for a in (CORE, *PARTS)})
    for a, b in edges:
        sorter.add(a, b)  # b comes before a
    try:
        return " < ".join(sorter.static_order())
    except graphlib.CycleError as exc:
        return f"none (a cycle: {' -> '.join(exc.args[1])})"


def test_no_loop_between_parts() -> None:
    edges = part_edges()
    loops = cycles(edges)
    message = [
        f"loop between parts {group}; the imports that close it:\n"
        + _describe(edges, [(a, b) for (a, b) in edges if a in group and b in group])
        for group in loops
    ]
    assert loops == [], "\n".join(message) + f"\nintended order (lowest first): {ORDER_LINE}"


def test_every_import_between_parts_points_to_a_lower_layer() -> None:
    edges = part_edges()
    layer = {part: i for i, parts in enumerate(LAYERS) for part in parts}
    assert sorted(layer) == sorted((CORE, *PARTS))
    upward = [(a, b) for (a, b) in edges if layer[b] >= layer[a]]
    assert upward == [], (
        f"imports against the layer order {ORDER_LINE} (a part imports only from layers below):\n"
        + _describe(edges, upward)
        + f"\nthe graph's topological order now: {_topological_order(edges)}"
    )


def test_the_core_imports_no_part() -> None:
    """src/gpulens is below every part; gpulens.cli's COMMANDS names modules as strings only."""
    edges = part_edges()
    from_core = [(a, b) for (a, b) in edges if a == CORE]
    assert from_core == [], "the shared core imports parts:\n" + _describe(edges, from_core)


def test_the_cli_table_names_only_existing_part_modules() -> None:
    from gpulens.cli import COMMANDS

    for command, module in COMMANDS.items():
        part = part_of(module)
        assert part in PARTS, (command, module)
        relative = Path(*module.split(".")[2:])
        assert (ROOT / part / relative).with_suffix(".py").is_file() or (
            ROOT / part / relative / "__init__.py"
        ).is_file(), (command, module)


def test_the_architecture_page_states_the_order() -> None:
    assert f"`{ORDER_LINE}`" in (ROOT / "docs/architecture.md").read_text(encoding="utf-8")


def test_the_checks_count_imports_inside_functions_and_relative_ones() -> None:
    """The checker itself: what it reads as an import, and what it calls a loop."""
    source = (
        "import gpulens.analyzer.cli\n"
        "from gpulens import sim\n"
        "from . import render\n"
        "def f():\n"
        "    from ..mixin import rules\n"
        "    importlib.import_module('gpulens.dashboards.build')\n"
    )
    names = {name for _line, name in imports_in(source, "gpulens.exporter")}
    assert {"gpulens.analyzer.cli", "gpulens.sim", "gpulens.exporter.render", "gpulens.mixin.rules"} <= names
    assert "gpulens.dashboards.build" in names
    assert {part_of(n) for n in names} == {CORE, "analyzer", "sim", "exporter", "mixin", "dashboards"}
    assert _package("sim", ROOT / "sim/nvml/__init__.py") == "gpulens.sim.nvml"
    assert _package("sim", ROOT / "sim/nvml/lib.py") == "gpulens.sim.nvml"
    assert _module_name(CORE, ROOT / "src/gpulens/cli.py") == "gpulens.cli"
    loop: Edges = {("exporter", "sim"): ["x"], ("sim", "analyzer"): ["y"], ("analyzer", "exporter"): ["z"]}
    assert cycles(loop) == [["analyzer", "exporter", "sim"]]
    assert cycles({("sim", "exporter"): ["x"], ("mixin", "sim"): ["y"]}) == []
    assert _topological_order(loop).startswith("none")
