"""The layout's rules (docs/architecture.md): what each part may import."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = (
    ROOT / "exporter",
    ROOT / "analyzer",
    ROOT / "dashboards",
    ROOT / "remediate",
    ROOT / "sim",
    ROOT / "mixin",
    ROOT / "src/gpulens/cli.py",
    ROOT / "src/gpulens/catalog.py",
    ROOT / "src/gpulens/migplacement.py",
    ROOT / "src/gpulens/httpclient.py",
    ROOT / "src/gpulens/promscope",
)


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def _python_files(root: Path) -> list[Path]:
    return [root] if root.suffix == ".py" else sorted(root.rglob("*.py"))


def test_shipped_code_never_imports_the_development_tools() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for root in SHIPPED
        for path in _python_files(root)
        for name in _imports(path)
        if name.startswith("gpulens.devtools")
    ]
    assert offenders == []


def test_the_cli_reaches_the_development_tools_by_name_only() -> None:
    """`gpulens bench` and `gpulens conformance` are looked up in COMMANDS, imported when asked for."""
    from gpulens.cli import COMMANDS

    assert {name for name, module in COMMANDS.items() if module.startswith("gpulens.devtools")} >= {
        "bench",
        "conformance",
    }


def test_every_path_the_architecture_page_names_exists() -> None:
    """Paths from the repository root (`exporter/...`, `sim/...`) named on the page are real."""
    tops = (
        "exporter/",
        "analyzer/",
        "dashboards/",
        "sim/",
        "remediate/",
        "mixin/",
        "devtools/",
        "alerts/",
        "src/",
        "deploy/",
        "docs/",
        "tests/",
        "tools/",
    )
    page = (ROOT / "docs/architecture.md").read_text()
    named = {token.strip("`,.:;()") for token in page.split() if token.startswith("`")}
    paths = [p for p in named if p.startswith(tops) and not any(c in p for c in "<*")]
    assert len(paths) > 20  # the page names its files
    assert [p for p in sorted(paths) if not (ROOT / p).exists()] == []
