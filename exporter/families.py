"""Metric families that keep their samples as rows of label values, for the renderer's fast path.

Collectors build one family per metric and add a sample per device every cycle (about 2,000 on
the `large` node). prometheus_client's `add_metric` makes a `Sample` and a label dict per call,
and rendering then re-joins, sorts and escapes those dicts per sample. These families are still
prometheus_client `GaugeMetricFamily` / `CounterMetricFamily` (the collector pattern, the
registry and the library's writers keep working on them) but `add_metric` only appends
`(label values, value)`; `render.py` formats the rows with a cached `name{labels} ` prefix per
label-value tuple, which repeats from cycle to cycle.

`samples` is there for anyone who asks: the first read turns the rows into `Sample`s, which are
from then on the truth (later `add_metric` calls append `Sample`s as the library does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

Row = tuple[tuple[str, ...], float]


class _Rows:
    """The row store shared by both families: `_rows` is None once `samples` has been read."""

    _rows: list[Row] | None
    _samples: list[Sample]
    _labelnames: tuple[str, ...]
    name: str

    def _init_rows(self) -> None:
        self._rows = [] if not self._samples else None

    @property
    def samples(self) -> list[Sample]:
        rows = self._rows
        if rows is not None:
            name, names = self.sample_name, self._labelnames
            self._samples = [Sample(name, dict(zip(names, values, strict=False)), v) for values, v in rows]
            self._rows = None
        return self._samples

    @samples.setter
    def samples(self, value: list[Sample]) -> None:  # Metric.__init__ assigns []
        self._samples = value
        self._rows = None

    @property
    def sample_name(self) -> str:
        return self.name

    def rows(self) -> list[Row] | None:
        """The rows, while nobody has read `samples`; None after (then use `samples`)."""
        return self._rows

    def __len__(self) -> int:
        rows = self._rows
        return len(self._samples) if rows is None else len(rows)


class RowGauge(_Rows, GaugeMetricFamily):
    def __init__(self, name: str, documentation: str, labels: Sequence[str], unit: str = "") -> None:
        GaugeMetricFamily.__init__(self, name, documentation, labels=labels, unit=unit)
        self._init_rows()

    def add_metric(self, labels: Sequence[str], value: float, timestamp: Any = None) -> None:
        rows = self._rows
        if rows is None or timestamp is not None:
            GaugeMetricFamily.add_metric(self, labels, value, timestamp)
        else:
            rows.append((tuple(labels), value))


class RowCounter(_Rows, CounterMetricFamily):
    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        CounterMetricFamily.__init__(self, name, documentation, labels=labels)
        self._init_rows()

    @property
    def sample_name(self) -> str:
        return self.name + "_total"

    def add_metric(
        self,
        labels: Sequence[str],
        value: float,
        created: float | None = None,
        timestamp: Any = None,
        exemplar: Any = None,
    ) -> None:
        rows = self._rows
        if rows is None or created is not None or timestamp is not None or exemplar is not None:
            CounterMetricFamily.add_metric(self, labels, value, created, timestamp, exemplar)
        else:
            rows.append((tuple(labels), value))


def sample_count(family: Metric) -> int:
    """How many samples `family` has, without turning rows into `Sample`s."""
    return len(family) if isinstance(family, _Rows) else len(family.samples)


def rows_of(family: Metric) -> tuple[str, tuple[str, ...], list[Row]] | None:
    """(sample name, label names, rows) of a row family nobody has read the samples of, else None."""
    if isinstance(family, _Rows):
        rows = family.rows()
        if rows is not None:
            return family.sample_name, family._labelnames, rows
    return None
