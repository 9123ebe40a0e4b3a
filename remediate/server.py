"""HTTP front of the receiver: POST /alerts, GET /metrics, GET /-/healthy, GET /-/state,
POST /-/breaker/reset, POST /-/return. Write endpoints and `/-/state` (node names, recent actions,
open episodes) need the caller's credentials; `/-/healthy` (the probes) and `/metrics` (Prometheus
scrapes it; fixed label values, no node names) stay open. Errors are one line.

Served by `gpulens.httpd` (bounded connections, deadlines, strict framing; see its docstring).
Credentials are checked on the request head, before any body is read, so only an authenticated
caller can make the receiver buffer a body, and at most `Limits.max_requests` bodies at once.
A notification is appended to the queue (queue.py: an fsynced line with --state-dir) on the
server's worker pool and answered 200 at once; the dispatcher acts on it afterwards, so a slow
orchestrator never holds Alertmanager or an HTTP slot. A full queue answers 503 (retried).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable
from http import HTTPStatus

from gpulens.httpd.parse import Head
from gpulens.httpd.server import Limits, Request, Response, Server
from gpulens.remediate.auth import Authenticator
from gpulens.remediate.payload import PayloadError, parse_webhook
from gpulens.remediate.queue import QueueError, QueueFull
from gpulens.remediate.service import Remediator

MAX_BODY = 1 << 20  # Alertmanager notifications are small; refuse anything larger
# A refused body is still read (and dropped) up to this much, so a client that sends it anyway
# gets to read the 413 instead of a broken pipe; beyond it the connection is just closed.
DRAIN_LIMIT = 4 << 20
LIMITS = Limits(
    max_connections=256,
    max_requests=16,
    max_body=MAX_BODY,
    drain_limit=DRAIN_LIMIT,
    workers=8,
)
WRITE_PATHS = ("/alerts", "/-/breaker/reset", "/-/return")
PROTECTED_READS = ("/-/state",)  # GET/HEAD behind the same credentials as the writes
SIZED_PATHS = ("/alerts", "/-/return")  # these read a body
UNAUTHORIZED_CHALLENGE = (
    ("WWW-Authenticate", 'Bearer realm="gpulens-remediate", Basic realm="gpulens-remediate"'),
)
log = logging.getLogger("gpulens.remediate")


def _text(status: int, line: str, close: bool = False) -> Response:
    headers = UNAUTHORIZED_CHALLENGE if status == HTTPStatus.UNAUTHORIZED else ()
    return Response(status, (line + "\n").encode(), headers=headers, close=close)


def _json(status: int, doc: object) -> Response:
    return Response(status, (json.dumps(doc, indent=1) + "\n").encode(), "application/json")


class ReceiverApp:
    keep_body = True

    def __init__(self, remediator: Remediator, auth: Authenticator) -> None:
        self.remediator = remediator
        self.auth = auth

    def _counted(self, head: Head, response: Response) -> Response:
        if head.path == "/alerts":
            self.remediator.metrics.requests.labels(code=str(response.status)).inc()
        return response

    def check_head(self, head: Head) -> Response | None:
        """Answers that need no body: unknown paths and methods, credentials, missing lengths."""
        if head.method in ("GET", "HEAD"):
            if head.path in PROTECTED_READS and not self.auth.allows(head.header("authorization")):
                return _text(401, "unauthorized: send the shared bearer token or basic auth credentials")
            return None
        if head.method in ("PUT", "DELETE", "PATCH"):
            return self._counted(head, _text(405, "method not allowed"))
        if head.method != "POST":
            return self._counted(head, _text(501, f"method {head.method} is not served", close=True))
        if head.path not in WRITE_PATHS:
            return _text(404, f"not found: {head.path}")
        if not self.auth.allows(head.header("authorization")):
            return self._counted(
                head, _text(401, "unauthorized: send the shared bearer token or basic auth credentials")
            )
        if head.path in SIZED_PATHS:
            if head.header("content-length") is None:
                return self._counted(head, _text(411, "Content-Length required"))
            if head.content_length > MAX_BODY:
                return self._counted(head, _text(413, f"body larger than {MAX_BODY} bytes", close=True))
        return None

    def handle(self, request: Request) -> Response | Awaitable[Response]:
        head = request.head
        if head.method == "POST":
            return self._post(request)
        path = head.path
        if path == "/metrics":
            return Response(200, self.remediator.metrics.render(), "text/plain; version=0.0.4")
        if path == "/-/healthy":
            return _text(200, "OK")
        if path == "/-/state":
            return self._state(request)
        if path == "/":
            return _text(
                200, "gpulens remediate: POST Alertmanager webhooks to /alerts; see /-/state and /metrics"
            )
        return _text(404, f"not found: {path}")

    async def _state(self, request: Request) -> Response:
        return _json(200, await request.run_blocking(self.remediator.state))  # takes the handling lock

    async def _post(self, request: Request) -> Response:
        head = request.head
        if head.path == "/-/breaker/reset":
            await request.run_blocking(self.remediator.breaker.reset)
            log.warning("circuit breaker reset by %s", request.peer)
            return _text(200, "circuit breaker closed")
        if head.path == "/-/return":
            return await self._return(request)
        try:
            alerts = parse_webhook(request.body)
        except PayloadError as exc:
            return self._counted(head, _text(400, f"bad payload: {exc}"))
        try:
            entry = await request.run_blocking(self.remediator.submit, alerts)
        except QueueFull as exc:
            log.warning("notification of %d alerts refused: queue full: %s", len(alerts), exc)
            return self._counted(head, _text(503, f"queue full: {exc}; retry later"))
        except QueueError as exc:
            log.error("notification of %d alerts not queued: %s", len(alerts), exc)
            return self._counted(head, _text(503, f"not queued: {exc}; retry later"))
        except Exception as exc:  # a bug must answer 500, not drop the connection
            log.exception("queuing %d alerts failed", len(alerts))
            return self._counted(head, _text(500, f"internal error: {type(exc).__name__}: {exc}"))
        # acknowledged: the actions follow (see /-/state and the log)
        answer = json.dumps({"queued": len(alerts), "id": entry.id}) + "\n"
        return self._counted(head, Response(200, answer.encode(), "application/json"))

    async def _return(self, request: Request) -> Response:
        """POST /-/return {"node": ..., "force": false}: what `gpulens remediate return` sends."""
        try:
            doc = json.loads(request.body)
            node, force = doc["node"], doc.get("force", False)
            if not isinstance(node, str) or not isinstance(force, bool):
                raise TypeError
        except (ValueError, KeyError, TypeError, RecursionError):
            return _text(400, 'bad request: expected {"node": NAME, "force": false}')
        outcome = await request.run_blocking(self.remediator.return_node, node, force)
        return _json(200, {"node": node, "result": outcome.result, "detail": outcome.detail})


class RemediateServer:
    """The receiver's listener; keeps socketserver's interface (serve_forever, shutdown,
    server_close, server_address) that the CLI and the tests drive."""

    def __init__(
        self,
        address: tuple[str, int],
        remediator: Remediator,
        auth: Authenticator,
        limits: Limits = LIMITS,
    ) -> None:
        self.remediator = remediator
        self.auth = auth
        self.app = ReceiverApp(remediator, auth)
        self._server = Server(
            self.app, address[0], address[1], limits=limits, server_name="gpulens-remediate", logger=log
        )
        remediator.metrics.watch_server(self._server)
        self.server_address = self._server.address

    @property
    def server(self) -> Server:
        return self._server

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until `shutdown()`; `poll_interval` is accepted for socketserver compatibility."""
        self._server.serve_forever()

    def shutdown(self) -> None:
        self._server.shutdown()

    def request_stop(self) -> None:
        """Make `serve_forever` return soon; for signal handlers running on the serving thread."""
        self._server.request_stop()

    def server_close(self) -> None:
        self._server.close()
