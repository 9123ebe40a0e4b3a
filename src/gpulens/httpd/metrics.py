"""The server's own series: what its limits did, for the exporter's and the receiver's /metrics.

Built like the exporter's meta collector (exporter/collectors/exporter.py): fresh prometheus_client
families from counters the server keeps anyway (`Stats`), read from another thread without a lock
(plain ints written by the loop thread only). Every label takes values from a fixed list, so a
flood of connections or malformed requests adds samples to counters, never series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpulens.httpd.server import REFUSAL_CODES, Server

# why a connection was closed by the server rather than by its client
CLOSE_REASONS = ("idle_evicted", "unread_evicted", "refused_at_cap", "timed_out")


def families(server: Server) -> list[Metric]:
    stats = server.stats
    limits = server.limits
    accepted = CounterMetricFamily(
        "gpulens_http_connections_accepted_total", "Connections accepted by the HTTP server.", labels=[]
    )
    accepted.add_metric([], float(stats.accepted))
    closed = CounterMetricFamily(
        "gpulens_http_connections_closed_total",
        "Connections the HTTP server closed itself, by reason: idle_evicted (the oldest idle one, to"
        " make room at the connection cap or when out of file descriptors), unread_evicted (the one"
        " whose answer waited longest for its reader, when none is idle), refused_at_cap (closed"
        " at once: at the cap with nothing idle), timed_out (a head, body, idle, write or linger"
        " deadline).",
        labels=["reason"],
    )
    closed_counts = (
        stats.evicted - stats.stalled_closed,
        stats.stalled_closed,
        stats.refused,
        stats.timed_out,
    )
    for reason, count in zip(CLOSE_REASONS, closed_counts, strict=True):
        closed.add_metric([reason], float(count))
    backoffs = CounterMetricFamily(
        "gpulens_http_accept_backoffs_total",
        "Times the HTTP server stopped accepting for a moment: out of file descriptors with nothing"
        " idle to close.",
        labels=[],
    )
    backoffs.add_metric([], float(stats.accept_backoffs))
    rejected = CounterMetricFamily(
        "gpulens_http_requests_rejected_total",
        "Requests the HTTP server answered itself with an error, by status: malformed or ambiguous"
        " framing (400), head or body too slow (408), length required (411), body too large (413),"
        " request line or head too large (414, 431), unsupported Expect (417), over"
        " --web.max-requests or the per-address limit (503), not HTTP/1.x (505).",
        labels=["code"],
    )
    counts = dict(stats.refused_requests)
    for code in REFUSAL_CODES:
        rejected.add_metric([str(code)], float(counts.get(code, 0)))
    open_now = GaugeMetricFamily(
        "gpulens_http_connections_open", "Connections open now (at the last render).", labels=[]
    )
    open_now.add_metric([], float(server.open_connections()))
    open_max = GaugeMetricFamily(
        "gpulens_http_connections_max",
        "Most open connections (--web.max-connections, capped at half the open-files limit).",
        labels=[],
    )
    open_max.add_metric([], float(server.max_connections))
    in_flight = GaugeMetricFamily(
        "gpulens_http_requests_in_flight",
        "Requests being handled now (an answer being sent holds no slot).",
        labels=[],
    )
    in_flight.add_metric([], float(server.in_flight))
    in_flight_max = GaugeMetricFamily(
        "gpulens_http_requests_in_flight_max",
        "Most requests handled at once (--web.max-requests; 0: no limit).",
        labels=[],
    )
    in_flight_max.add_metric([], float(limits.max_requests))
    return [accepted, closed, backoffs, rejected, open_now, open_max, in_flight, in_flight_max]


class ServerCollector(Collector):
    """The same families for a prometheus_client registry (the receiver's)."""

    def __init__(self, server: Server) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        return iter(families(self._server))
