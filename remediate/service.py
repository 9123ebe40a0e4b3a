"""Decide what to do with each alert and keep the receiver's state (idempotency, history, episodes).

A notification is first queued (`submit`, queue.py) and acted on later by the dispatcher
(dispatch.py), which calls `handle` for each node's alerts. A firing alert labelled for remediation
is isolated and opens a fault episode, which the reconciler (loop.py) carries through the recovery
action of its class, the hold-down and the return to service; the alert's resolved notification is
what lets the hold-down start."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpulens.httpclient import Deadline
from gpulens.remediate.audit import AuditLog
from gpulens.remediate.book import EpisodeBook
from gpulens.remediate.breaker import Admission, CircuitBreaker
from gpulens.remediate.dispatch import Dispatcher
from gpulens.remediate.episodes import Episode, Recovery, State, parse_time
from gpulens.remediate.escape import printable
from gpulens.remediate.health import AlertOnlyHealth, Health
from gpulens.remediate.locks import NodeLocks
from gpulens.remediate.loop import LoopPolicy, Reconciler
from gpulens.remediate.metrics import RemediateMetrics
from gpulens.remediate.model import ISOLATION_KINDS, ActionRecord, Alert, IsolationRequest, Outcome
from gpulens.remediate.plan import PlanError, node_of, plan
from gpulens.remediate.queue import Entry, NotificationQueue
from gpulens.remediate.recovery import Backend

log = logging.getLogger("gpulens.remediate")

# Episodes remembered for idempotency; old ones are forgotten first. Every key is bounded
# (payload.MAX_FINGERPRINT + MAX_STARTS_AT), so this bounds the memory too.
MAX_EPISODES = 10_000
MAX_HISTORY = 200
MAX_DETAIL = 1000
# Nodes of one notification handled at once (Alertmanager sends one node per notification to
# this receiver; a caller that sends many gets them in parallel, this many at a time).
PARALLEL_NODES = 8
DEFAULT_ACTION_TIMEOUT_S = 60.0
MIRROR_TIMEOUT_S = 10.0  # one best-effort write of an episode to its node


class Remediator:
    """Handle webhook alerts: plan, dedupe, check the breaker, then isolate or log (dry-run).

    Idempotency is keyed by the alert's fingerprint and its `startsAt`: Alertmanager repeats of
    the same firing episode are answered `duplicate`, while the same alert firing again after it
    resolved (a new episode, for example after a person returned the node to service and the
    fault came back) is acted on again. Failed attempts are not remembered, so a repeat retries.

    Actions are serialised per node, never globally: a node whose backend call is slow holds up
    only later actions on that same node, and every action has a total deadline.
    """

    def __init__(
        self,
        isolator: Backend,
        breaker: CircuitBreaker,
        dry_run: bool = True,
        clock: Callable[[], float] = time.time,
        action_timeout_s: float = DEFAULT_ACTION_TIMEOUT_S,
        audit_log: Path | None = None,
        policy: LoopPolicy | None = None,
        health: Health | None = None,
        queue: NotificationQueue | None = None,
    ) -> None:
        self.isolator = isolator
        self.breaker = breaker
        self.dry_run = dry_run
        self.clock = clock
        self.action_timeout_s = action_timeout_s
        self.metrics = RemediateMetrics(breaker.state, dry_run)
        self._lock = threading.Lock()  # guards the idempotency table and the history only
        self.locks = NodeLocks()
        self._episodes: OrderedDict[str, ActionRecord] = OrderedDict()
        self._history: deque[ActionRecord] = deque(maxlen=MAX_HISTORY)
        self.policy = policy or LoopPolicy(action_timeout_s=action_timeout_s)
        mirror = None if dry_run else self._mirror  # a dry run changes nothing on the nodes
        self.book = EpisodeBook(AuditLog(audit_log), self.metrics, clock, mirror)
        self.resumed, self.resumed_from = self._resume()
        self.reconciler = Reconciler(
            self.book,
            isolator,
            breaker,
            health or AlertOnlyHealth(),
            self.locks,
            self.policy,
            dry_run,
            clock,
        )
        self.queue = queue or NotificationQueue()
        self.metrics.bind_queue(self.queue.stats)
        self.dispatcher = Dispatcher(self.queue, self.handle, node_of)

    # ---- the queue: acknowledged first, acted on by the dispatcher ----------------------------

    def submit(self, alerts: Sequence[Alert]) -> Entry:
        """Queue a notification (what `POST /alerts` does before answering); QueueFull or QueueError
        when it cannot be kept."""
        return self.queue.put(alerts)

    def start(self) -> None:
        """Start acting on queued notifications, those a previous run left in the queue file first."""
        self.dispatcher.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Take no more notifications; wait for the actions in progress up to `timeout` (default: the
        action deadline). What was not acted on stays queued. False when actions were still running."""
        return self.dispatcher.stop(self.action_timeout_s if timeout is None else timeout)

    def drain(self, timeout: float) -> bool:
        """Wait until every queued notification has been acted on; False when `timeout` passed first."""
        return self.queue.drain(timeout)

    def _mirror(self, episode: Episode) -> None:
        self.isolator.record(episode, Deadline(min(self.action_timeout_s, MIRROR_TIMEOUT_S)))

    def _resume(self) -> tuple[int, str]:
        """Open episodes from the audit log when there is one, else from what the orchestrator kept.

        The audit log wins when both exist: each step is written (and fsynced) to it before
        anything else, while the node annotations are best-effort writes after it, so they can
        lag a step, and the log alone holds dry-run episodes. Without the log (no --state-dir, or
        an emptyDir lost with the pod) the annotations are all that is left. A dry run never
        adopts them: they record what was really done, which a dry run must not act on.
        """
        if self.book.audit.present() or self.dry_run:
            return self.book.resume(), "audit log"
        try:
            kept = self.isolator.recorded(Deadline(self.action_timeout_s))
        except Exception as exc:  # a backend failure must not keep the receiver from starting
            log.warning("no audit log, and the episodes kept on the nodes cannot be read: %s", exc)
            return 0, "nothing (the nodes could not be read)"
        if kept.skipped:
            log.warning("%d unreadable episode record(s) on the nodes skipped", kept.skipped)
        return self.book.adopt(kept.episodes, kept.returned), "node annotations"

    def handle(self, alerts: Iterable[Alert]) -> list[ActionRecord]:
        """Act on a notification's alerts; alerts of different nodes run in parallel."""
        planned: list[tuple[Alert, IsolationRequest | None, ActionRecord | None]] = []
        for alert in alerts:
            try:
                request = plan(alert)
                refusal = self.isolator.check_node(request.node) if request is not None else None
                if refusal:
                    raise PlanError(refusal)
            except PlanError as exc:
                kind = _kind_label(alert.labels.get("remediate", ""))
                planned.append(
                    (alert, None, self._record(self.clock(), alert, kind, "", Outcome("rejected", str(exc))))
                )
                continue
            planned.append((alert, request, None))
        by_node: dict[str, list[int]] = {}
        for index, (_alert, request, _done) in enumerate(planned):
            if request is not None:
                by_node.setdefault(request.node, []).append(index)
        results: dict[int, ActionRecord | None] = {}

        def run(indexes: list[int]) -> None:
            for index in indexes:
                alert, request, _ = planned[index]
                assert request is not None
                results[index] = self._handle_one(alert, request)

        groups = list(by_node.values())
        if len(groups) <= 1:
            for group in groups:
                run(group)
        else:
            with ThreadPoolExecutor(max_workers=min(PARALLEL_NODES, len(groups))) as pool:
                list(pool.map(run, groups))
        records = []
        for index, (_alert, request, done) in enumerate(planned):
            record = done if request is None else results.get(index)
            if record is not None:
                records.append(record)
        return records

    def _handle_one(self, alert: Alert, request: IsolationRequest) -> ActionRecord:
        now = self.clock()
        kind = request.kind
        deadline = Deadline(self.action_timeout_s)
        if alert.status == "resolved":
            with self.locks.hold(request.node, deadline.remaining()):
                return self._record(now, alert, kind, request.node, self._resolved(request, now))
        with self.locks.hold(request.node, deadline.remaining()) as held:
            if not held:
                outcome = Outcome(
                    "deferred",
                    f"an earlier action on node {request.node} did not finish within "
                    f"{self.action_timeout_s:g}s; retried on the next notification",
                )
                return self._record(now, alert, kind, request.node, outcome)
            with self._lock:
                previous = self._episodes.get(request.episode)
            if previous is not None:
                outcome = Outcome("duplicate", f"handled at {previous.at:.0f} with result {previous.result}")
                return self._record(now, alert, kind, request.node, outcome)
            open_episode = self.book.get(request.episode)
            if open_episode is not None:  # known from the audit log of an earlier run
                outcome = Outcome("duplicate", f"episode open since {open_episode.isolated_at or 0:.0f}")
                return self._record(now, alert, kind, request.node, outcome)
            ticket = self.breaker.reserve(request.node, wait_s=deadline.remaining())
            if not ticket.allowed:
                refused = (
                    Outcome("breaker_open", ticket.detail)
                    if ticket.admission is Admission.OPEN
                    else Outcome("deferred", ticket.detail)
                )
                return self._record(now, alert, kind, request.node, refused)
            outcome = self._act(request, now, deadline)
            if outcome.result in ("applied", "dry_run"):
                self.breaker.commit(ticket)
            else:
                self.breaker.release(ticket)
            record = self._record(now, alert, kind, request.node, outcome)
            if outcome.result != "failed":
                with self._lock:
                    self._episodes[request.episode] = record
                    while len(self._episodes) > MAX_EPISODES:
                        self._episodes.popitem(last=False)
                self._open_episode(alert, request, outcome, now, deadline)
            return record

    def _open_episode(
        self, alert: Alert, request: IsolationRequest, outcome: Outcome, now: float, deadline: Deadline
    ) -> None:
        recovery = Recovery(request.recovery)
        episode = Episode(
            id=request.episode,
            node=request.node,
            alertname=printable(request.alertname, 128),
            kind=request.kind,
            recovery=recovery,
            state=State.ISOLATED,
            gpu=printable(request.gpu, 16),
            uuid=printable(request.uuid, 64),
            instance=request.instance,
            detected_at=min(parse_time(alert.starts_at, now), now),
            isolated_at=now,
            detail=printable(outcome.detail, MAX_DETAIL),
            fence=outcome.fence,
            kept_gpus=outcome.kept_gpus,
        )
        last_return = self.book.last_return(request.node)
        if self.dry_run:
            then = self.isolator.describe_recovery(episode) if recovery in _ACTING else "nothing more"
            episode = episode.moved(State.DRY_RUN, detail=f"{episode.detail}; then {recovery.value}: {then}")
            self.book.save("isolated", episode)
            return
        if recovery is Recovery.RMA:
            ticket = (
                f"RMA ticket: {episode.alertname} on node {episode.node} gpu {episode.gpu or '-'} "
                f"{episode.uuid}: kept isolated; replace the GPU (run NVIDIA's field diagnostic first)"
            )
            episode = self.book.save("ticket", episode.moved(State.RMA, detail=ticket))
        elif last_return is not None and now - last_return < self.policy.flap_window_s:
            detail = (
                f"faulty again {now - last_return:.0f}s after its return to service (flap window "
                f"{self.policy.flap_window_s:g}s): kept out, escalated to a person"
            )
            episode = self.book.save("escalated", episode.moved(State.ESCALATED, detail=detail))
        else:
            self.book.save("isolated", episode)
            self._maybe_take_node_out(episode, now, deadline)

    def _maybe_take_node_out(self, episode: Episode, now: float, deadline: Deadline) -> None:
        """Enough faulty GPUs on one node: isolate the node whole (drain) and reboot it.

        Runs under the node's lock. The node-wide episode is an ordinary reboot_node episode
        (`GPUNodeFaultyGpus`); the GPUs' own reset episodes then wait for its reboot instead of
        resetting one by one."""
        threshold = self.policy.node_gpu_threshold
        if threshold < 1 or episode.kind != "isolate_gpu":
            return
        open_here = [e for e in self.book.of_node(episode.node) if e.state is not State.DRY_RUN]
        if any(e.kind == "isolate_node" and e.recovery is Recovery.REBOOT_NODE for e in open_here):
            return
        gpus = sorted({e.gpu for e in open_here if e.kind == "isolate_gpu" and e.gpu})
        if len(gpus) < threshold:
            return
        request = IsolationRequest(
            kind="isolate_node",
            node=episode.node,
            alertname=NODE_ALERT,
            fingerprint=f"node:{episode.node}",
            episode=f"node:{episode.node}@{now:.0f}",
            gpu="",
            recovery=Recovery.REBOOT_NODE.value,
            instance=episode.instance,
        )
        outcome = self._act(request, now, deadline)
        detail = (
            f"{len(gpus)} faulty GPUs ({', '.join(gpus)}) reach --node-gpu-threshold {threshold}: "
            f"{outcome.detail}"
        )
        log.warning("node %s taken out whole: %s", episode.node, printable(detail, MAX_DETAIL))
        if outcome.result not in ("applied", "already"):
            return  # retried when the next GPU episode opens on this node
        whole = Episode(
            id=request.episode,
            node=episode.node,
            alertname=NODE_ALERT,
            kind="isolate_node",
            recovery=Recovery.REBOOT_NODE,
            state=State.ISOLATED,
            instance=episode.instance,
            detected_at=now,
            isolated_at=now,
            # no alert of its own resolves it: it counts as resolved once every GPU episode's alert has
            resolved_at=None,
            detail=printable(detail, MAX_DETAIL),
        )
        self.book.save("isolated", whole)

    def _resolved(self, request: IsolationRequest, now: float) -> Outcome:
        episode = self.book.get(request.episode)
        if episode is None:
            return Outcome("resolved_ignored", "no open episode for this alert")
        if episode.state is State.DRY_RUN:
            self.book.save("resolved", episode.moved(State.CLOSED, resolved_at=now))
            return Outcome("resolved", "dry run: episode closed")
        if episode.resolved_at is None:
            self.book.save("resolved", episode.moved(episode.state, resolved_at=now))
        return Outcome(
            "resolved", f"episode {episode.state.value}: the hold-down starts once it has recovered"
        )

    def return_node(self, node: str, force: bool = False) -> Outcome:
        """`gpulens remediate return NODE`: return a node whose episodes are ready (or forced)."""
        outcome = self.reconciler.return_node(node, force)
        log.log(
            logging.INFO if outcome.result in ("applied", "already", "dry_run") else logging.WARNING,
            "return node=%s: %s %s",
            printable(node, 253),
            outcome.result,
            printable(outcome.detail, MAX_DETAIL),
        )
        return outcome

    def _act(self, request: IsolationRequest, now: float, deadline: Deadline) -> Outcome:
        if self.dry_run:
            return Outcome(
                "dry_run", f"DRY-RUN {self.isolator.backend}: {self.isolator.describe(request, now)}"
            )
        try:
            outcome = self.isolator.isolate(request, now, deadline)
        except Exception as exc:  # a backend bug must fail this alert, not the notification
            log.exception("isolating node %s failed", request.node)
            return Outcome("failed", f"{type(exc).__name__}: {exc}")
        if outcome.result != "failed" and deadline.expired:
            log.warning("isolating node %s took longer than its %gs deadline", request.node, deadline.seconds)
        return outcome

    def _record(self, now: float, alert: Alert, kind: str, node: str, outcome: Outcome) -> ActionRecord:
        record = ActionRecord(
            at=now,
            alertname=printable(alert.name, 128),
            fingerprint=alert.fingerprint,
            kind=kind,
            node=node,
            gpu=printable(alert.labels.get("gpu", ""), 16),
            result=outcome.result,
            detail=printable(outcome.detail, MAX_DETAIL),
        )
        with self._lock:
            self._history.append(record)
        self.metrics.actions.labels(kind=record.kind, result=record.result).inc()
        level = (
            logging.WARNING
            if outcome.result in ("failed", "breaker_open", "rejected", "deferred")
            else logging.INFO
        )
        log.log(
            level,
            "%s %s node=%s gpu=%s fingerprint=%s: %s",
            record.result,
            record.alertname,
            node or "-",
            record.gpu or "-",
            printable(record.fingerprint, 64),
            record.detail,
        )
        return record

    def state(self) -> dict[str, Any]:
        """What /-/state shows: mode, backend, breaker, the recent actions (newest last), the open
        episodes and the queue (`pending`: notifications acknowledged and not yet acted on)."""
        breaker = self.breaker.state()
        with self._lock:
            actions = [asdict(r) for r in self._history]
        return {
            "dry_run": self.dry_run,
            "backend": self.isolator.backend,
            "breaker": asdict(breaker)
            | {"nodes_in_window": list(breaker.nodes_in_window), "in_flight": list(breaker.in_flight)},
            "actions": actions,
            "episodes": [e.to_dict() for e in self.book.open_episodes()],
            "queue": asdict(self.queue.stats()),
        }


_ACTING = (Recovery.RESET_GPU, Recovery.REBOOT_NODE)
NODE_ALERT = "GPUNodeFaultyGpus"  # the name of a node-wide episode opened by the GPU threshold


def _kind_label(kind: str) -> str:
    """The `kind` metric label: an isolation kind, else `invalid` (never the caller's text)."""
    if not kind:
        return "none"
    return kind if kind in ISOLATION_KINDS else "invalid"
