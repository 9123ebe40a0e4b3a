"""Row families (what the collectors build): the same samples and bytes as prometheus_client's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gpulens.exporter.families import RowCounter, RowGauge, rows_of, sample_count
from gpulens.exporter.render import registry_for, render

label_values = st.text(st.characters(codec="utf-8"), max_size=8)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**53), max_value=2**53),
)
rows = st.lists(st.tuples(st.tuples(label_values, label_values), values), max_size=6)


def _library(families: list) -> tuple[bytes, bytes]:
    return generate_latest(registry_for(families)), generate_openmetrics(registry_for(families))


@given(rows)
def test_a_row_gauge_renders_the_bytes_of_a_library_gauge(data: list) -> None:
    ours, theirs = RowGauge("g", "help", ["b", "a"]), GaugeMetricFamily("g", "help", labels=["b", "a"])
    for labels, value in data:
        ours.add_metric(list(labels), value)
        theirs.add_metric(list(labels), value)
    rendered = render([ours])  # rows: the cached-prefix path
    assert (rendered.text, rendered.openmetrics) == _library([theirs])


@given(rows)
def test_a_row_counter_renders_the_bytes_of_a_library_counter(data: list) -> None:
    ours, theirs = (
        RowCounter("c_total", "help", ["x", "y"]),
        CounterMetricFamily("c_total", "help", labels=["x", "y"]),
    )
    for labels, value in data:
        ours.add_metric(list(labels), value)
        theirs.add_metric(list(labels), value)
    rendered = render([ours])
    assert (rendered.text, rendered.openmetrics) == _library([theirs])


def test_reading_samples_gives_the_library_samples_and_later_adds_follow() -> None:
    ours, theirs = RowGauge("g", "h", ["gpu"]), GaugeMetricFamily("g", "h", labels=["gpu"])
    for family in (ours, theirs):
        family.add_metric(["0"], 1.0)
    assert ours.samples == theirs.samples
    assert rows_of(ours) is None  # from the first read on, the samples are the truth
    for family in (ours, theirs):
        family.add_metric(["1"], 2.0)
    assert ours.samples == theirs.samples and sample_count(ours) == 2
    assert render([ours]).text == generate_latest(registry_for([theirs]))


def test_a_label_value_count_that_differs_from_the_names_renders_as_the_library_does() -> None:
    ours, theirs = RowGauge("g", "h", ["a", "b"]), GaugeMetricFamily("g", "h", labels=["a", "b"])
    for family in (ours, theirs):
        family.add_metric(["only-a"], 1.0)
    assert render([ours]).text == generate_latest(registry_for([theirs]))


def test_counting_samples_does_not_turn_rows_into_samples() -> None:
    family = RowGauge("g", "h", [])
    family.add_metric([], 1.0)
    assert sample_count(family) == 1
    assert rows_of(family) == ("g", (), [((), 1.0)])
