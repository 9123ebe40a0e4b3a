"""The interface both backends implement."""

from __future__ import annotations

from typing import Protocol

from gpulens.remediate.model import IsolationRequest, Outcome


class Isolator(Protocol):
    backend: str

    def describe(self, request: IsolationRequest, now: float) -> str:
        """The exact action `isolate` would take, for dry-run logs."""
        ...

    def isolate(self, request: IsolationRequest, now: float) -> Outcome:
        """Take the node (or GPU) out of service; never raises for backend failures."""
        ...
