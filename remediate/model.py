"""Records exchanged between the payload parser, the planner, the isolators and the service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpulens.remediate.escape import printable

IsolationKind = Literal["isolate_gpu", "isolate_node"]
ISOLATION_KINDS: tuple[IsolationKind, ...] = ("isolate_gpu", "isolate_node")

# What happened to one alert. Every value is also a `result` label of the actions counter.
Result = Literal[
    "dry_run",  # would have isolated; nothing changed
    "applied",  # isolated now
    "already",  # the node was already isolated (by us or by a person)
    "duplicate",  # this alert episode was handled before (Alertmanager repeat)
    "breaker_open",  # refused: too many nodes isolated in the window
    "deferred",  # not attempted now (the breaker's window is full of actions in flight); retried later
    "resolved",  # the alert of an open episode resolved: its hold-down can start
    "resolved_ignored",  # a resolved notification for no open episode
    "rejected",  # the alert cannot be acted on (no usable node name, a node set, ...)
    "failed",  # the backend refused or was unreachable
]


@dataclass(frozen=True)
class Alert:
    """One alert of an Alertmanager webhook notification (payload version 4)."""

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str]
    fingerprint: str
    starts_at: str

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


@dataclass(frozen=True)
class IsolationRequest:
    """What one firing alert asks for, with the node name already resolved."""

    kind: IsolationKind
    node: str
    alertname: str
    fingerprint: str
    episode: str  # fingerprint + startsAt: one firing episode of the alert
    gpu: str = ""
    uuid: str = ""
    recovery: str = "none"  # the alert's `recovery` label (episodes.Recovery), validated by plan()
    instance: str = ""

    @property
    def reason(self) -> str:
        """Short human reason, as written into the Slurm reason / Kubernetes annotation.

        Label values come from the caller: control characters are escaped and each part bounded,
        so the reason is one line of at most a few hundred characters."""
        where = f" gpu {printable(self.gpu, 16)}" if self.gpu else ""
        uuid = f" {printable(self.uuid, 64)}" if self.uuid else ""
        return f"gpulens: {printable(self.alertname, 128)}{where}{uuid}"


@dataclass(frozen=True)
class Outcome:
    """What an isolator did (or, in dry-run, would do)."""

    result: Result
    detail: str
    # a GPU fenced instead of its node (Kubernetes DRA): the DeviceTaintRule names, comma-separated,
    # and how many other GPUs of the node stay in service
    fence: str = ""
    kept_gpus: int = 0


@dataclass(frozen=True)
class ActionRecord:
    """One handled alert, as kept in the recent-actions list and logged."""

    at: float
    alertname: str
    fingerprint: str
    kind: str
    node: str
    gpu: str
    result: Result
    detail: str
