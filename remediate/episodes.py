"""Fault episodes: one fault on one node (or GPU) from detection to its return to service.

The states and what moves an episode on (`loop.Reconciler` does, every few seconds):

    isolated ──(recovery class)──> recovering ──(reset / reboot seen done)──> recovered
        │  rma: kept isolated, a ticket record           │ failed N times: escalated
        │  none: straight to recovered                    │
    recovered + alert resolved + healthy through the hold-down ──> diagnosing ──(passed)──> ready
        (with `--diag off`, straight to ready)                 │ failed, or the Job failed: rma
    ready ──(--return-to-service, or `gpulens remediate return NODE`)──> returned
    any open state ──(gpulens' isolation found gone before an action: a person's return)──> returned_by_hand

An episode holds out either its node (cordon + taint, Slurm drain) or, where the cluster can fence
one GPU (Kubernetes DRA), only its GPU: `fence` names the DeviceTaintRules, and the node stays in
service; such an episode is checked, returned and returned by hand through its rules alone.

An episode whose node was returned within the flap window is `escalated` at once: it stays
isolated, nothing is retried and nothing returns it automatically. `rma` and `escalated` never
return by themselves; an episode that reached `rma` because its diagnostic failed returns only by
a person (`gpulens remediate return --force`), one opened as RMA class never. In a dry run an
episode records what would happen and stops at `dry_run`.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", re.I)


class Recovery(StrEnum):
    """What brings a faulty GPU back, from the `recovery` label of the alert (NVIDIA's Xid buckets)."""

    NONE = "none"  # isolate only; a person repairs (alerts without a recovery label)
    RESET_GPU = "reset_gpu"  # RESET_GPU, WORKFLOW_XID_48, NVLink, pending row remap / retired pages
    REBOOT_NODE = "reboot_node"  # RESTART_BM (Xid 79), aux power (Xid 54), a lost GPU
    RMA = "rma"  # row-remap failure, retired-pages limit: keep isolated, open a ticket

    @classmethod
    def from_label(cls, value: str) -> Recovery:
        try:
            return cls(value) if value else cls.NONE
        except ValueError:
            raise ValueError(
                f"recovery={value[:40]!r}: expected one of {', '.join(r.value for r in cls)}"
            ) from None


class State(StrEnum):
    ISOLATED = "isolated"
    RECOVERING = "recovering"
    RECOVERED = "recovered"
    DIAGNOSING = "diagnosing"  # healthy through the hold-down; its diagnostic runs on the node
    READY = "ready"  # healthy through the hold-down: ready to return to service
    RETURNED = "returned"
    RETURNED_BY_HAND = "returned_by_hand"  # a person removed gpulens' isolation: nothing more is done
    RMA = "rma"
    ESCALATED = "escalated"
    DRY_RUN = "dry_run"
    CLOSED = "closed"  # resolved in a dry run, or superseded

    @property
    def open(self) -> bool:
        """Still holds its node out of service (or would, in a dry run)."""
        return self not in (State.RETURNED, State.RETURNED_BY_HAND, State.CLOSED)


@dataclass(frozen=True)
class Episode:
    id: str  # the alert's fingerprint@startsAt
    node: str
    alertname: str
    kind: str  # isolate_gpu / isolate_node
    recovery: Recovery
    state: State
    gpu: str = ""
    uuid: str = ""
    instance: str = ""  # the alert's instance label: what health queries select on
    detected_at: float = 0.0  # the alert's startsAt
    isolated_at: float | None = None
    action_started_at: float | None = None
    action_finished_at: float | None = None
    resolved_at: float | None = None  # the alert's resolved notification
    healthy_since: float | None = None  # start of the current hold-down
    recovered_at: float | None = None  # healthy through the hold-down
    returned_at: float | None = None
    attempts: int = 0  # recovery actions started
    marker: str = ""  # backend's before-action mark: boot time / boot ID, or the Job's name
    detail: str = ""
    # set when only the GPU was fenced (its DeviceTaintRules, comma-separated) and the node stays in
    # service; empty when the node itself is isolated
    fence: str = ""
    kept_gpus: int = 0  # the node's other GPUs that stayed in service thanks to the fence
    # the diagnostic that gated the return: what ran and its verdict ("dcgmi diag -r 2: passed")
    diagnostic: str = ""

    @property
    def fences(self) -> list[str]:
        return [name for name in self.fence.split(",") if name]

    def to_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["recovery"], doc["state"] = self.recovery.value, self.state.value
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Episode:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in doc.items() if k in fields}
        values["recovery"] = Recovery(values["recovery"])
        values["state"] = State(values["state"])
        return cls(**values)

    def moved(self, state: State, **changes: Any) -> Episode:
        return dataclasses.replace(self, state=state, **changes)


def parse_time(text: str, default: float) -> float:
    """Alertmanager's RFC 3339 `startsAt` (nanoseconds, `Z`) as epoch seconds; `default` if unusable."""
    match = _RFC3339.fullmatch(text.strip())
    if not match:
        return default
    fraction = (match.group(2) or "")[:6]
    try:
        moment = datetime.datetime.fromisoformat(
            f"{match.group(1)}{'.' + fraction if fraction else ''}{match.group(3)}"
        )
    except ValueError:
        return default
    if moment.tzinfo is None or moment.year < 1970:
        return default
    return moment.timestamp()
