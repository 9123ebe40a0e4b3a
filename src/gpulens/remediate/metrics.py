"""The receiver's own Prometheus metrics, on a private registry per service instance."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from gpulens.remediate.breaker import BreakerState


class RemediateMetrics:
    def __init__(self, breaker_state: Callable[[], BreakerState], dry_run: bool) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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

    def render(self) -> bytes:
        return generate_latest(self.registry)
