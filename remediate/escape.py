"""Make text from a webhook caller safe to log: control characters escaped, length bounded.

An authenticated caller still controls label values; a newline in `alertname` must not forge a
second log line, an ANSI escape must not rewrite a terminal, and a megabyte value must not flood
the journal.
"""

from __future__ import annotations

import re

MAX_LOGGED = 256
# C0 and C1 controls, DEL, and the Unicode line/paragraph separators some log viewers break on
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char) or f"\\x{ord(char):02x}"


def printable(text: str, limit: int = MAX_LOGGED) -> str:
    """`text` with control characters escaped (`\\n`, `\\x1b`), cut to `limit` characters."""
    if len(text) > limit:
        text = f"{text[:limit]}...(+{len(text) - limit} chars)"
    return _CONTROL.sub(_escape, text)
