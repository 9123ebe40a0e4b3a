"""The receiver's own Prometheus metrics, on a private registry per service instance."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from gpulens.httpd.metrics import ServerCollector
from gpulens.httpd.server import Server
from gpulens.remediate.breaker import BreakerState
from gpulens.remediate.episodes import Episode

# The outcome an episode is counted under when it reaches a state (once per episode).
OUTCOMES = {
    "returned": "returned",
    "returned_by_hand": "returned_by_hand",
    "rma": "rma",
    "escalated": "escalated",
    "dry_run": "dry_run",
    "closed": "closed",
}


class RemediateMetrics:
    def __init__(self, breaker_state: Callable[[], BreakerState], dry_run: bool) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._server_collector: ServerCollector | None = None
        self.actions = Counter(
            "gpulens_remediate_actions",
            "Alerts handled, by isolation kind and result.",
            ["kind", "result"],
            registry=self.registry,
        )
        self.requests = Counter(
            "gpulens_remediate_requests",
            "Webhook requests, by HTTP status code.",
            ["code"],
            registry=self.registry,
        )
        breaker_open = Gauge(
            "gpulens_remediate_breaker_open",
            "1 while the circuit breaker refuses isolations.",
            registry=self.registry,
        )
        breaker_open.set_function(lambda: float(breaker_state().open))
        in_window = Gauge(
            "gpulens_remediate_nodes_isolated_in_window",
            "Distinct nodes isolated within the breaker's window.",
            registry=self.registry,
        )
        in_window.set_function(lambda: float(len(breaker_state().nodes_in_window)))
        limit = Gauge(
            "gpulens_remediate_breaker_max_nodes",
            "Nodes that may be isolated within the window before the breaker opens.",
            registry=self.registry,
        )
        limit.set(breaker_state().max_nodes)
        self.breaker_save_errors = Counter(
            "gpulens_remediate_breaker_save_errors",
            "Times the circuit breaker's state could not be written to its store.",
            registry=self.registry,
        )
        mode = Gauge("gpulens_remediate_dry_run", "1 when actions are only logged.", registry=self.registry)
        mode.set(1 if dry_run else 0)
        # ---- the fault loop (episodes) ----------------------------------------------------------
        self.episodes = Counter(
            "gpulens_remediate_episodes",
            "Fault episodes by recovery class and the outcome they reached (counted once each).",
            ["recovery", "outcome"],
            registry=self.registry,
        )
        buckets = (10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, 259200, 604800)
        self.time_to_isolate = Histogram(
            "gpulens_remediate_time_to_isolate_seconds",
            "From the alert's start (detection) to the node's isolation.",
            ["recovery"],
            buckets=buckets,
            registry=self.registry,
        )
        self.time_to_recover = Histogram(
            "gpulens_remediate_time_to_recover_seconds",
            "From detection to healthy through the hold-down after the recovery action (ready to return).",
            ["recovery"],
            buckets=buckets,
            registry=self.registry,
        )
        self.time_to_return = Histogram(
            "gpulens_remediate_time_to_return_seconds",
            "From detection to the node's return to service.",
            ["recovery"],
            buckets=buckets,
            registry=self.registry,
        )
        self._open_episodes: Callable[[], list[Episode]] = list
        isolated = Gauge(
            "gpulens_remediate_isolated_nodes",
            "Nodes held out of service by open fault episodes now (dry-run episodes excluded).",
            registry=self.registry,
        )
        isolated.set_function(
            lambda: float(
                len({e.node for e in self._open_episodes() if e.state.value != "dry_run" and not e.fence})
            )
        )
        fenced = Gauge(
            "gpulens_remediate_fenced_gpus",
            "GPUs fenced by open fault episodes now (DRA device taints; their nodes stay in service).",
            registry=self.registry,
        )
        fenced.set_function(
            lambda: float(
                len(
                    {
                        (e.node, e.uuid)
                        for e in self._open_episodes()
                        if e.state.value != "dry_run" and e.fence
                    }
                )
            )
        )
        self.isolations = Counter(
            "gpulens_remediate_isolations",
            "Fault episodes opened with an isolation, by what was taken out: one GPU (fenced) or its node.",
            ["scope"],
            registry=self.registry,
        )
        for scope in ("gpu", "node"):
            self.isolations.labels(scope=scope)
        self._clock: Callable[[], float] = time.time
        self._kept_closed_s = 0.0  # GPU-seconds kept by fences of closed episodes
        self._kept_lock = threading.Lock()
        self.registry.register(_KeptCollector(self._kept_seconds))
        self.diagnostics = Counter(
            "gpulens_remediate_diagnostics",
            "Return diagnostics run on a node (dcgmi diag or the NVML check), by verdict.",
            ["result"],
            registry=self.registry,
        )
        for result in ("passed", "failed", "error"):
            self.diagnostics.labels(result=result)
        self.open_by_state = Gauge(
            "gpulens_remediate_episodes_open",
            "Open fault episodes by state.",
            ["state"],
            registry=self.registry,
        )

    def bind_queue(self, stats: Callable[[], Any]) -> None:
        """The queue's gauges, read from `stats()` (queue.QueueStats) at each scrape."""
        pending = Gauge(
            "gpulens_remediate_queue_notifications",
            "Notifications acknowledged and not yet acted on.",
            registry=self.registry,
        )
        pending.set_function(lambda: float(stats().pending))
        size = Gauge(
            "gpulens_remediate_queue_bytes",
            "Size of the notifications waiting in the queue (their queue lines).",
            registry=self.registry,
        )
        size.set_function(lambda: float(stats().bytes))

    def bind_episodes(
        self, open_episodes: Callable[[], list[Episode]], clock: Callable[[], float] | None = None
    ) -> None:
        """Where the gauges of open episodes read from (the EpisodeBook), and its clock."""
        self._open_episodes = open_episodes
        if clock is not None:
            self._clock = clock

    def _kept_seconds(self) -> float:
        """Healthy GPU-seconds kept in service by GPU fences: each fenced episode's other GPUs for
        as long as it was (closed episodes) or has been (open ones) fenced instead of its node."""
        now = self._clock()
        running = sum(
            e.kept_gpus * max(now - (e.isolated_at or now), 0.0)
            for e in self._open_episodes()
            if e.fence and e.state.value != "dry_run"
        )
        with self._kept_lock:
            return self._kept_closed_s + running

    def episodes_resumed(self, episodes: list[Episode]) -> None:
        """Count the open episodes a restart took over (from the audit log or the nodes) in the
        open-state gauge: their later steps move them out of it, which would go below 0 otherwise.
        Nothing else is observed again: their isolation was counted by the receiver that did it."""
        for episode in episodes:
            if episode.state.open:
                self.open_by_state.labels(state=episode.state.value).inc()

    def episode_changed(self, before: Any, after: Any) -> None:
        """Observe one episode step: outcome counts, durations, the open-state gauge."""
        recovery = after.recovery.value
        if before is not None and before.state is after.state:
            return
        if before is not None:
            self.open_by_state.labels(state=before.state.value).dec()
            if before.state.open and not after.state.open and after.fence and after.isolated_at is not None:
                ended = after.returned_at if after.returned_at is not None else self._clock()
                with self._kept_lock:
                    self._kept_closed_s += after.kept_gpus * max(ended - after.isolated_at, 0.0)
        if after.state.open:
            self.open_by_state.labels(state=after.state.value).inc()
        outcome = OUTCOMES.get(after.state.value)
        if outcome:
            self.episodes.labels(recovery=recovery, outcome=outcome).inc()
        if before is None and after.isolated_at is not None and after.state.value != "dry_run":
            self.isolations.labels(scope="gpu" if after.fence else "node").inc()
            self.time_to_isolate.labels(recovery=recovery).observe(
                max(after.isolated_at - after.detected_at, 0)
            )
        if after.state.value == "ready" and after.recovered_at is not None:
            self.time_to_recover.labels(recovery=recovery).observe(
                max(after.recovered_at - after.detected_at, 0)
            )
        if after.state.value == "returned" and after.returned_at is not None:
            self.time_to_return.labels(recovery=recovery).observe(
                max(after.returned_at - after.detected_at, 0)
            )

    def watch_server(self, server: Server) -> None:
        """Serve `server`'s own series (gpulens.httpd.metrics) with these; the last one wins."""
        if self._server_collector is not None:
            self.registry.unregister(self._server_collector)
        self._server_collector = ServerCollector(server)
        self.registry.register(self._server_collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _KeptCollector(Collector):
    """`gpulens_remediate_healthy_gpus_kept_seconds_total`, computed at each scrape."""

    def __init__(self, seconds: Callable[[], float]) -> None:
        self._seconds = seconds

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "gpulens_remediate_healthy_gpus_kept_seconds",
            "Healthy GPU-seconds kept in service by fencing one faulty GPU instead of its node "
            "(the node's other GPUs times the time fenced); / 3600 for GPU-hours.",
            value=self._seconds(),
        )
