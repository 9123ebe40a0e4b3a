"""A bounded HTTP/1.1 server: one event-loop thread, a small worker pool, and hard limits.

Why not a library: the candidates were checked against what a node daemon on a hostile network
needs (TLS from a reloadable context, a cap on open connections that closes the oldest idle one
first, header/body/idle/write deadlines, EMFILE back-off, a parallel-request limit, strict
framing). waitress has no TLS; uvicorn/hypercorn bring an ASGI stack and several dependencies into
an exporter that must stay small, refuse excess connections instead of closing idle ones, and
have no deadline for a trickled request head; aiohttp is a large dependency tree; cheroot spends a
thread on each active connection. h11 parses well, but it merges duplicate `Content-Length`
fields and lets `Transfer-Encoding` override `Content-Length` where this server must refuse both,
so it would need a second parser in front of it. What is left is small: the standard library's
asyncio event loop (epoll, timers, a thread pool), `ssl.SSLObject` over memory buffers, and a strict
head parser (`parse.py`).

Per connection the loop keeps a few KiB: a read buffer bounded by the head limit, and for a slow
reader memoryviews into the response body (the exporter's bodies are shared cached bytes; over TLS
at most one encrypted chunk of it at a time). Request handling that may block (bcrypt, the
remediation backends) runs in the worker pool.

Slots: `max_requests` bounds the requests being handled at once, and `max_requests_per_client`
those of one source address, so that one client cannot take every slot. A slot is held while the
application works and given back as soon as the answer is queued: a client that never reads its
answer holds only its connection, until the write deadline drops it (and a full table may close it
sooner). Requests for `reserved_paths` (health and readiness) take no slot at all, so a flood can
never make the liveness probe fail.

Life of a connection (each state has one deadline, none of them reset by trickled bytes):
  head   waiting for a request head: `header_timeout` from accept (TLS handshake included) or from
         the first byte after a keep-alive response; `idle_timeout` before that first byte
  body   reading (or, for refused requests, draining) a `Content-Length` body: `body_timeout`
  busy   the application handles it; then writing the answer: `write_timeout` until sent
         (a total deadline: a reader that takes one byte at a time is dropped all the same)
  linger after the last answer, reading and dropping what the client still sends, so that closing
         with unread input does not reset the connection before the client read the answer
Connections in `head`, `body` and `linger` are idle: when `max_connections` are open (or accept
fails with EMFILE) the one idle the longest is closed to make room, taking connections that never
completed a request (idle from the start, trickling a head) before kept-alive ones (a scraper
between two scrapes), and when none is idle, the one whose answer has waited longest for its
reader (at least `Limits.unread_grace`).

A client may pipeline requests and half-close its side: every complete request it sent is answered,
in order, before the connection closes; an incomplete one is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import resource
import socket
import ssl
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Protocol, TypeVar

from gpulens.httpd.parse import Head, HeadLimits, HttpError, head_end, parse_head, skip_empty_lines
from gpulens.httpd.tls import TlsSession

T = TypeVar("T")
RECV_SIZE = 64 << 10
ACCEPT_BATCH = 64
LINGER_SECONDS = 1.0
HEARTBEAT_SECONDS = 0.5
HEAD_CACHE_SIZE = 64
# over TLS the answer is encrypted this much at a time, as the reader takes it
TLS_CHUNK = 64 << 10
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset
# accept(2) errors that mean "out of descriptors or memory": retrying at once would spin
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
# descriptors left to the rest of the process (files, NVML, sockets of its own clients)
FD_RESERVE_FRACTION = 2


@dataclass(frozen=True)
class Limits:
    """Resource bounds of one server; see the module docstring for what each deadline covers."""

    max_connections: int = 512
    max_requests: int = 40  # requests being handled at once; 0 means no limit
    max_requests_per_client: int = 8  # of those, from one source address; 0 means no limit
    header_timeout: float = 10.0
    idle_timeout: float = 120.0
    body_timeout: float = 30.0
    # Prometheus gives up on a scrape after its scrape_timeout (10 s by default): an answer still
    # unread by then has no reader worth waiting for
    write_timeout: float = 10.0
    unread_grace: float = 1.0  # an answer unsent this long may be closed to make room at the cap
    max_body: int = 1 << 20
    drain_limit: int = 4 << 20  # a refused body up to this size is read and dropped first
    workers: int = 4
    head: HeadLimits = field(default_factory=HeadLimits)
    # answered without a slot: what liveness and readiness probes ask for
    reserved_paths: tuple[str, ...] = ("/-/healthy", "/-/ready")

    def effective_connections(self) -> int:
        """`max_connections`, capped at half the soft RLIMIT_NOFILE so the process keeps the rest."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(8, min(self.max_connections, soft // FD_RESERVE_FRACTION))


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False  # close the connection after this answer


