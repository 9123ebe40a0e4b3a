"""The interface both backends implement."""

from __future__ import annotations

import logging
from typing import Protocol

from gpulens.httpclient import Deadline
from gpulens.remediate.episodes import Episode
from gpulens.remediate.model import IsolationRequest, Outcome

log = logging.getLogger("gpulens.remediate")


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


class NodeFencesOnly:
    """The GPU-fence part of `recovery.Recoverer` for a backend that isolates whole nodes only
    (Slurm, Kubernetes without DRA device taints): an episode naming a GPU fence is not its own."""

    backend: str

    def fence_in_place(self, episode: Episode, deadline: Deadline) -> bool | None:
        log.warning(
            "episode %s names a GPU fence, which the %s backend cannot read", episode.id, self.backend
        )
        return None

    def describe_return_gpu(self, episode: Episode) -> str:
        return f"the {self.backend} backend fences no single GPU"

    def return_gpu(self, episode: Episode, deadline: Deadline) -> Outcome:
        return Outcome("failed", f"the {self.backend} backend fences no single GPU")
