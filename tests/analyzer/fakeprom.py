"""A tiny HTTP server that answers /api/v1/query with canned bodies (for error-path tests)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextlib.contextmanager
def fake_prometheus(
    responses: list[tuple[int, bytes]] | Callable[[bytes, int], tuple[int, bytes]],
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Serve `responses` in order of arrival (the last repeats), or what `responses(body, n)` gives
    for the n-th request (from 0) with that body; yields (base URL, recorded requests)."""
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()  # the client sends queries concurrently

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            sent = self.rfile.read(length)
            request = {"path": self.path, "headers": dict(self.headers), "body": sent}
            with lock:
                same = sum(1 for r in seen if r["body"] == sent)
                seen.append(request)
                arrived = len(seen) - 1
            if callable(responses):
                status, body = responses(sent, same)
            else:
                status, body = responses[min(arrived, len(responses) - 1)]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