@dataclass(frozen=True)
class Request:
    head: Head
    body: bytes
    peer: str
    tls: bool
    run_blocking: Callable[..., Awaitable[Any]]


class App(Protocol):
    """What a server serves. `check_head` may answer before the body is read (401, 404, 413...)."""

    keep_body: bool  # False: request bodies (up to Limits.max_body) are read and dropped

    def check_head(self, head: Head) -> Response | None: ...

    def handle(self, request: Request) -> Response | Awaitable[Response]: ...


def text(status: int, line: str, **kwargs: Any) -> Response:
    return Response(status, (line + "\n").encode(), **kwargs)


# the answers this layer decides itself (framing, sizes, deadlines, the parallel-request limit):
# the `code` values of gpulens_http_requests_rejected_total (metrics.py), a fixed list
REFUSAL_CODES = (400, 408, 411, 413, 414, 417, 431, 503, 505)


@dataclass
class Stats:
    """Counters for logs, tests and the server's own series (written by the loop thread only;
    other threads read them: plain ints, and `refused_requests` never changes its keys)."""

    accepted: int = 0
    evicted: int = 0  # idle connections closed to make room (the oldest first)
    refused: int = 0  # accepted and closed at once: nothing idle to close instead
    timed_out: int = 0
    rejected_heads: int = 0  # 4xx/5xx from the parser
    over_limit: int = 0  # 503 for max_requests or max_requests_per_client
    stalled_closed: int = 0  # answers never read, closed to make room
    accept_backoffs: int = 0
    peak_connections: int = 0
    refused_requests: dict[int, int] = field(default_factory=lambda: dict.fromkeys(REFUSAL_CODES, 0))

    def refuse(self, status: int) -> None:
        if status in self.refused_requests:
            self.refused_requests[status] += 1


_heap_frozen = False


def freeze_startup_heap() -> None:
    """Move everything alive now out of the cyclic garbage collector's reach (`gc.freeze`).

    A daemon's long-lived startup objects (modules, the GPU catalog, a simulated node, the
    prometheus_client machinery: ~37,000 objects in the exporter) are traversed by every full
    collection, which the allocations of a connection flood trigger every few seconds: 35 ms of
    stopped world on an idle machine, several times that on a loaded one, and the loop thread
    answers nothing meanwhile (the hostile-network test's slowest scrapes). Frozen, a full
    collection only walks what was allocated since. Call once, after start-up and a first unit of
    work; garbage made before is collected first. Once per process: later calls do nothing (a test
    process starts many exporters).
    """
    global _heap_frozen
    if _heap_frozen:
        return
    _heap_frozen = True
    gc.collect()
    gc.freeze()


HeadKey = tuple[int, str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], int, bool]


class _HeadCache:
    """Response heads already encoded, for the current second (their `Date`).

    A scraper gets the same head for the same body every time: building it from f-strings, an
    `HTTPStatus` and the Date costs several microseconds of the loop's time per request, a
    dictionary lookup well under one. The cache starts empty each second and holds at most
    `HEAD_CACHE_SIZE` heads (they are keyed by the body's length, so a stream of different
    bodies only ever refills it).
    """

    def __init__(self) -> None:
        self._second = -1
        self._date = ""
        self._heads: dict[HeadKey, bytes] = {}

    def get(self, key: HeadKey, build: Callable[[HeadKey, str], bytes]) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second, self._date = second, formatdate(second, usegmt=True)
            self._heads.clear()
        head = self._heads.get(key)
        if head is None:
            if len(self._heads) >= HEAD_CACHE_SIZE:
                self._heads.clear()
            head = self._heads[key] = build(key, self._date)
        return head


