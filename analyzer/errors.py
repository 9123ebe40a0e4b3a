"""The one exception the analyzer raises for bad input.

The CLI prints `gpulens: error: <message>` and exits non-zero, so every message is a single line
that names the file, URL or field and says what was expected.
"""

from __future__ import annotations


class AnalyzerError(Exception):
    """Bad input or an unusable source; `str(exc)` is one line meant for a person."""
