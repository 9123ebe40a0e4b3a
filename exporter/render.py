"""Turn metric families into the bytes `/metrics` serves, once per sample.

Both formats, each plain and gzip-compressed, are rendered right after sampling so that a scrape is
a dictionary lookup and a socket write, whatever the number of concurrent scrapers.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclass(frozen=True)
class Rendered:
    text: bytes
    text_gzip: bytes
    openmetrics: bytes
    openmetrics_gzip: bytes

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        if openmetrics:
            return self.openmetrics_gzip if gzipped else self.openmetrics
        return self.text_gzip if gzipped else self.text


class _Families(Collector):
    """A collector holding families already built for one snapshot."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def registry_for(families: Iterable[Metric]) -> CollectorRegistry:
    """A fresh private registry serving exactly `families` (nothing global is ever registered)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return registry


def render(families: Iterable[Metric]) -> Rendered:
    registry = registry_for(families)
    text = generate_latest(registry)
    openmetrics = generate_openmetrics(registry)
    return Rendered(
        text=text,
        text_gzip=gzip.compress(text, compresslevel=5, mtime=0),
        openmetrics=openmetrics,
        openmetrics_gzip=gzip.compress(openmetrics, compresslevel=5, mtime=0),
    )


def wants_openmetrics(accept: str | None) -> bool:
    """True when the Accept header asks for OpenMetrics 1.0 (or unversioned) with q > 0."""
    for part in (accept or "").split(","):
        media, *params = [p.strip() for p in part.split(";")]
        if media.lower() != "application/openmetrics-text":
            continue
        options = dict(p.split("=", 1) for p in params if "=" in p)
        if options.get("version", "1.0.0") not in ("1.0.0", "0.0.1"):
            continue
        try:
            if float(options.get("q", "1")) <= 0:
                continue
        except ValueError:
            continue
        return True
    return False


def accepts_gzip(accept_encoding: str | None) -> bool:
    for part in (accept_encoding or "").split(","):
        coding, *params = [p.strip() for p in part.split(";")]
        if coding.lower() not in ("gzip", "*"):
            continue
        q = next((p.split("=", 1)[1] for p in params if p.startswith("q=")), "1")
        try:
            if float(q) > 0:
                return True
        except ValueError:
            continue
    return False
