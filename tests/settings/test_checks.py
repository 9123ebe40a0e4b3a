"""The setting checks both servers share (`gpulens.settings`): what each accepts and the words of
its refusal, which `check` prefixes with the flag."""

from __future__ import annotations

from gpulens.settings import at_least, http_url, telemetry_path


def test_a_bound_accepts_the_bound_itself_and_more() -> None:
    assert at_least(1)(1) is None
    assert at_least(1)(7) is None


def test_a_count_below_its_bound_says_the_bound_what_it_means_and_the_value() -> None:
    assert at_least(0, " (0: never)")(-3) == "expected at least 0 (0: never), got -3"


def test_a_bound_keeps_the_phrasing_it_is_given() -> None:
    assert at_least(1, wording="must be >=")(0) == "must be >= 1, got 0"


def test_a_float_bound_prints_its_numbers_shortest() -> None:
    assert at_least(0.5)(0.25) == "expected at least 0.5, got 0.25"
    assert at_least(2.0)(1.0) == "expected at least 2, got 1"


def test_a_whole_number_is_printed_in_full() -> None:
    assert at_least(0)(-10_000_000) == "expected at least 0, got -10000000"


def test_an_unset_url_is_accepted() -> None:
    assert http_url()(None) is None
    assert http_url()("") is None


def test_an_http_or_https_url_with_a_host_is_accepted() -> None:
    assert http_url()("http://prometheus:9090") is None
    assert http_url()("https://10.0.0.1:6443/") is None


def test_another_scheme_or_no_host_is_refused_naming_the_server() -> None:
    assert http_url(" of the API server")("ftp://host") == (
        "expected an http:// or https:// URL of the API server, got 'ftp://host'"
    )
    assert http_url()("http://") == "expected an http:// or https:// URL, got 'http://'"


def test_a_url_with_a_control_character_is_refused() -> None:
    assert http_url()("http://host/\r\nX: 1") is not None


def test_an_absolute_path_no_other_endpoint_serves_is_a_telemetry_path() -> None:
    assert telemetry_path(("/",), "by the landing page")("/metrics") is None


def test_a_telemetry_path_must_be_an_absolute_printable_path_without_a_query() -> None:
    check = telemetry_path((), "")
    for bad in ("metrics", "/me trics", "/metrics?x", "/m#x", "/m\n"):
        assert check(bad) == f"expected an absolute URL path like /metrics, got {bad!r}"


def test_a_reserved_telemetry_path_says_what_serves_it() -> None:
    check = telemetry_path(("/", "/-/ready"), "by the receiver")
    assert check("/-/ready") == "/-/ready is already served by the receiver"
