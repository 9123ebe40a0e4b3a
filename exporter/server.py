"""HTTP(S) endpoints: `/` landing page, `/metrics` (`--web.telemetry-path`), `/-/healthy`, `/-/ready`,
`/runbooks/<Alert>` (the shipped runbooks, `gpulens.httpd.runbooks`; behind basic auth when it is on).

Served by `gpulens.httpd` (one event-loop thread, bounded connections and deadlines; its module
docstring says why no server library is used). `/metrics` writes the bytes the sampler already
rendered, so a scrape never waits for NVML and costs well under a millisecond of the loop's time.
Only bcrypt checks that are not cached run on the worker pool, at most `MAX_PENDING_CHECKS` at once,
so a flood of wrong passwords cannot hold the parallel-request slots that scrapes need.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Awaitable
from typing import Any

from gpulens import __version__
from gpulens.exporter.config import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_REQUESTS
from gpulens.exporter.render import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Rendered,
    accepts_gzip,
    wants_openmetrics,
)
from gpulens.httpd.parse import Head
from gpulens.httpd.runbooks import Runbooks
from gpulens.httpd.server import Limits, Request, Response, Server, text
from gpulens.httpd.webconfig import WebConfig

MAX_PENDING_CHECKS = 4
UNAUTHORIZED = Response(
    401, b"Unauthorized\n", headers=(("WWW-Authenticate", 'Basic realm="gpulens-exporter"'),)
)
log = logging.getLogger("gpulens.exporter.http")


class ExporterApp:
    """Routes and basic auth; the web config can be swapped at any time (SIGHUP reload)."""

    keep_body = False  # GET bodies are read and dropped, never parsed as a request

    def __init__(self, exporter: Any, web: WebConfig) -> None:
        self.exporter = exporter
        self.web = web
        self._pending_checks = 0
        # the four /metrics answers of the rendered sample now being served, built on first use
        self._answers_of: Rendered | None = None
        self._answers: dict[tuple[bool, bool], Response] = {}
        self.runbooks = Runbooks()

    def check_head(self, head: Head) -> Response | None:
        if head.method not in ("GET", "HEAD"):
            return text(501, f"method {head.method} is not served", close=True)
        return None

    def handle(self, request: Request) -> Response | Awaitable[Response]:
        auth = self.web.basic_auth
        if auth is None:
            return self._route(request)
        header = request.head.header("authorization")
        verdict = auth.cached(header)
        if verdict is None:
            return self._checked(request, header)
        return self._route(request) if verdict else UNAUTHORIZED

    async def _checked(self, request: Request, header: str | None) -> Response:
        auth = self.web.basic_auth
        if auth is None:
            return self._route(request)
        if self._pending_checks >= MAX_PENDING_CHECKS:
            return text(503, "too many password checks in progress, try again later")
        self._pending_checks += 1
        try:
            ok = await request.run_blocking(auth.verify, header)
        finally:
            self._pending_checks -= 1
        return self._route(request) if ok else UNAUTHORIZED

    def _route(self, request: Request) -> Response:
        path = request.head.path
        if path == self.exporter.config.telemetry_path:
            return self._metrics(request.head)
        if path == "/":
            return Response(200, landing_page(self.exporter).encode(), "text/html; charset=utf-8")
        if path == "/-/healthy":
            return text(200, "OK")
        if path == "/-/ready":
            if self.exporter.current.ready:
                return text(200, "Ready")
            return text(503, "Not ready: no sample yet")
        return self.runbooks.answer(path) or text(404, "Not Found")

    def _metrics(self, head: Head) -> Response:
        rendered = self.exporter.current.rendered
        key = (wants_openmetrics(head.header("accept")), accepts_gzip(head.header("accept-encoding")))
        if rendered is not self._answers_of:  # a new sample was published
            self._answers_of, self._answers = rendered, {}
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = metrics_answer(rendered, *key)
        return answer


def metrics_answer(rendered: Rendered, openmetrics: bool, gzipped: bool) -> Response:
    headers: tuple[tuple[str, str], ...] = (("Vary", "Accept, Accept-Encoding"),)
    if gzipped:
        headers += (("Content-Encoding", "gzip"),)
    return Response(
        200,
        rendered.body(openmetrics, gzipped),
        OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE,
        headers,
    )


def landing_page(exporter: Any) -> str:
    published = exporter.current
    snap = published.snapshot
    esc = html.escape
    gpu_rows = "".join(
        f"<tr><td>{g.identity.index}</td><td>{esc(g.identity.model)}</td><td>{esc(g.identity.uuid)}</td>"
        f"<td>{'up' if g.up else 'DOWN'}</td><td>{esc(g.error)}</td></tr>"
        for g in snap.gpus
    )
    collector_rows = "".join(
        f"<tr><td>{esc(name)}</td><td>{'ok' if status.success else 'FAILED'}</td>"
        f"<td>{status.seconds * 1000:.2f} ms</td></tr>"
        for name, status in sorted(published.statuses.items())
    )
    nvml = "up" if snap.nvml_up else f"DOWN ({esc(snap.nvml_error)})"
    hint = getattr(exporter, "hint", "")
    hint_html = f'<p class="hint"><strong>{esc(hint)}</strong></p>\n' if hint else ""
    metrics_path = esc(exporter.config.telemetry_path, quote=True)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>gpulens exporter</title></head>
<body>
<h1>gpulens exporter {esc(__version__)}</h1>
<p><a href="{metrics_path}">Metrics</a> · <a href="/-/healthy">healthy</a> · <a href="/-/ready">ready</a>
· <a href="/runbooks/">runbooks</a></p>
{hint_html}<p>Backend: {esc(exporter.backend_name)} · NVML: {nvml} · driver {esc(snap.driver_version or "-")}
· sampling every {exporter.config.interval:g} s · GPUs seen: {snap.gpu_count}</p>
<h2>GPUs</h2>
<table border="1"><tr><th>gpu</th><th>model</th><th>uuid</th><th>state</th><th>error</th></tr>
{gpu_rows}</table>
<h2>Collectors</h2>
<table border="1"><tr><th>collector</th><th>last sample</th><th>duration</th></tr>{collector_rows}</table>
</body></html>
"""


class HttpServer:
    """The listening server, run on a background thread (`start`) or in the foreground.

    `reload(web)` swaps the web config (SIGHUP): new connections use its TLS context, every request
    after the swap its users and headers; connections already open keep their TLS session.
    """

    def __init__(
        self,
        exporter: Any,
        host: str,
        port: int,
        web: WebConfig | None = None,
        *,
        max_requests: int = DEFAULT_MAX_REQUESTS,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        limits: Limits | None = None,
    ) -> None:
        self.app = ExporterApp(exporter, web or WebConfig())
        # one worker: bcrypt is CPU-bound by design, checks queue instead of competing for the cores
        limits = limits or Limits(max_connections=max_connections, max_requests=max_requests, workers=1)
        self._server = Server(
            self.app,
            host,
            port,
            limits=limits,
            tls=lambda: self.app.web.tls_context,
            extra_headers=lambda: self.app.web.headers,
            server_name=f"gpulens-exporter/{__version__}",
            logger=log,
        )
        exporter.http = self._server  # its own series are rendered with the exporter's

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def server(self) -> Server:
        return self._server

    @property
    def web(self) -> WebConfig:
        return self.app.web

    def reload(self, web: WebConfig) -> None:
        self.app.web = web

    def start(self) -> None:
        self._server.start()

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.stop()
