"""Strict HTTP/1.1 request heads (RFC 9110/9112): what two parsers could read differently is refused.

Request smuggling needs a front end and a back end that disagree about where a request ends, so
this parser accepts one reading only and answers 400 (then closes the connection) for anything
else: both `Content-Length` and `Transfer-Encoding`, more than one `Content-Length` (even with the
same value, or `5, 5`), a `Content-Length` that is not plain digits, bare CR or LF as line ends,
obs-fold continuation lines, whitespace between a field name and its colon, control characters in
values, more than one `Host`. Request bodies are framed by `Content-Length` only: a chunked body is
answered 411 (RFC 9112 §6.3 lets a server require a length), so the server never has to decode one.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from urllib.parse import unquote_plus

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_DIGITS = re.compile(rb"[0-9]+")
_OWS = b" \t"
# Content-Length values with more digits than this are "too large" without converting them.
_MAX_LENGTH_DIGITS = 18
# Heads up to this size are parsed once and remembered (a few hundred, least recently used): a
# scraper sends the same head every time, and parsing one costs ~40 us of regex matching, which 20
# concurrent scrapers pay on every request. A larger head is parsed each time.
_CACHED_HEAD_BYTES = 2048
_CACHED_HEADS = 256


class HttpError(Exception):
    """A request the server refuses before any application code sees it; the connection closes."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class HeadLimits:
    max_request_line: int = 16 << 10  # a long query string still fits; 414 beyond
    max_head: int = (
        64 << 10
    )  # request line + all header lines (http.server allowed 64 KiB a line); 431 beyond
    max_headers: int = 100  # 431 beyond


@dataclass(frozen=True)
class Head:
    """A parsed request head; header names are lower-case, values as sent (Latin-1 decoded)."""

    method: str
    target: str
    minor: int  # HTTP/1.<minor>
    headers: tuple[tuple[str, str], ...]
    content_length: int
    keep_alive: bool
    expect_continue: bool
    _index: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def header(self, name: str) -> str | None:
        """The field's value; repeated fields are joined with ", " (RFC 9110 §5.3)."""
        return self._index.get(name.lower())

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> dict[str, str]:
        if "?" not in self.target:
            return {}
        pairs = (part.partition("=") for part in self.target.split("?", 1)[1].split("&") if part)
        return {unquote_plus(k): unquote_plus(v) for k, _, v in pairs}


def head_end(buffer: bytes | bytearray, limits: HeadLimits) -> int:
    """Index just past the blank line ending the head, -1 if incomplete; HttpError when too long."""
    end = buffer.find(b"\r\n\r\n", 0, limits.max_head + 4)
    if end >= 0:
        line_end = buffer.find(b"\r\n")
        if line_end > limits.max_request_line:
            raise HttpError(414, "request line too long")
        return end + 4
    if buffer.find(b"\r\n") < 0 and len(buffer) > limits.max_request_line:
        raise HttpError(414, "request line too long")
    if len(buffer) > limits.max_head:
        raise HttpError(431, "request head too large")
    return -1


def skip_empty_lines(buffer: bytearray) -> None:
    """RFC 9112 §2.2: a server SHOULD ignore empty lines received before a request line."""
    start = 0
    while buffer.startswith(b"\r\n", start):
        start += 2
    if start:
        del buffer[:start]


def parse_head(raw: bytes, limits: HeadLimits) -> Head:
    """Parse `raw` (the head without its final blank line); raises HttpError on anything unclear.

    The result is immutable and a function of `raw` and `limits` only, so small heads come from a
    bounded cache (refusals are not cached: they raise)."""
    if len(raw) <= _CACHED_HEAD_BYTES:
        return _parse_small(raw, limits)
    return _parse(raw, limits)


@functools.lru_cache(maxsize=_CACHED_HEADS)
def _parse_small(raw: bytes, limits: HeadLimits) -> Head:
    return _parse(raw, limits)


def _parse(raw: bytes, limits: HeadLimits) -> Head:
    lines = raw.split(b"\r\n")
    if any(b"\r" in line or b"\n" in line for line in lines):
        raise HttpError(400, "bare CR or LF in the request head")
    request_line, header_lines = lines[0], lines[1:]
    parts = request_line.split(b" ")
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise HttpError(400, "malformed method")
    if not _TARGET.fullmatch(target):
        raise HttpError(400, "malformed request target")
    matched = _VERSION.fullmatch(version)
    if matched is None:
        raise HttpError(400, "malformed HTTP version")
    if matched.group(1) != b"1":
        raise HttpError(505, "only HTTP/1.x is served")
    minor = int(matched.group(2))
    if len(header_lines) > limits.max_headers:
        raise HttpError(431, f"more than {limits.max_headers} header fields")

    headers: list[tuple[str, str]] = []
    index: dict[str, str] = {}
    counts: dict[str, int] = {}
    for line in header_lines:
        if line[:1] in (b" ", b"\t"):
            raise HttpError(400, "obsolete line folding in a header field")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise HttpError(400, "malformed header field")
        value = value.strip(_OWS)
        if not _VALUE.fullmatch(value):
            raise HttpError(400, "control character in a header field value")
        key = name.decode("ascii").lower()
        text = value.decode("latin-1")
        headers.append((key, text))
        counts[key] = counts.get(key, 0) + 1
        index[key] = f"{index[key]}, {text}" if key in index else text

    length = _framing(index, counts, minor)
    if counts.get("host", 0) > 1:
        raise HttpError(400, "more than one Host header field")
    connection = {t.strip().lower() for t in index.get("connection", "").split(",")}
    keep_alive = "close" not in connection if minor >= 1 else "keep-alive" in connection
    expect = index.get("expect", "").strip().lower()
    if expect and expect != "100-continue":
        raise HttpError(417, "only Expect: 100-continue is understood")
    return Head(
        method=method.decode("ascii"),
        target=target.decode("ascii"),
        minor=minor,
        headers=tuple(headers),
        content_length=length,
        keep_alive=keep_alive,
        expect_continue=bool(expect) and length > 0,
        _index=index,
    )


def _framing(index: dict[str, str], counts: dict[str, int], minor: int) -> int:
    """The body length per RFC 9112 §6, refusing every ambiguous combination."""
    transfer = index.get("transfer-encoding")
    length = index.get("content-length")
    if transfer is not None and length is not None:
        raise HttpError(400, "both Transfer-Encoding and Content-Length")
    if transfer is not None:
        codings = [c.strip().lower() for c in transfer.split(",")]
        if minor >= 1 and codings[-1] == "chunked":
            raise HttpError(411, "chunked request bodies are not accepted; send Content-Length")
        raise HttpError(400, "unusable Transfer-Encoding")
    if length is None:
        return 0
    if counts["content-length"] > 1 or "," in length:
        raise HttpError(400, "more than one Content-Length")
    raw = length.encode("latin-1")
    if not _DIGITS.fullmatch(raw):
        raise HttpError(400, "Content-Length is not a decimal number")
    return int(raw) if len(raw) <= _MAX_LENGTH_DIGITS else 10**_MAX_LENGTH_DIGITS
