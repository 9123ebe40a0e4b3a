"""Turn metric families into the bytes `/metrics` serves, once per sample.

Both formats are rendered right after sampling so that a scrape is a dictionary lookup and a socket
write, whatever the number of concurrent scrapers. Each format's gzip is made by the first scrape
of a sample that asks for it and kept for the rest: an exporter sampling more often than it is
scraped (or not scraped at all in a window) no longer compresses both formats every cycle.
"""

from __future__ import annotations

import functools
import gzip
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from gpulens.exporter.families import Row, rows_of
from gpulens.httpd.negotiate import Offer, accepts_coding, choose_media

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclass(frozen=True)
class Rendered:
    text: bytes
    openmetrics: bytes

    # computed once, by whichever scrape asks first (cached_property writes the instance dict, which
    # a frozen dataclass allows; two racing scrapes at worst compress twice, with the same result)
    @cached_property
    def text_gzip(self) -> bytes:
        return gzip.compress(self.text, compresslevel=GZIP_LEVEL, mtime=0)

    @cached_property
    def openmetrics_gzip(self) -> bytes:
        return gzip.compress(self.openmetrics, compresslevel=GZIP_LEVEL, mtime=0)

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


# zlib level 1: on the `large` node's 320 KB page it compresses in 1.5 ms instead of 3.5 ms (level 5)
# for a body 16 % larger (28.6 KB instead of 24.7 KB); a format is compressed once per sample, when
# first scraped with gzip
GZIP_LEVEL = 1

_LEGACY_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _fast_render(families: list[Metric], render_rows: _RowsWriter) -> tuple[bytes, bytes] | None:
    """Both formats in one pass for plain gauge/counter families, byte-identical to prometheus_client.

    prometheus_client's writers re-validate every label name of every sample, which costs more
    than the whole NVML sample on a large node; our families are known-good, so names are checked
    once per family. Row families (`families.py`, what the collectors build) skip the per-sample
    dicts: `render_rows` formats them (a `Renderer`'s, which keeps its caches across cycles).
    Anything else (units, timestamps, exemplars, other types) returns None and the library's
    writers are used.
    """
    text: list[str] = []
    om: list[str] = []
    for family in families:
        if family.type not in ("gauge", "counter") or family.unit or not _LEGACY_NAME.match(family.name):
            return None
        rows = rows_of(family)
        if rows is not None:
            # a row counter's samples are all `<name>_total`: a valid OpenMetrics counter
            body = render_rows(*rows)
            if body is None:
                return None
            text_name, om_type = (
                (family.name + "_total", "counter")
                if family.type == "counter"
                else (
                    family.name,
                    family.type,
                )
            )
        else:
            # counters named like dcgm-exporter's (no `_total` on the samples) keep their own name in
            # the text format's TYPE line, or Prometheus would read the samples as untyped
            totals = family.type == "counter" and all(
                s.name == family.name + "_total" for s in family.samples
            )
            text_name = family.name + "_total" if totals else family.name
            om_type = openmetrics_type(family)
            body = _render_samples(family.samples)
            if body is None:
                return None
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        text.append(f"# HELP {text_name} {doc}\n# TYPE {text_name} {family.type}\n")
        om_doc = doc.replace('"', r"\"")
        om.append(f"# HELP {family.name} {om_doc}\n# TYPE {family.name} {om_type}\n")
        text.append(body)
        om.append(body)
    om.append("# EOF\n")
    return "".join(text).encode("utf-8"), "".join(om).encode("utf-8")


def _render_samples(samples: list[Sample]) -> str | None:
    lines: list[str] = []
    checked: frozenset[str] | None = None
    order: list[str] = []
    for sample in samples:
        if sample.timestamp is not None or sample.exemplar is not None or sample.name.endswith("_created"):
            return None
        labels = sample.labels
        if labels:
            keys = frozenset(labels)
            if keys != checked:  # label names checked and sorted once per distinct set
                if not all(_LEGACY_NAME.match(k) for k in keys):
                    return None
                checked = keys
                order = sorted(keys)
            label_text = "{" + ",".join([f'{k}="{_escape(labels[k])}"' for k in order]) + "}"
        else:
            label_text = ""
        lines.append(f"{sample.name}{label_text} {_go_float(sample.value)}\n")
    return "".join(lines)


