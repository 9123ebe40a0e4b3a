"""docs/exporter.md's flag table is the one generated from the declared settings.

Regenerate after changing a setting: `GPULENS_UPDATE_GOLDEN=1 pytest tests/exporter/test_flag_docs.py`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpulens.exporter.cli import COLLECTOR_FLAG_ROWS
from gpulens.exporter.config import ExporterConfig
from gpulens.settings import markdown_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "exporter.md"
BLOCK = re.compile(r"(<!-- flags: [^\n]*-->\n)(.*?)(<!-- end of flags -->)", re.S)


def test_the_docs_flag_table_is_generated_from_the_settings() -> None:
    text = DOC.read_text()
    match = BLOCK.search(text)
    assert match, "docs/exporter.md lost its flag table markers"
    table = markdown_table(ExporterConfig, COLLECTOR_FLAG_ROWS)
    if os.environ.get("GPULENS_UPDATE_GOLDEN") and match.group(2) != table:
        DOC.write_text(text[: match.start(2)] + table + text[match.end(2) :])
        return
    assert match.group(2) == table, (
        "regenerate: GPULENS_UPDATE_GOLDEN=1 pytest tests/exporter/test_flag_docs.py"
    )
