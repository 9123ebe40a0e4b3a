"""docs/alerts.md's flag table of `gpulens remediate` is the one generated from its declared settings.

Regenerate after changing a setting:
`GPULENS_UPDATE_GOLDEN=1 pytest tests/remediate/test_receiver_flag_docs.py`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpulens.remediate.config import ReceiverConfig
from gpulens.settings import markdown_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "alerts.md"
BLOCK = re.compile(r"(<!-- flags: [^\n]*-->\n)(.*?)(<!-- end of flags -->)", re.S)


def test_the_receivers_flag_table_is_generated_from_its_settings() -> None:
    text = DOC.read_text()
    match = BLOCK.search(text)
    assert match, "docs/alerts.md lost its flag table markers"
    table = markdown_table(ReceiverConfig)
    if os.environ.get("GPULENS_UPDATE_GOLDEN") and match.group(2) != table:
        DOC.write_text(text[: match.start(2)] + table + text[match.end(2) :])
        return
    assert match.group(2) == table, (
        "regenerate: GPULENS_UPDATE_GOLDEN=1 pytest tests/remediate/test_receiver_flag_docs.py"
    )