def _prefix(name: str, labelnames: tuple[str, ...], values: tuple[str, ...]) -> str:
    if not labelnames:
        return name + " "
    pairs = sorted(zip(labelnames, values, strict=True))
    return name + "{" + ",".join([f'{k}="{_escape(v)}"' for k, v in pairs]) + "} "


# Go's %g switches to an exponent at 1e6 where Python's repr waits for 1e16 (floatToGoString)
_GO_EXPONENT = 1e6


def _go_float(value: float) -> str:
    """`floatToGoString`, with its common case (a finite float below 1e6 or an exponent) inline."""
    text = repr(float(value))
    if text.find(".") > 6 or "n" in text:  # large values (Go's exponent), inf, nan
        go: str = floatToGoString(value)
        return go
    return text


def openmetrics_type(family: Metric) -> str:
    """The family's OpenMetrics type. A counter whose samples lack `_total` (dcgm-exporter's names,
    kept for compatibility) is not a valid OpenMetrics counter: OpenMetrics requires the suffix,
    and a strict parser rejects the family ("Clashing name"). It is typed `unknown` there, which
    keeps the name and the values; the Prometheus text format still says `counter`, as
    dcgm-exporter does. PromQL treats both alike (rate() works on either)."""
    if family.type == "counter" and any(not s.name.endswith(("_total", "_created")) for s in family.samples):
        return "unknown"
    return family.type


def _openmetrics_safe(family: Metric) -> Metric:
    if openmetrics_type(family) == family.type:
        return family
    copy = Metric(family.name, family.documentation, "unknown", family.unit)
    copy.samples = list(family.samples)
    return copy


RowsKey = tuple[str, tuple[str, ...]]  # (sample name, label names)
_RowsWriter = Callable[[str, tuple[str, ...], list[Row]], "str | None"]


@dataclass
class _Shape:
    """A row family's label sets of the last cycle, in order, and the `%` template that puts each
    value's text after its `name{labels} ` prefix."""

    labels: tuple[tuple[str, ...], ...]
    template: str


