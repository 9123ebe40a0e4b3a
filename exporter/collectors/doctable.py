"""docs/metrics.md's family tables, generated from the collectors' specs.

Each table in the page sits between `<!-- families: <collector> ... ; ... -->` and
`<!-- end of families -->`; tests/exporter/test_metric_docs.py checks (and with
GPULENS_UPDATE_GOLDEN=1 rewrites) every such block, so a family's name, type, labels, unit and
source are written once, beside the code that emits it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from gpulens.exporter.collectors import REGISTRY
from gpulens.exporter.collectors.base import GPU_LABELS, FamilySpec

HEADER = (
    "| family | type | labels beyond gpu, uuid | unit | source | MIG behaviour | collector |\n"
    "|---|---|---|---|---|---|---|\n"
)
# a generated block: the collectors it lists, then the table up to its end marker
BLOCK = re.compile(r"(<!-- families: ([a-z_ ]+);[^\n]*-->\n)(.*?)(<!-- end of families -->)", re.S)


class DocTableError(ValueError):
    """A marker naming no collector, or one without family specs; `str()` is one line."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _labels(spec: FamilySpec[Any]) -> str:
    if spec.label_doc:
        return spec.label_doc
    return ", ".join(name for name in spec.labels if name not in GPU_LABELS)


def row(spec: FamilySpec[Any], collector: str) -> str:
    """One family's table row (a `|` inside a cell escaped, an empty cell as `| |`)."""
    cells = (spec.name, spec.kind.value, _labels(spec), spec.unit or "", spec.source, spec.mig, collector)
    return "|" + "|".join(f" {_cell(c)} " if c else " " for c in cells) + "|\n"


def family_table(collectors: Iterable[str]) -> str:
    """The Markdown table of the named collectors' families, in render order."""
    rows: list[str] = []
    for name in collectors:
        spec = REGISTRY.get(name)
        if spec is None or not spec.families:
            raise DocTableError(f"docs/metrics.md: marker names {name!r}, not a collector with family specs")
        label = name if spec.default_enabled else f"{name} (off by default)"
        rows += (row(family, label) for family in spec.families)
    return HEADER + "".join(rows)


def regenerate(text: str) -> str:
    """`text` (docs/metrics.md) with every generated block's table written afresh."""
    return BLOCK.sub(lambda m: m.group(1) + family_table(m.group(2).split()) + m.group(4), text)
