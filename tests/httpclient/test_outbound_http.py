"""Outbound HTTP cannot be hijacked (issue 17, item 5): the shared client (gpulens.httpclient) and
its two users, the remediation receiver's Kubernetes client and the analyzer's Prometheus client,
against real HTTP servers on 127.0.0.1: one that redirects to another port, one that drip-feeds
its answer, one that answers too much."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpulens import httpclient
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.sources.promclient import PromClient, PromConfig
from gpulens.remediate.kubernetes import KubernetesClient, KubernetesError, KubernetesIsolator
from gpulens.remediate.model import IsolationRequest

VECTOR = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
NODE = json.dumps({"kind": "Node", "metadata": {"name": "gpu-1"}, "spec": {"unschedulable": True}}).encode()


@dataclass
class Server:
    """A real HTTP server; `answer(handler)` writes each reply. Records (method, path, Authorization)."""

    answer: Callable[[BaseHTTPRequestHandler], None]
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    url: str = ""


@contextlib.contextmanager
def serve(answer: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[Server]:
    server_state = Server(answer)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            server_state.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up
                server_state.answer(self)

        do_GET = do_POST = do_PATCH = _any

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    server_state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield server_state
    finally:
        server.shutdown()
        server.server_close()


def reply(status: int, body: bytes, **headers: str) -> Callable[[BaseHTTPRequestHandler], None]:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            handler.send_header(name.replace("_", "-"), value)
        handler.end_headers()
        handler.wfile.write(body)

    return answer


def redirect_to(target: Server, status: int = 302) -> Callable[[BaseHTTPRequestHandler], None]:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        reply(status, b"", Location=target.url + handler.path)(handler)

    return answer


def drip(body: bytes, every_s: float = 0.05) -> Callable[[BaseHTTPRequestHandler], None]:
    """A complete, valid answer, one byte at a time: each read is quick, the whole is slow."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        raw = head.encode() + body
        for i in range(len(raw)):
            handler.wfile.write(raw[i : i + 1])
            handler.wfile.flush()
            time.sleep(every_s)

    return answer


def chunked_forever(handler: BaseHTTPRequestHandler) -> None:
    """A chunked answer with no Content-Length that never ends on its own (8 MiB of zeros)."""
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b"0" * 65536
    for _ in range(128):
        handler.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    handler.wfile.write(b"0\r\n\r\n")


# ---- the shared client ---------------------------------------------------------------------------


def test_a_redirect_to_another_origin_is_refused_and_the_credentials_stay_home():
    with serve(reply(200, b"{}")) as elsewhere, serve(lambda h: None) as home:
        home.answer = redirect_to(elsewhere)
        with pytest.raises(httpclient.RedirectRefused) as info:
            httpclient.request(
                "GET", f"{home.url}/api", deadline=5, headers={"Authorization": "Bearer secret"}
            )
    assert elsewhere.seen == []
    assert "another origin http://127.0.0.1:" in str(info.value)


def test_a_redirect_within_the_same_origin_is_followed():
    def answer(handler: BaseHTTPRequestHandler) -> None:
        if handler.path == "/old":
            reply(307, b"", Location="/new")(handler)
        else:
            reply(200, b'{"ok": true}')(handler)

    with serve(answer) as home:
        response = httpclient.request("POST", f"{home.url}/old", deadline=5, body=b"q=1")
    assert (response.status, response.body, response.url) == (200, b'{"ok": true}', f"{home.url}/new")
    assert [m for m, _, _ in home.seen] == ["POST", "POST"]


def test_a_drip_fed_answer_ends_at_the_total_deadline():
    with serve(drip(b'{"ok": true}' * 10)) as slow, pytest.raises(httpclient.DeadlineExceeded) as info:
        httpclient.request("GET", f"{slow.url}/x", deadline=0.5)
    assert "within 0.5s (total deadline)" in str(info.value)


def test_a_drip_fed_header_ends_at_the_total_deadline():
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(200):
            handler.wfile.write(b"X: y\r\n")
            handler.wfile.flush()
            time.sleep(0.05)

    with serve(answer) as slow, pytest.raises(httpclient.DeadlineExceeded):
        httpclient.request("GET", f"{slow.url}/x", deadline=0.5)