def _listener(host: str, port: int) -> socket.socket:
    """Bind like the previous http.server: "" means every address, IPv6 dual-stack where possible."""
    family = socket.AF_INET6 if (":" in host or host == "") and socket.has_ipv6 else socket.AF_INET
    bind_host = host or ("::" if family == socket.AF_INET6 else "0.0.0.0")
    try:
        sock = _bind(family, bind_host, port)
    except OSError:
        if host:
            raise
        sock = _bind(socket.AF_INET, "0.0.0.0", port)
    return sock


def _bind(family: int, host: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Server:
    """Serve `app` on host:port; `start()` runs the loop on a thread, `serve_forever()` in this one."""

    def __init__(
        self,
        app: App,
        host: str,
        port: int,
        *,
        limits: Limits | None = None,
        tls: Callable[[], ssl.SSLContext | None] | None = None,
        extra_headers: Callable[[], tuple[tuple[str, str], ...]] | None = None,
        server_name: str = "gpulens",
        logger: logging.Logger | None = None,
    ) -> None:
        self.app = app
        self.limits = limits or Limits()
        self.max_connections = self.limits.effective_connections()
        self.tls = tls or (lambda: None)
        self.extra_headers = extra_headers or (lambda: ())
        self.server_name = server_name
        self.log = logger or logging.getLogger("gpulens.http")
        self.stats = Stats()
        self._listen = _listener(host, port)
        self.address: tuple[str, int] = self._listen.getsockname()[:2]
        self._executor = ThreadPoolExecutor(self.limits.workers, thread_name_prefix=f"{server_name}-worker")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: set[_Connection] = set()
        # idle connections, oldest first: those that never completed a request (idle from the
        # start, trickling a head, lingering) are closed before kept-alive ones such as Prometheus'
        self._idle_new: OrderedDict[_Connection, None] = OrderedDict()
        self._idle_kept: OrderedDict[_Connection, None] = OrderedDict()
        # connections whose answer is not all sent, by when it was queued (oldest first)
        self._writing: OrderedDict[_Connection, float] = OrderedDict()
        self.in_flight = 0
        self._in_flight_of: dict[str, int] = {}  # source address -> its requests being handled
        self._backoff = 0.0
        self._accepting = False
        self._last_exhausted_log = -1e9
        self._last_evicted_log = -1e9
        self._heads = _HeadCache()
        self._started = threading.Event()
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.address[1])

    # ---- running ---------------------------------------------------------------------------
    def serve_forever(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._finished.clear()
        try:
            self._resume_accept()
            if threading.current_thread() is threading.main_thread():
                self._heartbeat()
            self._started.set()
            loop.run_forever()
        finally:
            for conn in list(self._conns):
                conn.abort()
            with contextlib.suppress(Exception):
                loop.remove_reader(self._listen.fileno())
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()
            self._loop = None
            self._finished.set()

    def _heartbeat(self) -> None:
        """Wake the loop twice a second even when idle, when it runs on the main thread.

        There (the receiver), Python runs signal handlers only on that thread, and a signal the
        kernel delivered to another thread does not interrupt epoll_wait: without a wake-up,
        SIGTERM could wait for the next connection. A loop on another thread (the exporter's)
        runs no signal handler, so it sleeps until there is work: each idle wake-up costs ~0.1 ms
        of CPU on a virtual machine.
        """
        assert self._loop is not None
        self._loop.call_later(HEARTBEAT_SECONDS, self._heartbeat)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name=self.server_name, daemon=True)
        self._thread.start()
        self._started.wait(5)

    def request_stop(self) -> None:
        """Ask the loop to stop, without waiting (safe from a signal handler on the loop's thread)."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(loop.stop)

    def shutdown(self) -> None:
        """Stop serving (from another thread) and wait until the loop has ended."""
        if self._loop is None:
            return
        self.request_stop()
        self._finished.wait(10)

    def close(self) -> None:
        self._listen.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        self.shutdown()
        self.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._loop is not None
        return await self._loop.run_in_executor(self._executor, fn, *args)

    # ---- accepting -------------------------------------------------------------------------
    def _resume_accept(self) -> None:
        assert self._loop is not None
        if not self._accepting and self._listen.fileno() >= 0:
            self._loop.add_reader(self._listen.fileno(), self._on_acceptable)
            self._accepting = True

    def _pause_accept(self, seconds: float) -> None:
        assert self._loop is not None
        self._loop.remove_reader(self._listen.fileno())
        self._accepting = False
        self._loop.call_later(seconds, self._resume_accept)

    def _on_acceptable(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = self._listen.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _EXHAUSTED:
                    if self._evict_oldest():
                        self._log_exhausted(exc, "closed the oldest idle connection")
                        continue
                    self._backoff = min(1.0, max(0.005, self._backoff * 2))
                    self.stats.accept_backoffs += 1
                    self._log_exhausted(exc, f"nothing idle to close; not accepting for {self._backoff:g}s")
                    self._pause_accept(self._backoff)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # the client gave up before we accepted: nothing to do
                self.log.warning("accept on %s:%d failed: %s", *self.address, exc)
                self._pause_accept(0.1)
                return
            self._backoff = 0.0
            self.stats.accepted += 1
            if len(self._conns) >= self.max_connections and not self._evict_oldest():
                self.stats.refused += 1
                sock.close()
                continue
            self._open(sock, peer)

    def _log_exhausted(self, exc: OSError, action: str) -> None:
        now = time.monotonic()
        if now - self._last_exhausted_log >= 60:
            self._last_exhausted_log = now
            self.log.warning(
                "accept on %s:%d: %s (%d connections open); %s",
                *self.address,
                exc.strerror or exc,
                len(self._conns),
                action,
            )

    def _open(self, sock: socket.socket, peer: Any) -> None:
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            context = self.tls()
            session = TlsSession(context) if context is not None else None
        except (OSError, ssl.SSLError) as exc:
            self.log.debug("setting up a connection from %s failed: %s", peer, exc)
            sock.close()
            return
        conn = _Connection(self, sock, str(peer[0]), int(peer[1]), session)
        self._conns.add(conn)
        self.stats.peak_connections = max(self.stats.peak_connections, len(self._conns))

    def _evict_oldest(self) -> bool:
        limits = self.limits
        idle = self._idle_new or self._idle_kept
        if idle:
            conn, _ = idle.popitem(last=False)
        elif self._writing and next(iter(self._writing.values())) <= time.monotonic() - limits.unread_grace:
            conn, _ = self._writing.popitem(last=False)
            self.stats.stalled_closed += 1
        else:
            return False
        self.stats.evicted += 1
        conn.abort()
        now = time.monotonic()
        if now - self._last_evicted_log >= 60:  # an attack is one line a minute, not one per socket
            self.log.warning(
                "%s:%d: %d connections open (limit %d): closing the oldest idle ones; %d closed so far",
                *self.address,
                len(self._conns) + 1,
                self.max_connections,
                self.stats.evicted,
            )
            self._last_evicted_log = now
        return True

    def open_connections(self) -> int:
        return len(self._conns)

    def requests_in_flight_of(self, client: str) -> int:
        return self._in_flight_of.get(client, 0)

    # ---- used by connections ---------------------------------------------------------------
    def _forget(self, conn: _Connection) -> None:
        self._conns.discard(conn)
        self._mark_busy(conn)
        self._writing.pop(conn, None)

    def _take_slot(self, client: str) -> str | None:
        """Count a request as being handled; the reason it may not be, when a limit is reached."""
        limits = self.limits
        if limits.max_requests and self.in_flight >= limits.max_requests:
            return f"limit of {limits.max_requests} concurrent requests reached, try again later"
        mine = self._in_flight_of.get(client, 0)
        if limits.max_requests_per_client and mine >= limits.max_requests_per_client:
            return (
                f"limit of {limits.max_requests_per_client} concurrent requests from one address "
                "reached, try again later"
            )
        self.in_flight += 1
        self._in_flight_of[client] = mine + 1
        return None

    def _give_slot(self, client: str) -> None:
        self.in_flight -= 1
        left = self._in_flight_of.get(client, 0) - 1
        if left > 0:
            self._in_flight_of[client] = left
        else:
            self._in_flight_of.pop(client, None)

    def _mark_idle(self, conn: _Connection) -> None:
        kept = conn.served > 0 and conn.state != "linger"
        (self._idle_kept if kept else self._idle_new)[conn] = None

    def _mark_busy(self, conn: _Connection) -> None:
        self._idle_new.pop(conn, None)
        self._idle_kept.pop(conn, None)

    def _response_bytes(self, response: Response, head_only: bool, close: bool) -> list[bytes]:
        """The head and the body, for one `sendmsg` (the body is the caller's bytes, not copied)."""
        body = response.body
        extra = self.extra_headers()
        key = (response.status, response.content_type, extra, response.headers, len(body), close)
        head = self._heads.get(key, self._build_head)
        return [head] if head_only or not body else [head, body]

    def _build_head(self, key: HeadKey, date: str) -> bytes:
        code, content_type, extra, headers, length, close = key
        status = HTTPStatus(code)
        lines = [
            f"HTTP/1.1 {status.value} {status.phrase}",
            f"Server: {self.server_name}",
            f"Date: {date}",
            f"Content-Type: {content_type}",
            f"Content-Length: {length}",
        ]
        lines.extend(f"{k}: {v}" for k, v in extra)
        lines.extend(f"{k}: {v}" for k, v in headers)
        if close:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Connection:
    """One client connection, driven by the loop's reader/writer callbacks (see module docstring)."""

    __slots__ = (
        "awaiting_first_byte",
        "awaiting_sent",
        "body",
        "body_left",
        "buffer",
        "client",
        "close_after",
        "counted",
        "due",
        "early",
        "fd",
        "head",
        "loop",
        "out",
        "peer",
        "peer_closed",
        "plain",
        "reading",
        "served",
        "server",
        "sock",
        "state",
        "task",
        "timer",
        "tls",
    )

    def __init__(
        self, server: Server, sock: socket.socket, client: str, port: int, tls: TlsSession | None
    ) -> None:
        assert server._loop is not None
        self.server = server
        self.loop = server._loop
        self.sock = sock
        self.fd = sock.fileno()
        self.client = client  # the source address: what per-client limits count
        self.peer = f"{client}:{port}"
        self.tls = tls
        self.buffer = bytearray()
        self.body = bytearray()
        self.body_left = 0
        self.head: Head | None = None
        self.early: Response | None = None  # answer decided before the body was drained
        self.out: deque[memoryview] = deque()  # bytes for the socket, in order
        self.plain: deque[memoryview] = deque()  # over TLS: the answer not yet encrypted
        self.state = "head"
        self.timer: asyncio.TimerHandle | None = None
        self.due: float | None = None  # loop time of the current deadline (see `_deadline`)
        self.task: asyncio.Task[Response] | None = None
        self.counted = False
        self.close_after = False
        self.peer_closed = False
        self.awaiting_first_byte = False
        self.awaiting_sent = False
        self.reading = False
        self.served = 0
        self._read(True)
        server._mark_idle(self)
        self._deadline(server.limits.header_timeout)

    # ---- plumbing --------------------------------------------------------------------------
    def _read(self, on: bool) -> None:
        if on and not self.reading and self.state != "closed" and not self.peer_closed:
            self.loop.add_reader(self.fd, self._on_readable)
            self.reading = True
        elif not on and self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False

    def _deadline(self, seconds: float | None) -> None:
        """Set the state's deadline (None: none). The timer is replaced only when it would fire too
        late: one that fires early finds the deadline moved and re-arms itself. A keep-alive
        request moves the deadline three or four times, and a timer handle created and cancelled
        each time was a tenth of the loop's time per request under 20 scrapers."""
        if seconds is None:
            self.due = None
            return
        due = self.loop.time() + seconds
        self.due = due
        timer = self.timer
        if timer is not None:
            if timer.when() <= due:
                return
            timer.cancel()
        self.timer = self.loop.call_at(due, self._on_timeout)

    def abort(self) -> None:
        """Close now, whatever the state (eviction, errors, deadlines, shutdown)."""
        if self.state == "closed":
            return
        self.state = "closed"
        self._read(False)
        if self.out:
            self.loop.remove_writer(self.fd)
            self.out.clear()
            # a reset, not a FIN queued behind the unsent answer: the kernel would otherwise keep
            # that answer (and the connection) for a reader that does not read
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        self.plain.clear()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.due = None
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self._release()
        self.server._forget(self)
        with contextlib.suppress(OSError):
            self.sock.close()

    def _release(self) -> None:
        """Give back the request's slot (once): its answer is queued, or the connection is gone."""
        if self.counted:
            self.counted = False
            self.server._give_slot(self.client)

    def _send(self, parts: list[bytes], response: bool = True) -> None:
        """Queue `parts` for the client; for a response, `_sent()` runs once all of it has left."""
        if self.tls is not None and response:
            # encrypted a chunk at a time as the reader takes it, never all at once: an answer
            # nobody reads costs views into the shared body, not a private encrypted copy of it
            self.awaiting_sent = True
            self.plain.extend(memoryview(p) for p in parts)
            if not self.out:
                self._pump()
            return
        self.awaiting_sent = self.awaiting_sent or response
        if self.out:
            self.out.extend(memoryview(p) for p in parts)
            return
        self._write_now(parts)

    def _pump(self) -> None:
        """Over TLS: encrypt the next chunk of the answer and send it (`out` is empty)."""
        assert self.tls is not None
        chunk = bytearray()
        while self.plain and len(chunk) < TLS_CHUNK:
            part = self.plain.popleft()
            take = TLS_CHUNK - len(chunk)
            chunk += part[:take]
            if len(part) > take:
                self.plain.appendleft(part[take:])
        try:
            ciphertext = self.tls.encrypt(bytes(chunk))
        except ssl.SSLError:
            self.abort()
            return
        self._write_now([ciphertext])

    def _write_now(self, parts: list[bytes]) -> None:
        """Send what the socket takes now; queue the rest and wait until it is writable."""
        try:
            sent = self.sock.sendmsg(parts)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.abort()
            return
        for part in parts:
            if sent >= len(part):
                sent -= len(part)
                continue
            self.out.append(memoryview(part)[sent:])
            sent = 0
        if self.out:
            self.loop.add_writer(self.fd, self._on_writable)
            if self.awaiting_sent and self not in self.server._writing:
                self.server._writing[self] = time.monotonic()
        elif self.plain:
            self.loop.call_soon(self._pump_more)
        elif self.awaiting_sent:
            self.awaiting_sent = False
            self.server._writing.pop(self, None)
            self._sent()

    def _pump_more(self) -> None:
        if self.state != "closed" and self.plain and not self.out:
            self._pump()

    def _on_writable(self) -> None:
        try:
            while self.out:
                sent = self.sock.send(self.out[0])
                if sent < len(self.out[0]):
                    self.out[0] = self.out[0][sent:]
                    return
                self.out.popleft()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort()
            return
        self.loop.remove_writer(self.fd)
        if self.plain:
            self._pump()
            return
        if self.awaiting_sent:
            self.awaiting_sent = False
            self.server._writing.pop(self, None)
            self._sent()

    def _on_readable(self) -> None:
        try:
            self._readable()
        except Exception:  # a bug here must cost one connection, not the loop's error log forever
            self.server.log.exception("connection from %s failed", self.peer)
            self.abort()

    def _readable(self) -> None:
        try:
            data = self.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort()
            return
        closed = not data
        if self.tls is not None and data:
            try:
                data, closed = self.tls.receive(data)
            except ssl.SSLError as exc:
                self.server.log.debug("TLS with %s failed: %s", self.peer, exc)
                with contextlib.suppress(OSError):
                    self.sock.send(self.tls.pending())  # the alert, best effort
                self.abort()
                return
            pending = self.tls.pending()
            if pending:
                self._send([pending], response=False)
        if data:
            self._received(data)
        if closed and self.state != "closed":
            self._peer_eof()

    # ---- the request cycle -----------------------------------------------------------------
    def _received(self, data: bytes) -> None:
        if self.state == "linger":
            return
        if self.state == "body":
            self._take_body(data)
            return
        self.buffer += data
        if self.state == "busy":
            if len(self.buffer) > self.server.limits.head.max_head:
                self._read(False)  # a pipelining client waits until the answer is out
            return
        if self.state == "head":
            self._parse()

    def _parse(self) -> None:
        limits = self.server.limits
        first = self.awaiting_first_byte and bool(self.buffer)
        if first:
            self.awaiting_first_byte = False
        skip_empty_lines(self.buffer)
        try:
            end = head_end(self.buffer, limits.head)
            if end < 0:
                if self.peer_closed:  # the client sent all it will: a partial head is dropped
                    self.abort()
                elif first:  # the head deadline runs from its first byte (a whole head needs none)
                    self._deadline(limits.header_timeout)
                return
            head = parse_head(bytes(self.buffer[: end - 4]), limits.head)
        except HttpError as exc:
            self.server.stats.rejected_heads += 1
            self.server.stats.refuse(exc.status)
            self.head = None
            self._answer(text(exc.status, exc.detail, close=True))
            return
        del self.buffer[:end]
        self.head = head
        try:
            early = self.server.app.check_head(head)
        except Exception:
            self.server.log.exception("checking a request head from %s failed", self.peer)
            early = text(500, "internal error", close=True)
        if early is None and head.content_length > limits.max_body:
            self.server.stats.refuse(413)
            early = text(413, f"body larger than {limits.max_body} bytes", close=True)
        if head.content_length == 0:
            if early is not None:
                self._answer(early)
            else:
                self._dispatch(b"")
            return
        if early is not None:
            if head.content_length > limits.drain_limit:
                self._answer(replace_close(early))
                return
            self.early = early
        elif head.expect_continue:
            self._send_plain(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.state = "body"
        self.body_left = head.content_length
        self._deadline(limits.body_timeout)
        rest = bytes(self.buffer)
        self.buffer.clear()
        self._take_body(rest)

    def _send_plain(self, data: bytes) -> None:
        """Bytes that are not an answer (100 Continue): encrypted when needed, no `_sent()`."""
        if self.tls is not None:
            try:
                data = self.tls.encrypt(data)
            except ssl.SSLError:
                self.abort()
                return
        self._send([data], response=False)

    def _take_body(self, data: bytes) -> None:
        """Consume body bytes from `data`; what follows the body (a pipelined request) is kept."""
        used = min(len(data), self.body_left)
        if self.early is None and self.server.app.keep_body:
            self.body += data[:used]
        self.body_left -= used
        if self.body_left == 0:
            rest = data[used:]
            if self.early is not None:
                early, self.early = self.early, None
                self.buffer += rest
                self._answer(early)
            else:
                body = bytes(self.body)
                self.body = bytearray()
                self.buffer += rest
                self._dispatch(body)

    def _dispatch(self, body: bytes) -> None:
        assert self.head is not None
        server = self.server
        server._mark_busy(self)
        self.state = "busy"
        self._deadline(None)
        if self.head.path not in server.limits.reserved_paths:
            refusal = server._take_slot(self.client)
            if refusal is not None:
                server.stats.over_limit += 1
                server.stats.refuse(503)
                self._answer(text(503, refusal))
                return
            self.counted = True
        request = Request(self.head, body, self.peer, self.tls is not None, server.run_blocking)
        try:
            result = server.app.handle(request)
        except Exception:
            server.log.exception("%s %s from %s failed", self.head.method, self.head.path, self.peer)
            result = text(500, "internal error")
        if isinstance(result, Response):
            self._answer(result)
        else:
            self.task = self.loop.create_task(_awaited(result))
            self.task.add_done_callback(self._handled)

    def _handled(self, task: asyncio.Future[Response]) -> None:
        self.task = None
        if self.state == "closed" or task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            assert self.head is not None
            self.server.log.error(
                "%s %s from %s failed: %s", self.head.method, self.head.path, self.peer, exc, exc_info=exc
            )
            self._answer(text(500, "internal error"))
            return
        self._answer(task.result())

    def _answer(self, response: Response) -> None:
        if self.state == "closed":
            return
        self._release()
        head = self.head
        # a client that half-closed after pipelining still gets an answer to every request it sent
        more = not self.peer_closed or bool(self.buffer)
        keep = head is not None and head.keep_alive and not response.close and more
        self.close_after = not keep
        self.state = "busy"
        self.server._mark_busy(self)
        # reading stays on: what a pipelining client sends meanwhile is buffered up to the head
        # limit (`_received`), and an answer that leaves at once (the usual case) needs no
        # deadline and no epoll changes; `_sent` has already run then
        self._deadline(None)
        head_only = head is not None and head.method == "HEAD"
        self._send(self.server._response_bytes(response, head_only, self.close_after))
        if (self.out or self.plain) and self.state == "busy":
            self._deadline(self.server.limits.write_timeout)

    def _sent(self) -> None:
        if self.state != "busy":
            return
        self.head = None
        self.served += 1
        if self.close_after:
            self._linger()
            return
        self.state = "head"
        self.awaiting_first_byte = True
        self.server._mark_idle(self)
        self._deadline(self.server.limits.idle_timeout)
        self._read(True)
        if self.buffer:
            self.loop.call_soon(self._resume_parse)

    def _resume_parse(self) -> None:
        if self.state == "head" and self.buffer:
            self._parse()

    def _linger(self) -> None:
        """Half-close and drop further input for a moment, then close (see module docstring)."""
        self.state = "linger"
        self.buffer.clear()
        if self.tls is not None and self.tls.established:
            with contextlib.suppress(OSError):
                self.sock.send(self.tls.close_notify())
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        if self.peer_closed:
            self.abort()
            return
        self.server._mark_idle(self)
        self._deadline(LINGER_SECONDS)
        self._read(True)

    def _peer_eof(self) -> None:
        self._read(False)
        self.peer_closed = True
        if self.state == "head" and self.buffer:
            self._parse()  # pipelined requests sent before the half-close are answered
        elif self.state in ("head", "linger"):
            self.abort()  # nothing complete to answer
        elif self.state == "body":
            if self.early is not None:
                early, self.early = self.early, None
                self._answer(replace_close(early))
            else:
                self.abort()
        # busy: the answer goes out, then the connection closes

    def _on_timeout(self) -> None:
        self.timer = None
        due = self.due
        if due is None:
            return
        if due > self.loop.time():
            self.timer = self.loop.call_at(due, self._on_timeout)
            return
        self.due = None
        try:
            self._timed_out()
        except Exception:
            self.server.log.exception("connection from %s failed", self.peer)
            self.abort()

    def _timed_out(self) -> None:
        self.server.stats.timed_out += 1
        if self.state == "head" and self.buffer and not self.awaiting_first_byte:
            self.head = None
            self.server.stats.refuse(408)
            self._answer(text(408, "request head not received in time", close=True))
        elif self.state == "body":
            early, self.early = self.early, None
            if early is None:
                self.server.stats.refuse(408)
            self._answer(
                replace_close(early) if early else text(408, "body not received in time", close=True)
            )
        else:
            self.abort()


async def _awaited(result: Awaitable[Response]) -> Response:
    return await result


def replace_close(response: Response) -> Response:
    return Response(response.status, response.body, response.content_type, response.headers, close=True)