class Renderer:
    """Renders metric families to both formats, keeping what repeats between cycles: one per
    exporter (never module state), so exporters in one process do not share or grow each other's
    caches.

    Per row family (`families.py`): the label sets repeat from cycle to cycle (one per device and
    family), so the family's `%r` template is built once per sequence of label sets (each prefix
    formatted once, `_prefixes`) and a cycle's body is one `template % texts`, the texts made by
    `repr` in C when the family's values, checked in bulk, are all finite and below Go's exponent
    threshold, else value by value (`_go_float`). About half of a `large` cycle's families
    (info families, limits, thresholds, idle counters) have exactly the rows of the cycle before,
    which one list comparison finds (`_bodies`; floats compare equal across 0.0 and -0.0 only, which
    renders as "0.0" or "-0.0" whichever came first: the same value to every reader). Caches are
    dropped when the label sets seen pass `prefix_limit` (churning processes or jobs add sets).
    """

    def __init__(self, prefix_limit: int = 200_000) -> None:
        self._prefix_limit = prefix_limit
        self._prefix_count = 0
        self._prefixes: dict[RowsKey, dict[tuple[str, ...], str]] = {}
        self._shapes: dict[RowsKey, _Shape] = {}
        self._bodies: dict[RowsKey, tuple[list[Row], str]] = {}

    @property
    def cached_label_sets(self) -> int:
        """How many label sets this renderer holds formatted: at most `prefix_limit`, reset to what
        is current when the limit would be passed (what bounds its memory under churn)."""
        return self._prefix_count

    def render(self, families: Iterable[Metric]) -> Rendered:
        family_list = list(families)
        fast = _fast_render(family_list, self._render_rows)
        if fast is not None:
            text, openmetrics = fast
        else:
            text = generate_latest(registry_for(family_list))
            openmetrics = generate_openmetrics(registry_for([_openmetrics_safe(f) for f in family_list]))
        return Rendered(text=text, openmetrics=openmetrics)

    def _render_rows(self, name: str, labelnames: tuple[str, ...], rows: list[Row]) -> str | None:
        key = (name, labelnames)
        last = self._bodies.get(key)
        if last is not None and last[0] == rows:
            return last[1]
        body = self._format_rows(key, rows)
        if body is not None:
            self._bodies[key] = (rows, body)
        return body

    def _format_rows(self, key: RowsKey, rows: list[Row]) -> str | None:
        if not rows:
            return ""
        labels, raw_values = zip(*rows, strict=True)
        shape = self._shapes.get(key)
        if shape is None or shape.labels != labels:
            prefixes = self._prefixes_of(key, labels)
            if prefixes is None:
                return None
            shape = self._shapes[key] = _Shape(
                labels, "".join([p.replace("%", "%%") + "%s\n" for p in prefixes])
            )
        values = tuple(map(float, raw_values))
        if max(values) < _GO_EXPONENT and min(values) != -math.inf and not any(map(math.isnan, values)):
            return shape.template % tuple(map(repr, values))  # what Go prints below 1e6
        return shape.template % tuple(map(_go_float, values))

    def _prefixes_of(self, key: RowsKey, labels: tuple[tuple[str, ...], ...]) -> list[str] | None:
        """Each label set's `name{k="v",...} ` prefix; None when the library's writers must render
        the family (a repeated or non-legacy label name, a label set of the wrong length)."""
        name, labelnames = key
        if self._prefix_count + len(labels) > self._prefix_limit:
            # label sets of gone processes or jobs pile up otherwise; what is current is remade
            self._prefixes.clear()
            self._shapes.clear()
            self._bodies.clear()
            self._prefix_count = 0
        prefixes = self._prefixes.get(key)
        if prefixes is None:
            # a repeated label name collapses in the library's label dict: left to its writers
            if len(set(labelnames)) != len(labelnames) or not all(_LEGACY_NAME.match(k) for k in labelnames):
                return None
            prefixes = self._prefixes[key] = {}
        out: list[str] = []
        for values in labels:
            prefix = prefixes.get(values)
            if prefix is None:
                if len(values) != len(labelnames):  # zip() in the library drops or ignores the rest
                    return None
                prefix = prefixes[values] = _prefix(name, labelnames, values)
                self._prefix_count += 1
            out.append(prefix)
        return out


def render(families: Iterable[Metric]) -> Rendered:
    """Both formats of `families`, without caches kept for a next cycle (an exporter keeps a
    `Renderer`)."""
    return Renderer().render(families)


# what /metrics can send, in order of preference on a tie (the text format for */*)
OFFERS = [
    Offer("text", "plain", (("version", "0.0.4"),)),
    Offer("application", "openmetrics-text", (("version", "1.0.0"),)),
    Offer("application", "openmetrics-text", (("version", "0.0.1"),)),  # the same exposition
]


# Negotiation answers for header values up to this length are remembered (least recently used):
# Prometheus sends the same Accept every scrape, and negotiating it costs ~80 us per request.
_CACHED_HEADER = 1024


def wants_openmetrics(accept: str | None) -> bool:
    """True when Accept, negotiated per RFC 9110 (q-values, specificity), prefers OpenMetrics.

    When nothing offered is acceptable the text format is sent anyway, as prometheus_client does.
    """
    if accept is None or len(accept) <= _CACHED_HEADER:
        return _wants_openmetrics(accept)
    return _negotiate_openmetrics(accept)


@functools.lru_cache(maxsize=128)
def _wants_openmetrics(accept: str | None) -> bool:
    return _negotiate_openmetrics(accept)


def _negotiate_openmetrics(accept: str | None) -> bool:
    chosen = choose_media(accept, OFFERS)
    return chosen is not None and chosen.subtype == "openmetrics-text"


def accepts_gzip(accept_encoding: str | None) -> bool:
    if accept_encoding is None or len(accept_encoding) <= _CACHED_HEADER:
        return _accepts_gzip(accept_encoding)
    return accepts_coding(accept_encoding, "gzip")


@functools.lru_cache(maxsize=128)
def _accepts_gzip(accept_encoding: str | None) -> bool:
    return accepts_coding(accept_encoding, "gzip")
