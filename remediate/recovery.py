"""The interface for the steps after isolation, which both backends implement beside `Isolator`.

Every call takes a total deadline and never raises for backend failures (an `Outcome` or a
`Progress` says what happened). The backends act only through the orchestrator's own mechanisms:
Slurm reboots with `scontrol reboot ASAP`, Kubernetes runs a Job pinned to the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from gpulens.httpclient import Deadline
from gpulens.remediate.diagnose import Verdict
from gpulens.remediate.episodes import Episode
from gpulens.remediate.isolator import Isolator
from gpulens.remediate.model import Outcome


class Step(StrEnum):
    DONE = "done"
    PENDING = "pending"
    FAILED = "failed"


@dataclass(frozen=True)
class Progress:
    step: Step
    detail: str = ""
    marker: str = ""  # what start() recorded to recognise completion (boot time, Job name)


@dataclass(frozen=True)
class Diagnosis:
    """Where a started diagnostic is: PENDING (still running), or DONE with its verdict (a Job that
    failed without one, timed out or vanished is an `error` verdict)."""

    step: Step
    verdict: Verdict | None = None
    detail: str = ""


@dataclass(frozen=True)
class Recorded:
    """What the orchestrator keeps of the episodes: the open ones, each node's last return time,
    and how many records could not be read."""

    episodes: list[Episode]
    returned: dict[str, float]
    skipped: int = 0


class Recoverer(Protocol):
    @property
    def isolation_mark(self) -> str:
        """What marks gpulens' own isolation on a node, for people (the taint, the drain reason)."""
        ...

    def isolation_in_place(self, node: str, deadline: Deadline) -> bool | None:
        """Re-read the node now: True while gpulens' own isolation is on it, False when it is gone
        (a person returned the node, or holds it with their own isolation), None when the node
        cannot be read (then nothing is done to it until it can)."""
        ...

    def recovery_returns_node(self, episode: Episode) -> bool:
        """Whether the episode's finished recovery action itself put the node back in service
        (Slurm's reboot with nextstate=RESUME), so that a missing isolation is not a person's return."""
        ...

    def describe_recovery(self, episode: Episode) -> str:
        """The exact recovery action, for dry-run logs and the audit record."""
        ...

    def can_start(self, episode: Episode, deadline: Deadline) -> Progress:
        """DONE when the action may start now (the node is drained, say); PENDING otherwise."""
        ...

    def start_recovery(self, episode: Episode, deadline: Deadline) -> Progress:
        """Start the reset or reboot: DONE means started (its marker recorded), FAILED refused."""
        ...

    def recovery_progress(self, episode: Episode, deadline: Deadline) -> Progress:
        """Has the started action finished (DONE), failed (FAILED), or not yet (PENDING)?"""
        ...

    def diagnostic_unavailable(self, episode: Episode) -> str:
        """Why this backend cannot run the return diagnostic on the episode's node ("" when it can)."""
        ...

    def describe_diagnostic(self, episode: Episode, level: int) -> str:
        """The exact diagnostic (its Job and command), for dry-run logs and the audit record."""
        ...

    def start_diagnostic(self, episode: Episode, level: int, deadline: Deadline) -> Progress:
        """Start the diagnostic on the node: DONE means started (its marker recorded), FAILED refused
        (the RMA path), PENDING not now (tried again on a later pass)."""
        ...

    def diagnostic_progress(self, episode: Episode, deadline: Deadline) -> Diagnosis:
        """The started diagnostic's verdict (DONE) or PENDING; never raises."""
        ...

    def fence_in_place(self, episode: Episode, deadline: Deadline) -> bool | None:
        """For an episode that fenced only its GPU (`episode.fence`): True while every fence is
        there, False when one is gone (a person returned the GPU), None when it cannot be read."""
        ...

    def describe_return_gpu(self, episode: Episode) -> str: ...

    def return_gpu(self, episode: Episode, deadline: Deadline) -> Outcome:
        """Lift the episode's GPU fence; `applied`, `already` (gone) or `failed`."""
        ...

    def describe_return(self, node: str) -> str: ...

    def return_node(self, node: str, deadline: Deadline) -> Outcome:
        """Put the node back in service, undoing only what gpulens did; `applied` or `failed`."""
        ...

    def record(self, episode: Episode, deadline: Deadline) -> None:
        """Keep the episode on the node itself where the platform allows (Kubernetes annotation)."""
        ...

    def recorded(self, deadline: Deadline) -> Recorded:
        """What `record` kept, for a restart without the audit log; raises on a backend failure."""
        ...


class Backend(Isolator, Recoverer, Protocol):
    """Slurm and Kubernetes both isolate and recover."""
