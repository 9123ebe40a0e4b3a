"""Outbound HTTP that a hostile or broken server can neither hijack nor hang.

The remediation receiver's Kubernetes client and the analyzer's Prometheus client both carry
credentials (a service-account token, a bearer token, basic auth) and act on what comes back, so
both go through this module instead of `urllib.request`, which

- follows redirects to any origin and re-sends the `Authorization` header there,
- applies its timeout to each socket read, so a server that sends one byte every few seconds is
  never cut off, and
- reads an answer of any size into memory.

Here a request has one total deadline (connect, send, headers and body together; a watchdog shuts
the socket down when it passes, so even a header trickled byte by byte ends), the answer is read
up to a byte limit, and redirects are followed only within the same origin (scheme, host and
port): a redirect elsewhere is an error, so credentials are never sent to, and no answer is taken
from, another server. Standard-library only: the exporter image can import it too.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

REDIRECTS = {301, 302, 303, 307, 308}
MAX_REDIRECTS = 5
DEFAULT_MAX_BYTES = 16 << 20
_CHUNK = 64 << 10


class HttpError(Exception):
    """The request did not produce a usable answer; the message is one line naming the URL."""


class DeadlineExceeded(HttpError):
    """No complete answer within the total deadline."""


class TooLarge(HttpError):
    """The answer is over the byte limit (retrying will not help)."""


class RedirectRefused(HttpError):
    """A redirect to another origin, a method-changing redirect, or too many (retrying will not help)."""


class Deadline:
    """A point in time by which a whole operation (possibly several requests) must be done."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds

    def remaining(self) -> float:
        return self._end - self._clock()

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    url: str  # after same-origin redirects
    headers: Mapping[str, str] = field(default_factory=dict)


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) with the default port filled in; what "same origin" compares."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for this URL (`https_proxy`, `http_proxy`, `no_proxy`)."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


class _Watchdog:
    """Shuts the connection's socket down when the deadline passes, ending any blocked read."""

    def __init__(self, connection: http.client.HTTPConnection, seconds: float) -> None:
        self.fired = False
        self._connection = connection
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = self._connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def _connection(url: str, timeout: float, context: ssl.SSLContext | None) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(url)
    scheme, host, port = origin(url)
    proxy = _proxy_for(url)
    if proxy:
        proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        proxy_host, proxy_port = proxy_parts.hostname or "", proxy_parts.port or 80
        if scheme == "https":
            tunnel = http.client.HTTPSConnection(proxy_host, proxy_port, timeout=timeout, context=context)
            tunnel.set_tunnel(parts.hostname or host, port)
            return tunnel
        return http.client.HTTPConnection(proxy_host, proxy_port, timeout=timeout)
    if scheme == "https":
        return http.client.HTTPSConnection(parts.hostname or host, port, timeout=timeout, context=context)
    return http.client.HTTPConnection(parts.hostname or host, port, timeout=timeout)


def _target(url: str) -> str:
    """What goes on the request line: the path, or the absolute URL through a plain-HTTP proxy."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "http" and _proxy_for(url):
        return url
    path = parts.path or "/"
    return f"{path}?{parts.query}" if parts.query else path


def request(
    method: str,
    url: str,
    *,
    deadline: Deadline | float,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    context: ssl.SSLContext | None = None,
) -> Response:
    """One HTTP exchange (plus same-origin redirects) within `deadline`; any status is returned.

    Raises HttpError for a connection failure, a deadline passed, an answer over `max_bytes`, a
    redirect to another origin, or too many redirects.
    """
    if not isinstance(deadline, Deadline):
        deadline = Deadline(deadline)
    if origin(url)[0] not in ("http", "https"):
        raise HttpError(f"{url}: only http and https URLs are supported")
    start = url
    for _ in range(MAX_REDIRECTS + 1):
        status, answer_headers, data = _exchange(
            method, url, deadline, headers or {}, body, max_bytes, context
        )
        location = answer_headers.get("location")
        if status not in REDIRECTS or not location:
            return Response(status, data, url, answer_headers)
        target = urllib.parse.urljoin(url, location)
        if origin(target) != origin(start):
            scheme, host, port = origin(target)
            raise RedirectRefused(
                f"{method} {start}: redirected (HTTP {status}) to another origin {scheme}://{host}:{port}: "
                "refused (credentials are only sent to the configured server; configure its final URL)"
            )
        if status in (307, 308) or method in ("GET", "HEAD"):
            url = target
        elif status == 303:
            method, body, url = "GET", None, target
        else:
            raise RedirectRefused(
                f"{method} {start}: HTTP {status} redirect to {target} would turn the {method} into a GET; "
                "configure the final URL"
            )
    raise RedirectRefused(f"{method} {start}: more than {MAX_REDIRECTS} redirects")


def _exchange(
    method: str,
    url: str,
    deadline: Deadline,
    headers: Mapping[str, str],
    body: bytes | None,
    max_bytes: int,
    context: ssl.SSLContext | None,
) -> tuple[int, dict[str, str], bytes]:
    remaining = deadline.remaining()
    if remaining <= 0:
        raise DeadlineExceeded(f"{method} {url}: no answer within {deadline.seconds:g}s (total deadline)")
    connection = _connection(url, remaining, context)
    watchdog = _Watchdog(connection, remaining)
    try:
        connection.request(method, _target(url), body=body, headers=dict(headers))
        response = connection.getresponse()
        answer_headers = {k.lower(): v for k, v in response.getheaders()}
        declared = answer_headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise TooLarge(
                f"{method} {url}: answer of {int(declared)} bytes is over the {max_bytes}-byte limit"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = response.read1(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise TooLarge(f"{method} {url}: answer is over the {max_bytes}-byte limit")
            chunks.append(chunk)
            if deadline.expired:
                raise DeadlineExceeded(
                    f"{method} {url}: no complete answer within {deadline.seconds:g}s (total deadline)"
                )
        if watchdog.fired:
            raise DeadlineExceeded(
                f"{method} {url}: no complete answer within {deadline.seconds:g}s (total deadline)"
            )
        if declared.isdigit() and size != int(declared):
            raise HttpError(f"{method} {url}: answer cut short ({size} of {declared} bytes)")
        return response.status, answer_headers, b"".join(chunks)
    except HttpError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if watchdog.fired or deadline.expired:
            raise DeadlineExceeded(
                f"{method} {url}: no complete answer within {deadline.seconds:g}s (total deadline)"
            ) from None
        reason = (
            getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        )
        raise HttpError(f"{method} {url}: {reason}") from None
    finally:
        watchdog.cancel()
        connection.close()
