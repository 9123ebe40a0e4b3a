"""How `gpulens remediate` and its subcommands report a usage error: one line, exit status 2."""

from __future__ import annotations

import sys


class UsageError(ValueError):
    """A bad combination of settings; printed as one line."""


def fail(message: str) -> int:
    """One line on stderr and exit status 2, like gpulens' other usage errors."""
    print(f"gpulens: error: {message}", file=sys.stderr)
    return 2
