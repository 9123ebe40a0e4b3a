"""HTTP(S) endpoints: `/` landing page, `/metrics`, `/-/healthy`, `/-/ready`.

A threaded `http.server`: each connection has its own thread, and `/metrics` only writes bytes the
sampler already rendered, so scrapes never wait for NVML. TLS handshakes happen in the connection's
thread (not in the accept loop), so a slow client cannot stall others.
"""

from __future__ import annotations

import html
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpulens import __version__
from gpulens.exporter.render import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    accepts_gzip,
    wants_openmetrics,
)
from gpulens.exporter.webconfig import WebConfig


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], handler: type, tls: ssl.SSLContext | None, family: int
    ) -> None:
        self.address_family = family
        self.tls = tls
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        if self.tls is not None:
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        logging.getLogger("gpulens.exporter.http").debug(
            "connection from %s failed", client_address, exc_info=True
        )


def make_handler(exporter: Any, web: WebConfig) -> type[BaseHTTPRequestHandler]:
    """A handler class bound to one exporter (its `current` publication) and web config."""
    log = logging.getLogger("gpulens.exporter.http")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body go out in separate writes; with Nagle on, a keep-alive client's delayed
        # ACK stalls the body ~40 ms (seen with small gzip bodies)
        disable_nagle_algorithm = True
        server_version = f"gpulens-exporter/{__version__}"
        timeout = 60

        def setup(self) -> None:
            super().setup()
            if isinstance(self.connection, ssl.SSLSocket):
                self.connection.settimeout(10)
                self.connection.do_handshake()
                self.connection.settimeout(self.timeout)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def _send(
            self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _authorised(self) -> bool:
            if web.basic_auth is None or web.basic_auth.check(self.headers.get("Authorization")):
                return True
            self._send(
                401,
                b"Unauthorized\n",
                "text/plain; charset=utf-8",
                {"WWW-Authenticate": 'Basic realm="gpulens-exporter"'},
            )
            return False

        def do_GET(self) -> None:
            if not self._authorised():
                return
            path = self.path.split("?", 1)[0]
            route: Callable[[], None] | None = {
                exporter.config.telemetry_path: self._metrics,
                "/": self._landing,
                "/-/healthy": self._healthy,
                "/-/ready": self._ready,
            }.get(path)
            if route is None:
                self._send(404, b"Not Found\n", "text/plain; charset=utf-8")
                return
            route()

        do_HEAD = do_GET

        def _metrics(self) -> None:
            rendered = exporter.current.rendered
            openmetrics = wants_openmetrics(self.headers.get("Accept"))
            gzipped = accepts_gzip(self.headers.get("Accept-Encoding"))
            headers = {"Vary": "Accept, Accept-Encoding"}
            if gzipped:
                headers["Content-Encoding"] = "gzip"
            self._send(
                200,
                rendered.body(openmetrics, gzipped),
                OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE,
                headers,
            )

        def _healthy(self) -> None:
            self._send(200, b"OK\n", "text/plain; charset=utf-8")

        def _ready(self) -> None:
            if exporter.current.ready:
                self._send(200, b"Ready\n", "text/plain; charset=utf-8")
            else:
                self._send(503, b"Not ready: no sample yet\n", "text/plain; charset=utf-8")

        def _landing(self) -> None:
            self._send(200, landing_page(exporter).encode(), "text/html; charset=utf-8")

    return Handler


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
<p><a href="{metrics_path}">Metrics</a> · <a href="/-/healthy">healthy</a> · <a href="/-/ready">ready</a></p>
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
    """The listening server, run on a background thread (`start`) or in the foreground."""

    def __init__(self, exporter: Any, host: str, port: int, web: WebConfig | None = None) -> None:
        web = web or WebConfig()
        tls = web.tls.context() if web.tls is not None else None
        family = socket.AF_INET6 if (":" in host or host == "") and socket.has_ipv6 else socket.AF_INET
        bind_host = host or ("::" if family == socket.AF_INET6 else "0.0.0.0")
        try:
            self._server = _Server((bind_host, port), make_handler(exporter, web), tls, family)
        except OSError:
            if host:
                raise
            self._server = _Server(("0.0.0.0", port), make_handler(exporter, web), tls, socket.AF_INET)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="gpulens-http", daemon=True)
        self._thread.start()

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
