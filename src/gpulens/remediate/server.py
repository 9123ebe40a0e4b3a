"""HTTP front of the receiver: POST /alerts, GET /metrics, GET /-/healthy, GET /-/state,
POST /-/breaker/reset. Write endpoints need the caller's credentials; errors are one line."""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpulens.remediate.auth import Authenticator
from gpulens.remediate.payload import PayloadError, parse_webhook
from gpulens.remediate.service import Remediator

MAX_BODY = 1 << 20  # Alertmanager notifications are small; refuse anything larger
# A refused body is still read (and dropped) up to this much, so a client that sends it anyway
# gets to read the 413 instead of a broken pipe; beyond it the connection is just closed.
DRAIN_LIMIT = 4 << 20
DRAIN_SECONDS = 2.0
log = logging.getLogger("gpulens.remediate")


class RemediateServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], remediator: Remediator, auth: Authenticator) -> None:
        super().__init__(address, RemediateHandler)
        self.remediator = remediator
        self.auth = auth


class RemediateHandler(BaseHTTPRequestHandler):
    server: RemediateServer
    server_version = "gpulens-remediate"

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header(
                "WWW-Authenticate", 'Bearer realm="gpulens-remediate", Basic realm="gpulens-remediate"'
            )
        self.end_headers()
        self.wfile.write(body)
        if self.path.split("?")[0] == "/alerts":
            self.server.remediator.metrics.requests.labels(code=str(status)).inc()

    def _discard(self, length: int) -> None:
        """Read and drop a refused body, bounded in size and time (see DRAIN_LIMIT)."""
        if length > DRAIN_LIMIT:
            return
        self.connection.settimeout(DRAIN_SECONDS)
        try:
            while length > 0:
                chunk = self.rfile.read(min(length, 64 << 10))
                if not chunk:
                    return
                length -= len(chunk)
        except OSError:
            return

    def _text(self, status: int, line: str) -> None:
        self._send(status, (line + "\n").encode())

    def _json(self, status: int, doc: object) -> None:
        self._send(status, (json.dumps(doc, indent=1) + "\n").encode(), "application/json")

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/metrics":
            self._send(200, self.server.remediator.metrics.render(), "text/plain; version=0.0.4")
        elif path == "/-/healthy":
            self._text(200, "OK")
        elif path == "/-/state":
            self._json(200, self.server.remediator.state())
        elif path == "/":
            self._text(
                200, "gpulens remediate: POST Alertmanager webhooks to /alerts; see /-/state and /metrics"
            )
        else:
            self._text(404, f"not found: {path}")

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        if path not in ("/alerts", "/-/breaker/reset", "/-/return"):
            self._text(404, f"not found: {path}")
            return
        if not self.server.auth.allows(self.headers.get("Authorization")):
            self._text(401, "unauthorized: send the shared bearer token or basic auth credentials")
            return
        if path == "/-/breaker/reset":
            self.server.remediator.breaker.reset()
            log.warning("circuit breaker reset by %s", self.address_string())
            self._text(200, "circuit breaker closed")
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._text(411, "Content-Length required")
            return
        if int(length) > MAX_BODY:
            self._discard(int(length))
            self.close_connection = True
            self._text(413, f"body larger than {MAX_BODY} bytes")
            return
        if path == "/-/return":
            self._return(self.rfile.read(int(length)))
            return
        try:
            alerts = parse_webhook(self.rfile.read(int(length)))
        except PayloadError as exc:
            self._text(400, f"bad payload: {exc}")
            return
        try:
            records = self.server.remediator.handle(alerts)
        except Exception as exc:  # a bug must answer 500, not drop the connection
            log.exception("handling %d alerts failed", len(alerts))
            self._text(500, f"internal error: {type(exc).__name__}: {exc}")
            return
        self._json(
            200,
            {"handled": [{"alertname": r.alertname, "node": r.node, "result": r.result} for r in records]},
        )

    def _return(self, body: bytes) -> None:
        """POST /-/return {"node": ..., "force": false}: what `gpulens remediate return` sends."""
        try:
            doc = json.loads(body)
            node, force = doc["node"], doc.get("force", False)
            if not isinstance(node, str) or not isinstance(force, bool):
                raise TypeError
        except (ValueError, KeyError, TypeError, RecursionError):
            self._text(400, 'bad request: expected {"node": NAME, "force": false}')
            return
        outcome = self.server.remediator.return_node(node, force)
        self._json(200, {"node": node, "result": outcome.result, "detail": outcome.detail})

    def do_PUT(self) -> None:
        self._text(405, "method not allowed")

    do_DELETE = do_PUT
    do_PATCH = do_PUT
