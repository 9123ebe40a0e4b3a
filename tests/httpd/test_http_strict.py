"""Strict HTTP and bounded connections (issue 17 items 1 and 2) on both servers, in process.

Raw sockets send what a smuggling front end, a slow client or a connection flood would; the
exporter (`HttpServer` over a stub publication) and the remediation receiver (`RemediateServer`,
dry-run) must refuse ambiguous framing with 400 and close, read a request body instead of parsing
it as a request, negotiate per RFC 9110, and bound connections, requests and time.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import select
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.core import GaugeMetricFamily

from gpulens.exporter.app import Published
from gpulens.exporter.config import ExporterConfig
from gpulens.exporter.render import Rendered, render
from gpulens.exporter.server import HttpServer
from gpulens.exporter.snapshot import NodeSnapshot
from gpulens.httpd.server import Limits
from gpulens.httpd.webconfig import WebConfig
from gpulens.remediate.auth import Authenticator
from gpulens.remediate.breaker import CircuitBreaker
from gpulens.remediate.server import RemediateServer
from gpulens.remediate.service import Remediator
from gpulens.remediate.slurm import SlurmIsolator

TOKEN = "strict-http-token"


@dataclass
class StubExporter:
    current: Published
    config: ExporterConfig
    backend_name: str = "stub"


def publication(rendered: Rendered | None = None) -> Published:
    family = GaugeMetricFamily("gpu_up", "1 if up.", labels=["gpu"])
    family.add_metric(["0"], 1.0)
    snapshot = NodeSnapshot(timestamp=1.0, duration_seconds=0.0, nvml_up=True)
    return Published(snapshot=snapshot, rendered=rendered or render([family]), statuses={}, ready=True)


@contextlib.contextmanager
def exporter_server(**kwargs) -> Iterator[HttpServer]:
    server = HttpServer(StubExporter(publication(), ExporterConfig()), "127.0.0.1", 0, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def receiver_server() -> Iterator[int]:
    remediator = Remediator(SlurmIsolator(scontrol="/nonexistent"), CircuitBreaker(3, 3600), dry_run=True)
    server = RemediateServer(("127.0.0.1", 0), remediator, Authenticator(token=TOKEN))
    import threading

    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    time.sleep(0.05)
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def both(kind: str) -> Iterator[tuple[int, str]]:
    """(port, a GET path that answers 200) of the exporter or the receiver."""
    if kind == "exporter":
        with exporter_server() as server:
            yield server.port, "/-/healthy"
    else:
        with receiver_server() as port:
            yield port, "/-/healthy"


def exchange(port: int, payload: bytes, timeout: float = 3.0) -> bytes:
    """Send `payload`, half-close, and read until the server closes."""
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def statuses(answer: bytes) -> list[int]:
    """Status codes of the responses in `answer`, in order (bodies skipped by Content-Length)."""
    found = []
    rest = answer
    while rest.startswith(b"HTTP/1.1 "):
        head, _, rest = rest.partition(b"\r\n\r\n")
        found.append(int(head.split(b" ", 2)[1]))
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        rest = rest[length:]
    assert rest == b"", f"bytes after the last response: {rest[:80]!r}"
    return found


SERVERS = ["exporter", "receiver"]


# ---- framing -------------------------------------------------------------------------------------
AMBIGUOUS = {
    "content-length with transfer-encoding": b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
    "transfer-encoding with content-length": b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
    "two equal content-lengths": b"Content-Length: 4\r\nContent-Length: 4\r\n",
    "a content-length list": b"Content-Length: 4, 4\r\n",
    "a signed content-length": b"Content-Length: +4\r\n",
    "a hexadecimal content-length": b"Content-Length: 0x4\r\n",
    "an obs-folded header": b"X-A: b\r\n c\r\nContent-Length: 4\r\n",
    "whitespace before the colon": b"Content-Length : 4\r\n",
    "a bare LF": b"X-A: b\nContent-Length: 4\r\n",
    "transfer-encoding other than chunked": b"Transfer-Encoding: gzip\r\n",
}


@pytest.mark.parametrize("kind", SERVERS)
@pytest.mark.parametrize("case", sorted(AMBIGUOUS))
def test_ambiguous_framing_is_refused_with_400_and_the_connection_closes(kind: str, case: str) -> None:
    with both(kind) as (port, path):
        # what follows the head would be a second request to a parser that read the framing
        # differently: it must never be answered
        payload = f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode() + AMBIGUOUS[case] + b"\r\n"
        answer = exchange(port, payload + b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
    assert statuses(answer) == [400], answer[:300]
    assert b"Connection: close" in answer


@pytest.mark.parametrize("kind", SERVERS)
def test_a_chunked_request_body_is_answered_411_and_not_parsed(kind: str) -> None:
    with both(kind) as (port, path):
        body = b"1e\r\nGET /smuggled HTTP/1.1\r\nX: y\r\n\r\n0\r\n\r\n"
        answer = exchange(port, f"GET {path} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + body)
    assert statuses(answer) == [411]


@pytest.mark.parametrize("kind", SERVERS)
def test_a_get_body_is_read_not_parsed_as_a_second_request(kind: str) -> None:
    with both(kind) as (port, path):
        hidden = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        first = f"GET {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(hidden)}\r\n\r\n".encode() + hidden
        second = b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        answer = exchange(port, first + second)
    assert statuses(answer) == [200, 404], answer[:400]
    assert b"gpu_up" not in answer and b"gpulens_remediate" not in answer


def test_a_body_over_the_limit_is_refused_with_413() -> None:
    with exporter_server() as server:
        answer = exchange(server.port, b"GET /-/healthy HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n")
    assert statuses(answer) == [413]


# ---- negotiation (RFC 9110 §12.5) ------------------------------------------------------------------
def scrape(port: int, headers: dict[str, str]) -> tuple[str, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics", headers=headers)
    answer = conn.getresponse()
    body = answer.read()
    conn.close()
    return answer.getheader("Content-Type", ""), answer.getheader("Content-Encoding", ""), body


@pytest.mark.parametrize(
    ("accept", "openmetrics"),
    [
        ("text/plain;q=1, application/openmetrics-text;q=0.5", False),
        ("application/openmetrics-text;VERSION=2.0.0", False),
        ("application/openmetrics-text;Q=0", False),
        ("APPLICATION/*;q=0.5, text/plain;q=0.1", True),
    ],
)
def test_accept_is_negotiated_by_q_value_and_specificity(accept: str, openmetrics: bool) -> None:
    with exporter_server() as server:
        content_type, _, body = scrape(server.port, {"Accept": accept})
    assert content_type.startswith("application/openmetrics-text") is openmetrics
    assert body.endswith(b"# EOF\n") is openmetrics


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [("GZIP;Q=0", False), ("gzip;q=0.5, identity;q=1", False), ("gzip;q=1.5", False), ("gzip;q=0, *", False)],
)
def test_accept_encoding_honours_q_values_case_insensitively(accept_encoding: str, gzipped: bool) -> None:
    with exporter_server() as server:
        _, encoding, body = scrape(server.port, {"Accept-Encoding": accept_encoding})
    assert (encoding == "gzip") is gzipped
    assert (gzip.decompress(body) if gzipped else body).startswith(b"# HELP gpu_up")


# ---- bounded connections, requests and time ----------------------------------------------------------
def test_the_oldest_idle_connection_is_closed_first_and_kept_alive_ones_last() -> None:
    with exporter_server(max_connections=8) as server:
        kept = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        kept.request("GET", "/-/healthy")
        assert kept.getresponse().read() == b"OK\n"
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(7)]
        time.sleep(0.2)
        newer = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(3)]
        time.sleep(0.2)
        readable, _, _ = select.select(idle + newer, [], [], 0.5)
        closed = [sock in readable and sock.recv(1) == b"" for sock in idle + newer]
        kept.request("GET", "/-/healthy")
        still = kept.getresponse().read()
        for sock in idle + newer:
            sock.close()
        kept.close()
    assert closed == [True] * 3 + [False] * 4 + [False] * 3
    assert still == b"OK\n"


def test_a_trickled_request_head_is_cut_off_at_the_header_deadline() -> None:
    with exporter_server(limits=Limits(header_timeout=0.5)) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        answer = b""
        deadline = time.monotonic() + 5
        with contextlib.suppress(OSError):
            while time.monotonic() < deadline:
                sock.sendall(b"a")  # one byte every 50 ms never completes the head
                sock.settimeout(0.05)
                try:
                    chunk = sock.recv(4096)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                answer += chunk
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]


def test_an_idle_kept_alive_connection_is_closed_at_the_idle_deadline() -> None:
    with exporter_server(limits=Limits(idle_timeout=0.3)) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(4096)
        sock.settimeout(5)
        closed = sock.recv(4096)
        sock.close()
    assert first.startswith(b"HTTP/1.1 200 ")
    assert closed == b""


def test_a_head_trickled_after_a_kept_alive_answer_is_cut_off_at_the_header_deadline() -> None:
    # the idle deadline (long) was set by the answer; the head's first byte must bring it closer
    with exporter_server(limits=Limits(header_timeout=0.5, idle_timeout=60)) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(4096)
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nX-Slow: ")
        sock.settimeout(10)  # under the 60 s idle deadline: a head running on it times this recv out
        answer = sock.recv(4096)
        sock.close()
    assert first.startswith(b"HTTP/1.1 200 ")
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]


def test_the_idle_deadline_counts_from_the_last_answer_of_a_kept_alive_connection() -> None:
    with exporter_server(limits=Limits(idle_timeout=0.4)) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        answers = []
        for _ in range(6):  # 1.2 s of requests, three idle deadlines' worth
            sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
            answers.append(sock.recv(4096))
            time.sleep(0.2)
        sock.settimeout(5)
        closed = sock.recv(4096)
        sock.close()
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers), answers
    assert closed == b""


def test_a_client_that_stops_reading_is_cut_off_at_the_write_deadline() -> None:
    body = bytes(range(256)) * (1 << 17)  # 32 MiB, more than loopback socket buffers hold
    exporter = StubExporter(publication(Rendered(body, body)), ExporterConfig())
    server = HttpServer(exporter, "127.0.0.1", 0, limits=Limits(write_timeout=0.5))
    server.start()
    try:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(2)  # read nothing for four write deadlines
        stats, still_open = server.server.stats, server.server.open_connections()
        sock.close()
    finally:
        server.stop()
    assert stats.timed_out == 1
    assert still_open == 0


def test_headers_of_a_reloaded_web_config_are_on_the_next_answer_of_an_open_connection() -> None:
    with exporter_server() as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        before = sock.recv(4096)
        server.reload(WebConfig(headers=(("X-Frame-Options", "deny"),)))
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        after = sock.recv(4096)
        sock.close()
    assert b"X-Frame-Options" not in before
    assert b"\r\nX-Frame-Options: deny\r\n" in after


def test_answers_nobody_reads_hold_no_request_slot() -> None:
    body = bytes(range(256)) * (1 << 17)  # 32 MiB, more than loopback socket buffers hold
    exporter = StubExporter(publication(Rendered(body, body)), ExporterConfig())
    server = HttpServer(exporter, "127.0.0.1", 0, max_requests=2)
    server.start()
    stuck = []
    try:
        for _ in range(4):  # twice the slots: 32 MiB answers that nobody reads
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            stuck.append(sock)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/metrics")
        served = conn.getresponse()
        served_body = served.read()
        conn.close()
    finally:
        for sock in stuck:
            sock.close()
        server.stop()
    assert served.status == 200 and served_body == body


def sent_then_half_closed(data: bytes) -> bytes:
    """Everything the exporter answers to `data` sent at once, the client then half-closing."""
    with exporter_server() as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        sock.close()
    return received


def test_pipelined_requests_followed_by_a_half_close_are_all_answered() -> None:
    received = sent_then_half_closed(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
    answers = received.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert len(answers) == 3 and all(a.endswith(b"OK\n") for a in answers)
    # the half-close may arrive before or after the last answer is written: only the last may
    # announce the close, the connection is closed after it either way (recv above ended)
    assert all(b"Connection: close" not in a for a in answers[:-1])


def test_a_partial_request_after_a_half_close_is_dropped_after_the_complete_ones() -> None:
    received = sent_then_half_closed(
        b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\nGET /-/healthy HTTP/1.1\r\nHo"
    )
    assert received.count(b"HTTP/1.1 ") == 1


EMFILE_SCRIPT = textwrap.dedent(
    """
    import json, os, resource, sys, time
    from types import SimpleNamespace
    from gpulens.exporter.config import ExporterConfig
    from gpulens.exporter.server import HttpServer

    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    server = HttpServer(SimpleNamespace(current=None, config=ExporterConfig()), "127.0.0.1", 0)
    server.start()
    hog = []
    while True:  # what the rest of the process holds: every descriptor left
        try:
            hog.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            break
    print(server.port, flush=True)
    sys.stdin.readline()  # the parent connected: accept(2) now fails with EMFILE
    before = os.times()
    time.sleep(2)
    after = os.times()
    for fd in hog:
        os.close(fd)
    print(json.dumps({"cpu": after.user + after.system - before.user - before.system}), flush=True)
    time.sleep(5)
    """
)


def test_accept_failing_with_emfile_backs_off_instead_of_spinning_and_recovers() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", EMFILE_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        port = int(proc.stdout.readline())
        pending = socket.create_connection(("127.0.0.1", port), timeout=10)
        pending.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        cpu = json.loads(proc.stdout.readline())["cpu"]
        pending.settimeout(5)
        answer = pending.recv(4096)  # served once descriptors are free again
        pending.close()
    finally:
        proc.kill()
        proc.wait()
    assert cpu < 0.2, f"{cpu:.2f} s of CPU in 2 s while accept(2) failed"
    assert answer.startswith(b"HTTP/1.1 200 ")
