"""Request heads come from a bounded cache when small: the same answers, refusals every time."""

from __future__ import annotations

import pytest

from gpulens.httpd.parse import HeadLimits, HttpError, _parse, parse_head

LIMITS = HeadLimits()
SCRAPE = (
    b"GET /metrics HTTP/1.1\r\nHost: node:9400\r\nAccept-Encoding: gzip\r\n"
    b"Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
)


def test_a_repeated_head_parses_to_what_a_fresh_parse_gives() -> None:
    assert parse_head(SCRAPE, LIMITS) == _parse(SCRAPE, LIMITS)
    again = parse_head(SCRAPE, LIMITS)
    assert again == _parse(SCRAPE, LIMITS) and again.header("accept-encoding") == "gzip"


def test_a_refused_head_is_refused_every_time() -> None:
    smuggle = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5"
    for _ in range(2):
        with pytest.raises(HttpError, match="more than one Content-Length"):
            parse_head(smuggle, LIMITS)


def test_a_head_too_large_for_the_cache_is_still_parsed() -> None:
    raw = SCRAPE + b"\r\nX-Pad: " + b"a" * 4096
    assert parse_head(raw, LIMITS).header("x-pad") == "a" * 4096


def test_limits_are_part_of_the_cached_answer() -> None:
    assert parse_head(SCRAPE, LIMITS)
    with pytest.raises(HttpError, match="header fields"):
        parse_head(SCRAPE, HeadLimits(max_headers=1))