def test_an_answer_over_the_limit_is_refused_by_its_declared_length():
    with serve(reply(200, b"x" * 5000)) as big, pytest.raises(httpclient.TooLarge) as info:
        httpclient.request("GET", f"{big.url}/x", deadline=5, max_bytes=4096)
    assert "answer of 5000 bytes is over the 4096-byte limit" in str(info.value)


def test_an_answer_over_the_limit_is_cut_off_while_streaming():
    with serve(chunked_forever) as big, pytest.raises(httpclient.TooLarge):
        httpclient.request("GET", f"{big.url}/x", deadline=10, max_bytes=1 << 20)


def test_a_truncated_answer_is_an_error():
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\nshort")
        handler.close_connection = True

    with serve(answer) as cut, pytest.raises(httpclient.HttpError, match="cut short"):
        httpclient.request("GET", f"{cut.url}/x", deadline=5)


# ---- the Kubernetes client of the remediation receiver -------------------------------------------


def _request() -> IsolationRequest:
    return IsolationRequest("isolate_gpu", "gpu-1", "GPULost", "fp", "fp@t", gpu="0", uuid="GPU-0")


def test_kubernetes_token_is_never_sent_to_a_redirect_target(tmp_path):
    token = tmp_path / "token"
    token.write_text("sa-token")
    with serve(reply(200, NODE)) as elsewhere, serve(lambda h: None) as api:
        api.answer = redirect_to(elsewhere)
        isolator = KubernetesIsolator(KubernetesClient(api.url, token_file=token))
        outcome = isolator.isolate(_request(), 0, httpclient.Deadline(5))
    assert elsewhere.seen == []
    assert outcome.result == "failed"
    assert "redirected (HTTP 302) to another origin" in outcome.detail


def test_kubernetes_drip_feed_is_cut_off_by_the_deadline():
    with serve(drip(NODE)) as api:
        client = KubernetesClient(api.url, timeout_s=0.5)
        with pytest.raises(KubernetesError, match="total deadline"):
            client.request("GET", "/api/v1/nodes/gpu-1")


def test_kubernetes_answers_are_bounded_in_size():
    with serve(reply(200, b'{"kind": "Node", "pad": "' + b"x" * 10_000 + b'"}')) as api:
        client = KubernetesClient(api.url, max_bytes=4096)
        with pytest.raises(KubernetesError, match="over the 4096-byte limit"):
            client.request("GET", "/api/v1/nodes/gpu-1")


# ---- the Prometheus client of the analyzer -------------------------------------------------------


def test_prometheus_bearer_token_is_never_sent_to_a_redirect_target():
    with serve(reply(200, VECTOR)) as elsewhere, serve(lambda h: None) as prom:
        prom.answer = redirect_to(elsewhere)
        client = PromClient(PromConfig(prom.url, bearer_token="prom-token", retries=0))
        with pytest.raises(AnalyzerError, match="another origin"):
            client.query("up", 1750000000)
    assert elsewhere.seen == []


def test_prometheus_basic_auth_is_never_sent_to_a_redirect_target():
    with serve(reply(200, VECTOR)) as elsewhere, serve(lambda h: None) as prom:
        prom.answer = redirect_to(elsewhere, status=307)
        client = PromClient(PromConfig(prom.url, basic_auth=("u", "p"), retries=2))
        with pytest.raises(AnalyzerError, match="another origin"):
            client.query("up", 1750000000)
    assert elsewhere.seen == []
    assert len(prom.seen) == 1, "a refused redirect is not retried"


def test_prometheus_drip_feed_is_cut_off_by_the_deadline():
    with serve(drip(VECTOR)) as prom:
        client = PromClient(PromConfig(prom.url, timeout_s=0.5, retries=0))
        with pytest.raises(AnalyzerError, match="total deadline"):
            client.query("up", 1750000000)


def test_prometheus_answers_are_bounded_in_size():
    with serve(chunked_forever) as prom:
        client = PromClient(PromConfig(prom.url, max_response_bytes=1 << 20, retries=2))
        with pytest.raises(AnalyzerError, match="byte limit"):
            client.query("up", 1750000000)
    assert len(prom.seen) == 1, "an oversized answer is not retried"
