"""docs/metrics.md's family tables are the ones generated from the collectors' specs.

Regenerate after changing a family: `GPULENS_UPDATE_GOLDEN=1 pytest tests/exporter/test_metric_docs.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpulens.exporter.collectors import REGISTRY, SWITCHABLE
from gpulens.exporter.collectors.base import FamilySpec, Kind
from gpulens.exporter.collectors.doctable import BLOCK, DocTableError, family_table, regenerate, row

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_the_docs_family_tables_are_generated_from_the_specs() -> None:
    text = DOC.read_text()
    assert BLOCK.search(text), "docs/metrics.md lost its family table markers"
    fresh = regenerate(text)
    if os.environ.get("GPULENS_UPDATE_GOLDEN") and fresh != text:
        DOC.write_text(fresh)
        return
    assert fresh == text, "regenerate: GPULENS_UPDATE_GOLDEN=1 pytest tests/exporter/test_metric_docs.py"


def test_every_native_collector_has_a_generated_table() -> None:
    listed = {name for match in BLOCK.finditer(DOC.read_text()) for name in match.group(2).split()}
    assert listed == {name for name, spec in SWITCHABLE.items() if spec.families}


def test_every_native_collector_declares_its_families() -> None:
    assert [name for name, spec in SWITCHABLE.items() if not spec.families] == []


def test_family_names_are_declared_once() -> None:
    names = [f.name for spec in REGISTRY.values() for f in spec.families]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_a_marker_naming_an_unknown_collector_is_a_one_line_error() -> None:
    with pytest.raises(DocTableError, match=r"docs/metrics.md: marker names 'gpu', not a collector"):
        family_table(["gpu"])


def test_a_table_row_escapes_pipes_and_keeps_seven_cells() -> None:
    spec = FamilySpec[object]("gpu_x", Kind.GAUGE, "help", "`a` | `b`", labels=("gpu", "uuid"))
    assert row(spec, "device") == "| gpu_x | gauge | | | `a` \\| `b` | parent only | device |\n"
