"""Move open episodes on: start the recovery action, see it finish, hold down, return to service.

`Reconciler.tick()` looks at every open episode once (tests call it directly); `run()` calls it
every `interval_s` on its own thread. Nodes are stepped concurrently on a small pool, each node at
most once at a time (a node still busy from an earlier pass is skipped), and each step holds that
node's lock (shared with the webhook handler): a node whose calls hang delays only itself, and
every backend call has the action deadline. Resets and reboots pass through the circuit breaker like
isolations; a refused one waits for the next tick.

Every action on a node (starting a reset or reboot, starting or reading its diagnostic, returning it
to service) first re-reads the node from the orchestrator and goes ahead only while gpulens' own
isolation is still on it. A node that cannot be read gets nothing this pass (retried on the next);
a node whose isolation is gone was returned by a person: its open episodes close as
`returned_by_hand` and nothing more is done.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from gpulens.httpclient import Deadline
from gpulens.remediate.book import EpisodeBook
from gpulens.remediate.breaker import CircuitBreaker
from gpulens.remediate.diagnose import Result
from gpulens.remediate.episodes import Episode, Recovery, State
from gpulens.remediate.health import Health
from gpulens.remediate.locks import NodeLocks
from gpulens.remediate.metrics import RemediateMetrics
from gpulens.remediate.model import Outcome
from gpulens.remediate.recovery import Recoverer, Step

log = logging.getLogger("gpulens.remediate")


@dataclass
class LoopPolicy:
    hold_down_s: float = 600.0
    flap_window_s: float = 86_400.0
    return_to_service: bool = False
    max_attempts: int = 3
    action_timeout_s: float = 60.0
    node_gpu_threshold: int = 2  # faulty GPUs on one node that take the whole node out (0: never)
    diag_level: int = 0  # `dcgmi diag -r` level of the return diagnostic, 1-4; 0: none (--diag off)


PARALLEL_NODES = 8  # nodes stepped at once


class Reconciler:
    def __init__(
        self,
        book: EpisodeBook,
        backend: Recoverer,
        breaker: CircuitBreaker,
        health: Health,
        locks: NodeLocks,
        policy: LoopPolicy,
        dry_run: bool,
        clock: Callable[[], float],
    ) -> None:
        self.book = book
        self.backend = backend
        self.breaker = breaker
        self.health = health
        self.locks = locks
        self.policy = policy
        self.dry_run = dry_run
        self.clock = clock
        self._stop = threading.Event()
        # nodes are stepped concurrently, each at most once at a time: a node whose orchestrator
        # calls hang (each bounded by action_timeout_s) holds one worker, never another node's pass
        self._pool = ThreadPoolExecutor(PARALLEL_NODES, thread_name_prefix="gpulens-reconcile-node")
        self._busy: set[str] = set()
        self._busy_lock = threading.Lock()

    # ---- the thread ----------------------------------------------------------------------------

    def run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.tick(wait=False)  # a node still busy from an earlier pass is skipped
            except Exception:  # one bad step must not end the loop
                log.exception("reconcile pass failed")

    def start(self, interval_s: float) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(interval_s,), name="gpulens-reconcile", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- one pass ------------------------------------------------------------------------------

    def tick(self, wait: bool = True) -> list[str]:
        """One pass: every node with open episodes not still busy from an earlier pass, stepped
        concurrently; `wait` returns once they are done (tests), else at once (the thread).
        Returns the nodes it started."""
        started: list[str] = []
        futures: list[Future[None]] = []
        for node in sorted({e.node for e in self.book.open_episodes()}):
            with self._busy_lock:
                if node in self._busy:
                    continue
                self._busy.add(node)
            started.append(node)
            futures.append(self._pool.submit(self._pass_node, node))
        if wait:
            for future in futures:
                future.result()
        return started

    def _pass_node(self, node: str) -> None:
        try:
            with self.locks.hold(node, self.policy.action_timeout_s) as held:
                if not held:
                    return  # a webhook action on this node is still running: next tick
                for episode in self.book.of_node(node):
                    current = self.book.get(episode.id)
                    if current is not None:  # an earlier step may have closed it (a return by hand)
                        self._step(current)
                self._maybe_return(node)
        except Exception:  # one node's failure must not stop the others' passes
            log.exception("reconcile pass of node %s failed", node)
        finally:
            with self._busy_lock:
                self._busy.discard(node)

    def _step(self, episode: Episode) -> None:
        deadline = Deadline(self.policy.action_timeout_s)
        now = self.clock()
        if episode.state is State.ISOLATED:
            if episode.recovery is Recovery.NONE:
                self.book.save("recovered", episode.moved(State.RECOVERED, action_finished_at=now))
            elif episode.recovery is Recovery.RMA:
                return  # opened as RMA; never moves by itself
            else:
                self._start(episode, deadline, now)
        elif episode.state is State.RECOVERING:
            progress = self.backend.recovery_progress(episode, deadline)
            if progress.step is Step.DONE:
                self.book.save(
                    "action_finished",
                    episode.moved(State.RECOVERED, action_finished_at=now, detail=progress.detail),
                )
            elif progress.step is Step.FAILED:
                if episode.attempts >= self.policy.max_attempts:
                    detail = (
                        f"recovery failed {episode.attempts} times: {progress.detail}; a person must look"
                    )
                    self.book.save("escalated", episode.moved(State.ESCALATED, detail=detail))
                else:
                    self.book.save("action_failed", episode.moved(State.ISOLATED, detail=progress.detail))
        elif episode.state is State.RECOVERED:
            self._hold_down(episode, deadline, now)
        elif episode.state is State.DIAGNOSING:
            self._diagnosed(episode, deadline, now)

    def _start(self, episode: Episode, deadline: Deadline, now: float) -> None:
        if episode.recovery is Recovery.RESET_GPU:
            reboot = [
                e
                for e in self.book.of_node(episode.node)
                if e.recovery is Recovery.REBOOT_NODE
                and e.state in (State.ISOLATED, State.RECOVERING, State.RECOVERED)
            ]
            if reboot:  # a reboot of the node resets this GPU too: wait for it instead of resetting
                if reboot[0].state is State.RECOVERED:
                    detail = f"reset by the node's reboot ({reboot[0].alertname})"
                    self.book.save(
                        "action_finished",
                        episode.moved(State.RECOVERED, action_finished_at=now, detail=detail),
                    )
                elif not episode.detail.startswith("waiting for the node's reboot"):
                    detail = (
                        f"waiting for the node's reboot ({reboot[0].alertname}), which resets this GPU too"
                    )
                    self.book.save("waiting", episode.moved(State.ISOLATED, detail=detail))
                return
        if self._stopped_by_node(episode.node, [episode], deadline) is not None:
            return
        ready = self.backend.can_start(episode, deadline)
        if ready.step is not Step.DONE:
            if ready.detail != episode.detail:
                self.book.save("waiting", episode.moved(State.ISOLATED, detail=ready.detail))
            return
        ticket = self.breaker.reserve(episode.node)
        if not ticket.allowed:
            if ticket.detail != episode.detail:
                self.book.save("deferred", episode.moved(State.ISOLATED, detail=ticket.detail))
            return
        progress = self.backend.start_recovery(episode, deadline)
        attempts = episode.attempts + 1
        if progress.step is Step.DONE:
            self.breaker.commit(ticket)
            moved = episode.moved(
                State.RECOVERING,
                action_started_at=now,
                attempts=attempts,
                marker=progress.marker,
                detail=progress.detail,
            )
            self.book.save("action_started", moved)  # the book's mirror records it on the node
            return
        self.breaker.release(ticket)
        if attempts >= self.policy.max_attempts:
            detail = f"recovery could not start {attempts} times: {progress.detail}; a person must look"
            self.book.save("escalated", episode.moved(State.ESCALATED, attempts=attempts, detail=detail))
        else:
            self.book.save(
                "action_failed", episode.moved(State.ISOLATED, attempts=attempts, detail=progress.detail)
            )

    def _hold_down(self, episode: Episode, deadline: Deadline, now: float) -> None:
        if episode.resolved_at is None:
            if episode.id.startswith("node:"):  # node-wide (GPU threshold): resolved with its GPUs' alerts
                others = [e for e in self.book.of_node(episode.node) if e.id != episode.id]
                if others and all(e.resolved_at is not None for e in others):
                    resolved = max(e.resolved_at or 0.0 for e in others)
                    self.book.save("resolved", episode.moved(episode.state, resolved_at=resolved))
            return  # the alert still fires: the fault is not gone
        since = episode.healthy_since
        if since is None:
            start = max(episode.resolved_at, episode.action_finished_at or episode.resolved_at)
            self.book.save("hold_down", episode.moved(State.RECOVERED, healthy_since=start))
            return
        if now - since < self.policy.hold_down_s:
            return
        healthy, why = self.health.check(episode, self.policy.hold_down_s, deadline)
        if healthy:
            self._diagnose(episode.moved(episode.state, detail=why), deadline, now)
        else:
            self.book.save("hold_down", episode.moved(State.RECOVERED, healthy_since=now, detail=why))

    # ---- the return diagnostic -------------------------------------------------------------------

    def _diagnose(self, episode: Episode, deadline: Deadline, now: float) -> None:
        """Healthy through the hold-down: ready, once a diagnostic on the node has passed (with one
        configured, and where the backend can run it)."""
        level = self.policy.diag_level
        unavailable = self.backend.diagnostic_unavailable(episode) if level else ""
        if not level or self.dry_run or unavailable:
            why = episode.detail
            if level and self.dry_run:
                why += f"; DRY-RUN: then {self.backend.describe_diagnostic(episode, level)}"
            elif unavailable:
                why += f"; no diagnostic: {unavailable}"
            self.book.save("recovered", episode.moved(State.READY, recovered_at=now, detail=why))
            return
        if self._stopped_by_node(episode.node, [episode], deadline) is not None:
            return  # returned by hand (closed) or unreadable (next pass)
        started = self.backend.start_diagnostic(episode, level, deadline)
        if started.step is Step.PENDING:  # not now (another episode's diagnostic holds the node)
            stored = self.book.get(episode.id)
            if stored is None or stored.detail != started.detail:
                self.book.save("waiting", episode.moved(episode.state, detail=started.detail))
            return
        if started.step is not Step.DONE:
            self._diagnosis_failed(episode, Result.ERROR, f"the diagnostic could not start: {started.detail}")
            return
        detail = f"{episode.detail}; diagnostic started: {started.detail}"
        self.book.save(
            "diagnostic_started", episode.moved(State.DIAGNOSING, marker=started.marker, detail=detail)
        )

    def _diagnosed(self, episode: Episode, deadline: Deadline, now: float) -> None:
        if self._stopped_by_node(episode.node, [episode], deadline) is not None:
            return  # returned by hand while it ran (closed: its verdict is not waited for), or unreadable
        diagnosis = self.backend.diagnostic_progress(episode, deadline)
        if diagnosis.step is not Step.DONE or diagnosis.verdict is None:
            return
        verdict = diagnosis.verdict
        what = f"{verdict.check}: {verdict.result.value}" + (f": {verdict.detail}" if verdict.detail else "")
        if verdict.result is Result.PASSED:
            self._count_diagnostic(Result.PASSED)
            moved = episode.moved(State.READY, recovered_at=now, diagnostic=what, detail=f"diagnostic {what}")
            self.book.save("diagnostic_passed", moved)
            return
        self._diagnosis_failed(episode, verdict.result, what)

    def _diagnosis_failed(self, episode: Episode, result: Result, what: str) -> None:
        """A failed (or unfinished) diagnostic keeps the GPU or node out: the RMA path, which nothing
        but a person (`gpulens remediate return --force`) leaves."""
        self._count_diagnostic(result)
        out = (
            f"GPU {episode.uuid or episode.gpu} on node {episode.node}"
            if episode.gpu
            else f"node {episode.node}"
        )
        detail = (
            f"diagnostic {what}; RMA: {out} stays out of service until a person returns it "
            "(gpulens remediate return --force)"
        )
        self.book.save("diagnostic_failed", episode.moved(State.RMA, diagnostic=what, detail=detail))

    def _count_diagnostic(self, result: Result) -> None:
        metrics: RemediateMetrics = self.book.metrics
        metrics.diagnostics.labels(result=result.value).inc()

    # ---- what is true now ------------------------------------------------------------------------

    def _stopped_by_node(self, node: str, acting: list[Episode], deadline: Deadline) -> Outcome | None:
        """Re-read what holds `acting` out before an action for them: None to go ahead (gpulens'
        isolation is still there), else why not. Unreadable: `deferred`, nothing done, retried next
        pass. Gone: a person returned it, and what it held closes as returned by hand: the node's
        episodes for a node, the one episode for a GPU fence (a deleted DeviceTaintRule)."""
        if self.dry_run:
            return None  # nothing was isolated, nothing will be done
        for episode in [e for e in acting if e.fence]:
            stopped = self._stopped_by_fence(episode, deadline)
            if stopped is not None:
                return stopped
        if all(e.fence for e in acting):
            return None
        try:
            in_place = self.backend.isolation_in_place(node, deadline)
        except Exception:  # the backends do not raise; a bug must not make the loop act blind
            log.exception("reading node %s failed", node)
            in_place = None
        if in_place:
            return None
        if in_place is None:
            detail = f"the state of node {node} cannot be read now: nothing is done to it until it can"
            for episode in acting:
                if episode.detail != detail:
                    self.book.save("waiting", episode.moved(episode.state, detail=detail))
            return Outcome("deferred", f"{detail}; try again")
        if acting and all(self.backend.recovery_returns_node(e) for e in acting):
            return None  # the reboot itself resumed the node (Slurm nextstate=RESUME): not a person
        now = self.clock()
        detail = (
            f"returned by hand: node {node} no longer carries gpulens' isolation "
            f"({self.backend.isolation_mark}); nothing more is done for this episode"
        )
        for episode in self.book.of_node(node):
            if episode.state is not State.DRY_RUN and not episode.fence:  # a fenced GPU stays fenced
                moved = episode.moved(State.RETURNED_BY_HAND, returned_at=now, detail=detail)
                self.book.save("returned_by_hand", moved)
        return Outcome("already", f"node {node} was returned by hand: its episodes are closed, nothing done")

    def _stopped_by_fence(self, episode: Episode, deadline: Deadline) -> Outcome | None:
        """The GPU-fence counterpart of `_stopped_by_node` for one fenced episode."""
        try:
            in_place = self.backend.fence_in_place(episode, deadline)
        except Exception:  # the backends do not raise; a bug must not make the loop act blind
            log.exception("reading the fence of episode %s failed", episode.id)
            in_place = None
        if in_place:
            return None
        where = f"GPU {episode.uuid or episode.gpu} on node {episode.node}"
        if in_place is None:
            detail = f"the fence of {where} cannot be read now: nothing is done to it until it can"
            if episode.detail != detail:
                self.book.save("waiting", episode.moved(episode.state, detail=detail))
            return Outcome("deferred", f"{detail}; try again")
        detail = (
            f"returned by hand: {where} no longer carries gpulens' fence (DeviceTaintRule "
            f"{episode.fence}); nothing more is done for this episode"
        )
        moved = episode.moved(State.RETURNED_BY_HAND, returned_at=self.clock(), detail=detail)
        self.book.save("returned_by_hand", moved)
        return Outcome("already", f"{where} was returned by hand: its episode is closed, nothing done")

    # ---- return to service -----------------------------------------------------------------------

    def _maybe_return(self, node: str) -> None:
        """Return what is ready: each fenced GPU on its own, the node once all its node-level
        episodes are ready."""
        if not self.policy.return_to_service:
            return  # `gpulens remediate return NODE` (POST /-/return) does it
        episodes = self.book.of_node(node)
        for episode in [e for e in episodes if e.fence and e.state is State.READY]:
            self._return(node, [episode], "returned after the hold-down")
        whole = [e for e in episodes if not e.fence]
        if whole and all(e.state is State.READY for e in whole):
            self._return(node, whole, "returned after the hold-down")

    def return_node(self, node: str, force: bool = False) -> Outcome:
        """What `gpulens remediate return NODE` asks for: return the node if its episodes allow."""
        with self.locks.hold(node, self.policy.action_timeout_s) as held:
            if not held:
                return Outcome("deferred", f"an action on node {node} is running; try again")
            episodes = self.book.of_node(node)
            if not episodes:
                return Outcome("rejected", f"node {node} has no open episode")
            blocking = [e for e in episodes if e.state is not State.READY]
            if any(e.state is State.RMA and e.recovery is Recovery.RMA for e in blocking):
                return Outcome("rejected", f"node {node} has an RMA-class fault: it is never returned")
            if blocking and not force:
                states = ", ".join(sorted({e.state.value for e in blocking}))
                return Outcome(
                    "rejected", f"node {node} is not ready to return ({states}); --force overrides"
                )
            return self._return(node, episodes, "returned by a person" if blocking else "returned on request")

    def _return(self, node: str, episodes: list[Episode], why: str) -> Outcome:
        """Return the node (its node-level episodes) and lift the fences of its fenced GPUs."""
        fenced = [e for e in episodes if e.fence]
        whole = [e for e in episodes if not e.fence]
        outcome: Outcome | None = None
        for episode in fenced:
            outcome = self._return_some(node, [episode], why)
        if whole or outcome is None:
            outcome = self._return_some(node, whole, why)
        return outcome

    def _return_some(self, node: str, episodes: list[Episode], why: str) -> Outcome:
        """One return: of the node for node-level `episodes`, or of one fenced GPU."""
        deadline = Deadline(self.policy.action_timeout_s)
        stopped = self._stopped_by_node(node, episodes, deadline)
        if stopped is not None:
            return stopped
        fence = episodes[0] if len(episodes) == 1 and episodes[0].fence else None
        if self.dry_run:
            what = self.backend.describe_return_gpu(fence) if fence else self.backend.describe_return(node)
            outcome = Outcome("dry_run", f"DRY-RUN: {what}")
        elif fence is not None:
            outcome = self.backend.return_gpu(fence, deadline)
        else:
            outcome = self.backend.return_node(node, deadline)
        if outcome.result in ("applied", "already", "dry_run"):
            now = self.clock()
            for episode in episodes:
                moved = episode.moved(State.RETURNED, returned_at=now, detail=f"{why}: {outcome.detail}")
                self.book.save("returned", moved)
        else:
            for episode in episodes:
                self.book.save("return_failed", episode.moved(episode.state, detail=outcome.detail))
        return outcome
