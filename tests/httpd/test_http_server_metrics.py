"""The HTTP servers count what their limits do (issue 17): connections accepted, closed idle to make
room, refused at the cap, timed out; requests refused by status; requests in flight. The series are
on the exporter's /metrics (as of its last render) and on the receiver's (live), with labels from
fixed lists whatever the clients send."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

from gpulens.exporter.app import Exporter
from gpulens.exporter.server import HttpServer
from gpulens.httpd.metrics import CLOSE_REASONS, families
from gpulens.httpd.parse import Head
from gpulens.httpd.server import REFUSAL_CODES, Limits, Request, Response, Server, text
from gpulens.remediate.auth import Authenticator
from gpulens.remediate.breaker import CircuitBreaker
from gpulens.remediate.server import RemediateServer
from gpulens.remediate.service import Remediator
from gpulens.remediate.slurm import SlurmIsolator
from tests.exporter.conftest import make_exporter
from tests.exporter.expo import present, samples, value
from tests.sim.static_node import example_node


class Gate:
    """An app whose answers wait until `release` (requests in flight on demand)."""

    keep_body = False

    def __init__(self) -> None:
        self.event: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.arrived = threading.Semaphore(0)

    def check_head(self, head: Head) -> Response | None:
        return None

    async def handle(self, request: Request) -> Response:
        if self.event is None:
            self.event = asyncio.Event()
            self.loop = asyncio.get_running_loop()  # the server's loop, for `release` from the test thread
        self.arrived.release()
        await self.event.wait()
        return text(200, "ok")

    def release(self) -> None:
        """Let every held request answer (called from the test's thread, so through the server's loop)."""
        assert self.loop is not None and self.event is not None, "no request reached the gate"
        self.loop.call_soon_threadsafe(self.event.set)


@contextlib.contextmanager
def serving(app: object, limits: Limits) -> Iterator[Server]:
    server = Server(app, "127.0.0.1", 0, limits=limits)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    return sock


def metric(server: Server, name: str, **labels: str) -> float:
    for family in families(server):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no {name}{labels}")


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def answer(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    received = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk


def test_refused_requests_are_counted_by_status() -> None:
    with serving(Gate(), Limits(max_body=100)) as server:
        assert answer(connect(server), b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n").startswith(
            b"HTTP/1.1 400"
        )
        huge = b"GET / HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n"
        assert answer(connect(server), huge).startswith(b"HTTP/1.1 431")
        body = b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000
        assert answer(connect(server), body).startswith(b"HTTP/1.1 413")
        wait_for(lambda: metric(server, "gpulens_http_requests_rejected_total", code="413") == 1)
        assert metric(server, "gpulens_http_requests_rejected_total", code="400") == 1
        assert metric(server, "gpulens_http_requests_rejected_total", code="431") == 1
        assert metric(server, "gpulens_http_requests_rejected_total", code="503") == 0


def test_requests_over_max_requests_are_refused_and_those_in_flight_are_counted() -> None:
    gate = Gate()
    with serving(gate, Limits(max_requests=2)) as server:
        held = held_in_the_handler(server, gate, 2)
        assert metric(server, "gpulens_http_requests_in_flight") == 2
        assert metric(server, "gpulens_http_requests_in_flight_max") == 2
        third = connect(server)
        assert answer(third, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").startswith(
            b"HTTP/1.1 503"
        )
        assert metric(server, "gpulens_http_requests_rejected_total", code="503") == 1
        gate.release()
        for sock in held:
            assert sock.recv(100).startswith(b"HTTP/1.1 200")
        wait_for(lambda: metric(server, "gpulens_http_requests_in_flight") == 0)


def connect_from(server: Server, source: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", server.port))
    return sock


def held_in_the_handler(server: Server, gate: Gate, n: int, source: str | None = None) -> list[socket.socket]:
    """`n` connections whose request the gated application is handling (each holds a slot)."""
    socks = [connect_from(server, source) if source else connect(server) for _ in range(n)]
    for sock in socks:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    for _ in socks:
        assert gate.arrived.acquire(timeout=5)
    return socks


def test_one_address_gets_at_most_its_share_of_the_slots_and_others_are_served() -> None:
    gate = Gate()
    with serving(gate, Limits(max_requests=10, max_requests_per_client=2)) as server:
        held = held_in_the_handler(server, gate, 2, "127.0.0.2")
        third = connect_from(server, "127.0.0.2")
        refused = answer(third, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        other = connect_from(server, "127.0.0.3")
        other.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        assert gate.arrived.acquire(timeout=5)  # another address still gets a slot
        assert server.requests_in_flight_of("127.0.0.2") == 2
        gate.release()
        for sock in (*held, other):
            assert sock.recv(100).startswith(b"HTTP/1.1 200")
            sock.close()
    assert refused.startswith(b"HTTP/1.1 503") and b"from one address" in refused


def test_health_and_readiness_are_answered_when_every_slot_is_taken() -> None:
    gate = Gate()
    with serving(gate, Limits(max_requests=2, max_requests_per_client=0)) as server:
        held = held_in_the_handler(server, gate, 2)
        probe = connect(server)
        probe.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        assert gate.arrived.acquire(timeout=5)  # it reached the application, past the full slots
        gate.release()
        assert probe.recv(100).startswith(b"HTTP/1.1 200")
        for sock in (*held, probe):
            sock.close()


def test_connections_past_the_cap_close_the_oldest_idle_one_and_are_counted() -> None:
    with serving(Gate(), Limits(max_connections=8)) as server:
        idle = [connect(server) for _ in range(8)]
        wait_for(lambda: metric(server, "gpulens_http_connections_open") == 8)
        extra = connect(server)
        wait_for(lambda: metric(server, "gpulens_http_connections_closed_total", reason="idle_evicted") == 1)
        assert idle[0].recv(10) == b""  # the oldest went
        assert metric(server, "gpulens_http_connections_accepted_total") == 9
        assert metric(server, "gpulens_http_connections_max") == 8
        assert metric(server, "gpulens_http_connections_closed_total", reason="refused_at_cap") == 0
        for sock in (*idle, extra):
            sock.close()


def test_a_connection_at_the_cap_with_nothing_idle_is_refused_and_counted() -> None:
    gate = Gate()
    with serving(gate, Limits(max_connections=8, max_requests=0)) as server:
        held_in_the_handler(server, gate, 8)
        refused = connect(server)
        assert refused.recv(10) == b""
        assert metric(server, "gpulens_http_connections_closed_total", reason="refused_at_cap") == 1
        gate.release()


def test_at_the_cap_with_nothing_idle_an_answer_nobody_reads_is_closed_to_make_room() -> None:
    body = b"x" * (32 << 20)  # more than loopback socket buffers hold

    class Big(Gate):
        async def handle(self, request: Request) -> Response:
            return Response(200, body)

    with serving(Big(), Limits(max_connections=8, unread_grace=0.0)) as server:
        stuck = [connect(server) for _ in range(8)]
        for sock in stuck:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        wait_for(lambda: server.open_connections() == 8 and len(server._idle_new) == 0)
        probe = connect(server)
        probe.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        assert probe.recv(100).startswith(b"HTTP/1.1 200")
        assert metric(server, "gpulens_http_connections_closed_total", reason="unread_evicted") >= 1
        assert metric(server, "gpulens_http_connections_closed_total", reason="refused_at_cap") == 0
        for sock in (*stuck, probe):
            sock.close()


def test_a_trickled_head_times_out_with_a_408_and_is_counted() -> None:
    with serving(Gate(), Limits(header_timeout=0.2)) as server:
        sock = connect(server)
        assert answer(sock, b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: a").startswith(b"HTTP/1.1 408")
        assert metric(server, "gpulens_http_connections_closed_total", reason="timed_out") >= 1
        assert metric(server, "gpulens_http_requests_rejected_total", code="408") == 1


def test_the_rejected_codes_are_a_fixed_list_whatever_clients_send() -> None:
    with serving(Gate(), Limits()) as server:
        for garbage in (
            b"\x16\x03\x01\x00\xa5\r\n\r\n",
            b"GET / HTTP/9.9\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        ):
            answer(connect(server), garbage)
        wait_for(
            lambda: (
                sum(
                    metric(server, "gpulens_http_requests_rejected_total", code=str(c)) for c in REFUSAL_CODES
                )
                >= 3
            )
        )
        codes = [
            s.labels["code"]
            for f in families(server)
            for s in f.samples
            if s.name == "gpulens_http_requests_rejected_total"
        ]
        assert codes == [str(c) for c in REFUSAL_CODES]


def test_the_exporters_metrics_carry_its_servers_series_as_of_the_last_render() -> None:
    from gpulens.sim.install import install, uninstall

    node = example_node()
    install(node)
    exporter: Exporter = make_exporter(node)
    server = HttpServer(exporter, "127.0.0.1", 0)
    server.start()
    try:
        answer(
            socket.create_connection(("127.0.0.1", server.port)),
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        )
        exporter.refresh()
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read()
        assert value(body, "gpulens_http_requests_rejected_total", code="400") == 1
        assert present(body, "gpulens_http_connections_accepted_total") >= 1
        assert value(body, "gpulens_http_connections_max") == server.server.max_connections
        assert len(samples(body, "gpulens_http_connections_closed_total")) == len(CLOSE_REASONS)
    finally:
        server.stop()
        exporter.close()
        uninstall()


def test_the_receivers_metrics_carry_its_servers_series_live() -> None:
    remediator = Remediator(SlurmIsolator(scontrol="/nonexistent"), CircuitBreaker(3, 3600), dry_run=True)
    server = RemediateServer(("127.0.0.1", 0), remediator, Authenticator(token="t"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        wait_for(lambda: server.server._loop is not None)
        answer(
            socket.create_connection(("127.0.0.1", port)),
            b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read()
        assert value(body, "gpulens_http_requests_rejected_total", code="400") == 1
        assert value(body, "gpulens_http_connections_accepted_total") == 2
        assert value(body, "gpulens_http_requests_in_flight") == 1  # this scrape
    finally:
        server.shutdown()
        server.server_close()
