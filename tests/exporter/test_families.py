"""Row families (what the collectors build): the same samples and bytes as prometheus_client's."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gpulens.exporter.families import RowCounter, RowGauge, rows_of, sample_count
from gpulens.exporter.render import Renderer, registry_for, render

label_values = st.text(st.characters(codec="utf-8"), max_size=8)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**53), max_value=2**53),
)
# one sample: (label values, value)
Row = tuple[tuple[str, str], float]
rows = st.lists(st.tuples(st.tuples(label_values, label_values), values), max_size=6)


def _library(families: Iterable[Metric]) -> tuple[bytes, bytes]:
    return generate_latest(registry_for(families)), generate_openmetrics(registry_for(families))


@given(rows)
def test_a_row_gauge_renders_the_bytes_of_a_library_gauge(data: list[Row]) -> None:
    ours, theirs = RowGauge("g", "help", ["b", "a"]), GaugeMetricFamily("g", "help", labels=["b", "a"])
    for labels, value in data:
        ours.add_metric(list(labels), value)
        theirs.add_metric(list(labels), value)
    rendered = render([ours])  # rows: the cached-prefix path
    assert (rendered.text, rendered.openmetrics) == _library([theirs])


@given(rows)
def test_a_row_counter_renders_the_bytes_of_a_library_counter(data: list[Row]) -> None:
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


def _gauges(data: list[Row]) -> tuple[RowGauge, GaugeMetricFamily]:
    ours, theirs = RowGauge("g", "help", ["b", "a"]), GaugeMetricFamily("g", "help", labels=["b", "a"])
    for labels, value in data:
        ours.add_metric(list(labels), value)
        theirs.add_metric(list(labels), value)
    return ours, theirs


@given(st.lists(rows, min_size=2, max_size=4))
def test_a_renderer_kept_across_cycles_renders_each_cycle_as_the_library_does(
    cycles: list[list[Row]],
) -> None:
    renderer = Renderer()  # caches label sets, templates and bodies from one cycle to the next
    for data in cycles:
        ours, theirs = _gauges(data)
        rendered = renderer.render([ours])
        assert (rendered.text, rendered.openmetrics) == _library([theirs])


@given(st.lists(st.tuples(label_values, label_values), min_size=1, max_size=5, unique=True), st.data())
def test_the_same_label_sets_with_new_values_render_as_the_library_does(
    labels: list[tuple[str, str]], data: st.DataObject
) -> None:
    renderer = Renderer()
    for _ in range(3):  # same devices every cycle, values anywhere (small, past 1e6, inf, nan)
        cycle = [(pair, data.draw(values)) for pair in labels]
        ours, theirs = _gauges(cycle)
        assert renderer.render([ours]).text == generate_latest(registry_for([theirs]))


def test_percent_signs_in_label_values_are_rendered_literally() -> None:
    renderer = Renderer()
    for value in (1.0, 2.5e9):
        ours, theirs = _gauges([(("100%", "%s%r"), value)])
        assert renderer.render([ours]).text == generate_latest(registry_for([theirs]))


def test_renderers_share_no_cache() -> None:
    first, second = Renderer(), Renderer()
    ours, _ = _gauges([(("x", "y"), 1.0)])
    first.render([ours])
    other, theirs = _gauges([(("x", "z"), 2.0)])
    assert second.render([other]).text == generate_latest(registry_for([theirs]))
    assert (first.cached_label_sets, second.cached_label_sets) == (1, 1)  # shared caches would hold 2


def test_a_renderer_drops_its_caches_past_its_limit_and_still_renders_correctly() -> None:
    renderer = Renderer(prefix_limit=3)
    for cycle in range(4):
        data = [((f"{cycle}-{i}", "v"), float(i)) for i in range(3)]
        ours, theirs = _gauges(data)
        assert renderer.render([ours]).text == generate_latest(registry_for([theirs]))
        assert renderer.cached_label_sets <= 3
