"""The interface both backends implement."""

from __future__ import annotations

from typing import Protocol

from gpulens.httpclient import Deadline
from gpulens.remediate.model import IsolationRequest, Outcome


class Isolator(Protocol):
    backend: str

    def check_node(self, node: str) -> str | None:
        """Why this backend cannot take `node` as one node (a wildcard, a set, an invalid name);
        None when it can. Checked before the breaker is asked, so refused names never count."""
        ...

    def describe(self, request: IsolationRequest, now: float) -> str:
        """The exact action `isolate` would take, for dry-run logs."""
        ...

    def isolate(self, request: IsolationRequest, now: float, deadline: Deadline) -> Outcome:
        """Take the node (or GPU) out of service by `deadline`; never raises for backend failures.

        Only `applied` means this call took the node out (the breaker counts it); a node the
        backend does not know, or names more than one node, is `failed`."""
        ...
