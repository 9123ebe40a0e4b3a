"""HTTP front of the receiver: POST /alerts, GET /metrics, GET /-/healthy, GET /-/state,
POST /-/breaker/reset, POST /-/return, GET /runbooks/<Alert> (gpulens.httpd.runbooks). Write
endpoints and `/-/state` (node names, recent actions, open episodes) need the caller's credentials;
`/-/healthy` (the probes), `/metrics` (Prometheus scrapes it; fixed label values, no node names)
and `/runbooks/` (public documentation) stay open. Errors are one line.

Served by `gpulens.httpd` (bounded connections, deadlines, strict framing; see its docstring),
over TLS and with response headers from `--web.config.file` as the exporter is (the same file
format, `gpulens.httpd.webconfig`). Credentials are checked on the request head, before any body
is read, so only a caller with valid or not yet checked credentials can make the receiver buffer
a body, at most `Limits.max_requests` bodies at once. A bcrypt check (basic_auth_users) that is not
cached runs on the worker pool before the request is handled, at most `MAX_PENDING_CHECKS` at once:
a flood of wrong passwords gets 503s, never the event loop.
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
from gpulens.httpd.runbooks import Runbooks
from gpulens.httpd.server import Limits, Request, Response, Server
from gpulens.httpd.webconfig import WebConfig
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
DEFAULT_TELEMETRY_PATH = "/metrics"
# what --web.telemetry-path may not take: the receiver's other endpoints
RESERVED_PATHS = ("/", "/-/healthy", "/-/ready", *PROTECTED_READS, *WRITE_PATHS)
MAX_PENDING_CHECKS = 4  # bcrypt checks queued on the worker pool at once; more get 503
UNAUTHORIZED_LINE = "unauthorized: send the shared bearer token or basic auth credentials"
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
    """Routes and credentials; `web` and `auth` may be swapped at any time (SIGHUP reload)."""

    keep_body = True

    def __init__(
        self,
        remediator: Remediator,
        auth: Authenticator,
        web: WebConfig | None = None,
        telemetry_path: str = DEFAULT_TELEMETRY_PATH,
    ) -> None:
        self.remediator = remediator
        self.auth = auth
        self.web = web or WebConfig()
        self.telemetry_path = telemetry_path
        self._pending_checks = 0
        self.runbooks = Runbooks()  # public documentation: /runbooks/<Alert> needs no credentials

    def _counted(self, head: Head, response: Response) -> Response:
        if head.path == "/alerts":
            self.remediator.metrics.requests.labels(code=str(response.status)).inc()
        return response

    @staticmethod
    def _protected(head: Head) -> bool:
        if head.method in ("GET", "HEAD"):
            return head.path in PROTECTED_READS
        return head.method == "POST" and head.path in WRITE_PATHS

    def check_head(self, head: Head) -> Response | None:
        """Answers that need no body: unknown paths and methods, credentials, missing lengths.

        Credentials whose bcrypt check is not cached pass here (the verdict is None) and are
        checked in `handle`, on the worker pool, before anything else is done."""
        if head.method in ("GET", "HEAD"):
            if head.path in PROTECTED_READS and self.auth.verdict(head.header("authorization")) is False:
                return _text(401, UNAUTHORIZED_LINE)
            return None
        if head.method in ("PUT", "DELETE", "PATCH"):
            return self._counted(head, _text(405, "method not allowed"))
        if head.method != "POST":
            return self._counted(head, _text(501, f"method {head.method} is not served", close=True))
        if head.path not in WRITE_PATHS:
            return _text(404, f"not found: {head.path}")
        if self.auth.verdict(head.header("authorization")) is False:
            return self._counted(head, _text(401, UNAUTHORIZED_LINE))
        if head.path in SIZED_PATHS:
            if head.header("content-length") is None:
                return self._counted(head, _text(411, "Content-Length required"))
            if head.content_length > MAX_BODY:
                return self._counted(head, _text(413, f"body larger than {MAX_BODY} bytes", close=True))
        return None

    def handle(self, request: Request) -> Response | Awaitable[Response]:
        head = request.head
        if self._protected(head):
            verdict = self.auth.verdict(head.header("authorization"))
            if verdict is None:
                return self._checked(request)
            if not verdict:  # another request's check, finished since the head, said no
                return self._counted(head, _text(401, UNAUTHORIZED_LINE))
        return self._route(request)

    async def _checked(self, request: Request) -> Response:
        """The bcrypt check on the worker pool, then the request as usual."""
        head = request.head
        if self._pending_checks >= MAX_PENDING_CHECKS:
            return self._counted(head, _text(503, "too many password checks in progress, try again later"))
        self._pending_checks += 1
        try:
            ok = await request.run_blocking(self.auth.verify, head.header("authorization"))
        finally:
            self._pending_checks -= 1
        if not ok:
            return self._counted(head, _text(401, UNAUTHORIZED_LINE))
        answer = self._route(request)
        return await answer if not isinstance(answer, Response) else answer

    def _route(self, request: Request) -> Response | Awaitable[Response]:
        head = request.head
        if head.method == "POST":
            return self._post(request)
        path = head.path
        if path == self.telemetry_path:
            return Response(200, self.remediator.metrics.render(), "text/plain; version=0.0.4")
        if path == "/-/healthy":
            return _text(200, "OK")
        if path == "/-/state":
            return self._state(request)
        if path == "/":
            return _text(
                200,
                "gpulens remediate: POST Alertmanager webhooks to /alerts; see /-/state, "
                f"{self.telemetry_path} and the alerts' runbooks at /runbooks/",
            )
        return self.runbooks.answer(path) or _text(404, f"not found: {path}")

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
        web: WebConfig | None = None,
        telemetry_path: str = DEFAULT_TELEMETRY_PATH,
    ) -> None:
        self.remediator = remediator
        self.app = ReceiverApp(remediator, auth, web, telemetry_path)
        self._server = Server(
            self.app,
            address[0],
            address[1],
            limits=limits,
            tls=lambda: self.app.web.tls_context,
            extra_headers=lambda: self.app.web.headers,
            server_name="gpulens-remediate",
            logger=log,
        )
        remediator.metrics.watch_server(self._server)
        self.server_address = self._server.address

    @property
    def auth(self) -> Authenticator:
        return self.app.auth

    @property
    def web(self) -> WebConfig:
        return self.app.web

    def reload(self, web: WebConfig, auth: Authenticator) -> None:
        """Swap the web config and the credentials (SIGHUP): new connections use the new TLS
        context, every request after the swap the new users and headers."""
        self.app.web, self.app.auth = web, auth

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
