"""`process_*` and `python_*`: the self-metrics every Prometheus exporter serves, on both servers.

prometheus_client's own collectors (ProcessCollector: CPU seconds, resident and virtual memory,
open and maximum descriptors, start time, read from /proc; PlatformCollector: `python_info`;
GCCollector: the collector's generations), so the names, help and labels are the ones dashboards
and alerts written for other Python exporters expect. Every label takes values from a fixed list
(`generation` 0-2, `python_info`'s version), so they add a constant number of series.
`--web.disable-exporter-metrics` leaves them out, as node_exporter's flag of that name does.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import Metric

PREFIXES = ("process_", "python_")


def register(registry: CollectorRegistry) -> None:
    """Add the three collectors to `registry` (the receiver's: read at every scrape)."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


class SelfMetrics:
    """The same families as a list, for a server that renders its families itself (the exporter)."""

    def __init__(self) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        register(self._registry)

    def families(self) -> list[Metric]:
        """The families as of now (ProcessCollector reads /proc/self at each call)."""
        return list(self._registry.collect())
