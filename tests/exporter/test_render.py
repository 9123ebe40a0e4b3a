"""Content negotiation for /metrics: OpenMetrics via Accept, gzip via Accept-Encoding."""

from __future__ import annotations

import gzip
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.exporter.render import accepts_gzip, render, wants_openmetrics


def test_prometheus_default_accept_header_selects_openmetrics() -> None:
    accept = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    assert wants_openmetrics(accept)


def test_plain_or_missing_accept_selects_text() -> None:
    assert not wants_openmetrics(None)
    assert not wants_openmetrics("text/plain")
    assert not wants_openmetrics("*/*")


def test_openmetrics_with_q_zero_or_unknown_version_is_not_selected() -> None:
    assert not wants_openmetrics("application/openmetrics-text;q=0")
    assert not wants_openmetrics("application/openmetrics-text;version=2.0.0")


def test_gzip_negotiation() -> None:
    assert accepts_gzip("gzip")
    assert accepts_gzip("deflate, gzip;q=0.5")
    assert not accepts_gzip("gzip;q=0")
    assert not accepts_gzip(None)
    assert not accepts_gzip("identity")


def test_rendered_variants_carry_the_same_samples() -> None:
    g = GaugeMetricFamily("gpu_up", "h", labels=["gpu"])
    g.add_metric(["0"], 1)
    c = CounterMetricFamily("gpu_xid_errors_total", "h", labels=["gpu"])
    c.add_metric(["0"], 3)
    rendered = render([g, c])
    assert gzip.decompress(rendered.text_gzip) == rendered.text
    assert gzip.decompress(rendered.openmetrics_gzip) == rendered.openmetrics
    assert b'gpu_xid_errors_total{gpu="0"} 3.0' in rendered.text
    assert rendered.openmetrics.endswith(b"# EOF\n")
    assert b"# TYPE gpu_xid_errors counter" in rendered.openmetrics


def _library_render(families: Iterable[Metric]) -> tuple[bytes, bytes]:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from gpulens.exporter.render import registry_for

    registry = registry_for(families)
    return generate_latest(registry), generate_openmetrics(registry)


def test_fast_writer_is_byte_identical_to_prometheus_client_on_a_whole_node(tmp_path) -> None:
    from gpulens.sim.install import simulated
    from tests.exporter.conftest import make_exporter
    from tests.sim.static_node import example_node

    with simulated(example_node()) as lib:
        exporter = make_exporter(lib.node)
        try:
            families = exporter.families(exporter.sample_once())
        finally:
            exporter.close()
    rendered = render(families)
    assert (rendered.text, rendered.openmetrics) == _library_render(families)


def test_fast_writer_escapes_like_prometheus_client() -> None:
    g = GaugeMetricFamily("odd", 'help with \\ backslash, "quotes"\nand newline', labels=["a", "b"])
    g.add_metric(['quo"te', "back\\slash\nnewline"], float("nan"))
    g.add_metric(["inf", "big"], float("inf"))
    g.add_metric(["large", "x"], 123456789012.0)
    g.add_metric(["neg", "x"], -1.5e-7)
    families = [g]
    rendered = render(families)
    assert (rendered.text, rendered.openmetrics) == _library_render(families)


def test_families_the_fast_writer_does_not_handle_fall_back_to_the_library() -> None:
    from prometheus_client.core import InfoMetricFamily

    info = InfoMetricFamily("thing", "h", labels=["a"])
    info.add_metric(["x"], {"k": "v"})
    rendered = render([info])
    assert (rendered.text, rendered.openmetrics) == _library_render([info])


def test_negotiation_of_a_header_too_long_to_remember_answers_the_same() -> None:
    accept = "text/html;q=0.1," * 100 + "application/openmetrics-text;version=1.0.0"
    assert wants_openmetrics(accept) and wants_openmetrics(accept.split(",", 1)[1])
    assert not accepts_gzip("identity," * 200 + "gzip;q=0")
    assert accepts_gzip("identity," * 200 + "gzip")


def test_a_family_rendered_again_with_one_changed_value_shows_the_new_value() -> None:
    from gpulens.exporter.families import RowGauge

    def family(power: float) -> RowGauge:
        g = RowGauge("gpu_power_watts", "h", labels=["gpu"])
        g.add_metric(["0"], 100.0)
        g.add_metric(["1"], power)
        return g

    assert b'gpu_power_watts{gpu="1"} 200.0' in render([family(200.0)]).text
    assert b'gpu_power_watts{gpu="1"} 200.0' in render([family(200.0)]).text  # unchanged rows
    again = render([family(250.5)]).text
    assert b'gpu_power_watts{gpu="1"} 250.5' in again
    assert b"200.0" not in again


def test_a_sample_is_compressed_only_when_a_scrape_asks_for_gzip() -> None:
    g = GaugeMetricFamily("gpu_up", "h", labels=["gpu"])
    g.add_metric(["0"], 1)
    rendered = render([g])
    assert "text_gzip" not in vars(rendered) and "openmetrics_gzip" not in vars(rendered)
    first = rendered.body(openmetrics=False, gzipped=True)
    assert rendered.body(openmetrics=False, gzipped=True) is first  # kept for the next scrapes
    assert "openmetrics_gzip" not in vars(rendered)
