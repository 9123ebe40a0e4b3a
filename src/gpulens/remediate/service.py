"""Decide what to do with each alert and keep the receiver's state (idempotency, history)."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import asdict

from gpulens.remediate.breaker import CircuitBreaker
from gpulens.remediate.isolator import Isolator
from gpulens.remediate.metrics import RemediateMetrics
from gpulens.remediate.model import ActionRecord, Alert, Outcome
from gpulens.remediate.plan import PlanError, plan

log = logging.getLogger("gpulens.remediate")

# Episodes remembered for idempotency; old ones are forgotten first.
MAX_EPISODES = 10_000
MAX_HISTORY = 200


class Remediator:
    """Handle webhook alerts: plan, dedupe, check the breaker, then isolate or log (dry-run).

    Idempotency is keyed by the alert's fingerprint and its `startsAt`: Alertmanager repeats of
    the same firing episode are answered `duplicate`, while the same alert firing again after it
    resolved (a new episode, for example after a person returned the node to service and the
    fault came back) is acted on again. Failed attempts are not remembered, so a repeat retries.
    """

    def __init__(
        self,
        isolator: Isolator,
        breaker: CircuitBreaker,
        dry_run: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.isolator = isolator
        self.breaker = breaker
        self.dry_run = dry_run
        self.clock = clock
        self.metrics = RemediateMetrics(breaker.state, dry_run)
        self._lock = threading.Lock()
        self._episodes: OrderedDict[str, ActionRecord] = OrderedDict()
        self._history: deque[ActionRecord] = deque(maxlen=MAX_HISTORY)

    def handle(self, alerts: Iterable[Alert]) -> list[ActionRecord]:
        with self._lock:  # one notification at a time: the breaker and dedupe see a consistent order
            return [record for alert in alerts if (record := self._handle_one(alert)) is not None]

    def _handle_one(self, alert: Alert) -> ActionRecord | None:
        now = self.clock()
        kind = alert.labels.get("remediate", "")
        try:
            request = plan(alert)
        except PlanError as exc:
            return self._record(now, alert, kind, "", Outcome("rejected", str(exc)))
        if request is None:
            return None  # not labelled for remediation: nothing to do, nothing to count
        if alert.status == "resolved":
            outcome = Outcome("resolved_ignored", "resolved notifications never return a node to service")
            return self._record(now, alert, kind, request.node, outcome)
        previous = self._episodes.get(request.episode)
        if previous is not None:
            outcome = Outcome("duplicate", f"handled at {previous.at:.0f} with result {previous.result}")
            return self._record(now, alert, kind, request.node, outcome)
        if not self.breaker.admit(request.node):
            state = self.breaker.state()
            outcome = Outcome(
                "breaker_open",
                f"circuit breaker open: more than {state.max_nodes} nodes "
                f"in {state.window_s:g}s; reset it at /-/breaker/reset",
            )
            return self._record(now, alert, kind, request.node, outcome)
        if self.dry_run:
            outcome = Outcome(
                "dry_run", f"DRY-RUN {self.isolator.backend}: {self.isolator.describe(request, now)}"
            )
        else:
            outcome = self.isolator.isolate(request, now)
        record = self._record(now, alert, kind, request.node, outcome)
        if outcome.result != "failed":
            self._episodes[request.episode] = record
            while len(self._episodes) > MAX_EPISODES:
                self._episodes.popitem(last=False)
        return record

    def _record(self, now: float, alert: Alert, kind: str, node: str, outcome: Outcome) -> ActionRecord:
        record = ActionRecord(
            at=now,
            alertname=alert.name,
            fingerprint=alert.fingerprint,
            kind=kind or "none",
            node=node,
            gpu=alert.labels.get("gpu", ""),
            result=outcome.result,
            detail=outcome.detail,
        )
        self._history.append(record)
        self.metrics.actions.labels(kind=record.kind, result=record.result).inc()
        level = logging.WARNING if outcome.result in ("failed", "breaker_open", "rejected") else logging.INFO
        log.log(
            level,
            "%s %s node=%s gpu=%s fingerprint=%s: %s",
            record.result,
            record.alertname,
            node or "-",
            record.gpu or "-",
            record.fingerprint,
            outcome.detail,
        )
        return record

    def state(self) -> dict:
        """What /-/state shows: mode, backend, breaker and the recent actions (newest last)."""
        with self._lock:
            breaker = self.breaker.state()
            return {
                "dry_run": self.dry_run,
                "backend": self.isolator.backend,
                "breaker": asdict(breaker) | {"nodes_in_window": list(breaker.nodes_in_window)},
                "actions": [asdict(r) for r in self._history],
            }
