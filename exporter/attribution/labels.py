"""Label-value hygiene for identities that come from untrusted places (env, file names, files).

Anything a user can write (a job id in a mapping file, an env var, a pod name) ends up as a
Prometheus label value, so it is made printable, free of quotes/backslashes and length-capped
here, once, before it reaches the exporter.
"""

from __future__ import annotations

MAX_LABEL_LENGTH = 128
_REPLACEMENT = "_"
_FORBIDDEN = frozenset('"\\`')


def sanitize_label_value(value: str, max_length: int = MAX_LABEL_LENGTH) -> str:
    """Printable, single-line, quote-free, at most `max_length` characters (truncation marked by `~`)."""
    clean = len(value) <= max_length and value.isprintable() and not _FORBIDDEN.intersection(value)
    if clean and (not value or (not value[0].isspace() and not value[-1].isspace())):
        return value  # the common case, without rebuilding the string
    cleaned = "".join(
        _REPLACEMENT if (not ch.isprintable() or ch in _FORBIDDEN) else ch for ch in value.strip()
    )
    if len(cleaned) > max_length:
        cleaned = cleaned[: max_length - 1] + "~"
    return cleaned
