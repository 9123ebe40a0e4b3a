"""HTTP behaviour: endpoints, negotiation, TLS and basic auth, with real (HTTPS) requests."""

from __future__ import annotations

import base64
import contextlib
import gzip
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
from prometheus_client.core import GaugeMetricFamily

from gpulens.exporter.app import Published
from gpulens.exporter.config import ConfigError, ExporterConfig
from gpulens.exporter.render import render
from gpulens.exporter.server import HttpServer
from gpulens.exporter.snapshot import NodeSnapshot
from gpulens.httpd.webconfig import WebConfig, load_web_config
from tests.exporter.tls_material import TlsFiles, make_tls_files


@dataclass
class StubExporter:
    """Just what the server reads: the current publication, the config and the backend name."""

    current: Published
    config: ExporterConfig
    backend_name: str = "stub"


def _published(ready: bool) -> Published:
    family = GaugeMetricFamily("gpu_up", "1 if up.", labels=["gpu", "uuid"])
    family.add_metric(["0", "GPU-0"], 1.0)
    snapshot = NodeSnapshot(timestamp=1.0, duration_seconds=0.0, nvml_up=True)
    return Published(snapshot=snapshot, rendered=render([family]), statuses={}, ready=ready)


@contextlib.contextmanager
def serving(
    web: WebConfig | None = None, ready: bool = True, config: ExporterConfig | None = None
) -> Iterator[tuple[HttpServer, StubExporter]]:
    exporter = StubExporter(current=_published(ready), config=config or ExporterConfig())
    server = HttpServer(exporter, "127.0.0.1", 0, web)
    server.start()
    try:
        yield server, exporter
    finally:
        server.stop()


def get(url: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_telemetry_path_moves_the_metrics_and_the_landing_page_links_there() -> None:
    with serving(config=ExporterConfig(telemetry_path="/gpu/metrics")) as (server, _):
        status, _, body = get(f"http://127.0.0.1:{server.port}/gpu/metrics")
        old, _, _ = get(f"http://127.0.0.1:{server.port}/metrics")
        _, _, landing = get(f"http://127.0.0.1:{server.port}/")
    assert status == 200 and b"gpu_up" in body
    assert old == 404
    assert b'href="/gpu/metrics"' in landing


def test_metrics_serves_text_format_by_default() -> None:
    with serving() as (server, _):
        status, headers, body = get(f"http://127.0.0.1:{server.port}/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b'gpu_up{gpu="0",uuid="GPU-0"} 1.0' in body


def test_metrics_negotiates_openmetrics_and_gzip() -> None:
    with serving() as (server, _):
        status, headers, body = get(
            f"http://127.0.0.1:{server.port}/metrics",
            {"Accept": "application/openmetrics-text;version=1.0.0", "Accept-Encoding": "gzip"},
        )
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body).endswith(b"# EOF\n")


def test_ready_is_503_until_the_first_sample() -> None:
    with serving(ready=False) as (server, exporter):
        assert get(f"http://127.0.0.1:{server.port}/-/ready")[0] == 503
        assert get(f"http://127.0.0.1:{server.port}/-/healthy")[0] == 200
        exporter.current = _published(ready=True)
        assert get(f"http://127.0.0.1:{server.port}/-/ready")[0] == 200


def test_a_scrape_after_a_new_publication_gets_the_new_sample() -> None:
    with serving() as (server, exporter):
        url = f"http://127.0.0.1:{server.port}/metrics"
        first = get(url, {"Accept-Encoding": "gzip"})[2]
        family = GaugeMetricFamily("gpu_up", "1 if up.", labels=["gpu", "uuid"])
        family.add_metric(["0", "GPU-0"], 0.0)
        snapshot = NodeSnapshot(timestamp=2.0, duration_seconds=0.0, nvml_up=True)
        exporter.current = Published(snapshot=snapshot, rendered=render([family]), statuses={}, ready=True)
        second = get(url, {"Accept-Encoding": "gzip"})[2]
    assert b'gpu_up{gpu="0",uuid="GPU-0"} 1.0' in gzip.decompress(first)
    assert b'gpu_up{gpu="0",uuid="GPU-0"} 0.0' in gzip.decompress(second)


def test_landing_page_links_metrics_and_names_the_backend() -> None:
    with serving() as (server, _):
        status, _, body = get(f"http://127.0.0.1:{server.port}/")
    assert status == 200
    assert b'href="/metrics"' in body
    assert b"stub" in body


def test_unknown_path_is_404() -> None:
    with serving() as (server, _):
        assert get(f"http://127.0.0.1:{server.port}/nope")[0] == 404


# ---- web config: TLS and basic auth ---------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def _hash(password: str) -> str:
    # exporter-toolkit docs use $2y$ hashes (htpasswd -B); bcrypt accepts them
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$", 1)


def _auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _client_context(files: TlsFiles, with_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(files.ca_cert))
    if with_cert:
        ctx.load_cert_chain(str(files.client_cert), str(files.client_key))
    return ctx


def test_https_with_basic_auth_accepts_right_and_rejects_wrong_credentials(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    config = tmp_path / "web.yml"
    config.write_text(
        f"tls_server_config:\n  cert_file: {tls_files.server_cert}\n  key_file: {tls_files.server_key}\n"
        f"basic_auth_users:\n  prometheus: '{_hash('s3cret')}'\n"
    )
    web = load_web_config(config)
    ctx = _client_context(tls_files, with_cert=False)
    with serving(web) as (server, _):
        url = f"https://127.0.0.1:{server.port}/metrics"
        ok = get(url, _auth("prometheus", "s3cret"), ctx)
        again = get(url, _auth("prometheus", "s3cret"), ctx)  # served from the check cache
        wrong = get(url, _auth("prometheus", "guess"), ctx)
        unknown = get(url, _auth("mallory", "s3cret"), ctx)
        missing = get(url, None, ctx)
    assert ok[0] == 200 and b"gpu_up" in ok[2]
    assert again[0] == 200
    assert wrong[0] == unknown[0] == missing[0] == 401
    assert wrong[1]["WWW-Authenticate"].startswith("Basic ")


def test_plain_http_to_a_tls_listener_gets_no_metrics(tmp_path: Path, tls_files: TlsFiles) -> None:
    config = tmp_path / "web.yml"
    config.write_text(
        f"tls_server_config:\n  cert_file: {tls_files.server_cert}\n  key_file: {tls_files.server_key}\n"
    )
    with (
        serving(load_web_config(config)) as (server, _),
        pytest.raises((urllib.error.URLError, ConnectionError, OSError)),
    ):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read()


def test_mutual_tls_requires_a_client_certificate(tmp_path: Path, tls_files: TlsFiles) -> None:
    config = tmp_path / "web.yml"
    config.write_text(
        "tls_server_config:\n"
        f"  cert_file: {tls_files.server_cert}\n  key_file: {tls_files.server_key}\n"
        f"  client_ca_file: {tls_files.ca_cert}\n  client_auth_type: RequireAndVerifyClientCert\n"
    )
    with serving(load_web_config(config)) as (server, _):
        url = f"https://127.0.0.1:{server.port}/metrics"
        assert get(url, None, _client_context(tls_files, with_cert=True))[0] == 200
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError, OSError)):
            get(url, None, _client_context(tls_files, with_cert=False))


def test_relative_certificate_paths_are_relative_to_the_config_file(tls_files: TlsFiles) -> None:
    config = tls_files.ca_cert.parent / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    assert load_web_config(config).tls is not None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n", "cert_file"),
        ("tls_server_config:\n  cert_file: server.crt\n", "key_file"),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            "  client_auth_type: Maybe\n",
            "client_auth_type",
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            "  client_auth_type: RequireAndVerifyClientCert\n",
            "client_ca_file",
        ),
        ("basic_auth_users:\n  alice: hunter2\n", "basic_auth_users.alice"),
        ("colour: blue\n", "colour"),
        ("tls_server_config: [\n", "YAML"),
        ("tls_server_config:\n  cert_file: server.key\n  key_file: server.crt\n", "tls_server_config"),
    ],
)
def test_bad_web_config_names_the_field(tls_files: TlsFiles, text: str, field: str) -> None:
    config = tls_files.ca_cert.parent / "bad.yml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=field) as info:
        load_web_config(config)
    assert "\n" not in str(info.value)


def test_landing_page_of_a_real_exporter_lists_gpus_and_collector_status(exporter) -> None:
    exporter.refresh()
    server = HttpServer(exporter, "127.0.0.1", 0)
    server.start()
    try:
        status, _, body = get(f"http://127.0.0.1:{server.port}/")
        ready = get(f"http://127.0.0.1:{server.port}/-/ready")[0]
    finally:
        server.stop()
    page = body.decode()
    assert status == 200 and ready == 200
    assert "GPUs seen: 4" in page
    assert "NVIDIA H100 80GB HBM3" in page
    for collector in ("device", "mig", "jobs", "profiling"):
        assert f"<td>{collector}</td><td>ok</td>" in page


def test_json_log_lines_are_json_objects() -> None:
    import json
    import logging

    from gpulens.logsetup import JsonFormatter

    record = logging.LogRecord(
        "gpulens.exporter", logging.WARNING, __file__, 1, "GPU %d: %s", (2, "lost"), None
    )
    line = JsonFormatter().format(record)
    payload = json.loads(line)
    assert payload["level"] == "warning"
    assert payload["msg"] == "GPU 2: lost"
    assert payload["logger"] == "gpulens.exporter"


def test_keep_alive_gzip_scrapes_are_not_delayed_by_nagle() -> None:
    # header and body are separate writes: with Nagle and delayed ACKs each scrape took ~40 ms, so
    # the server's end of every connection has TCP_NODELAY (read from the socket, not timed)
    import http.client
    import os
    import socket

    def server_end_nodelay(client: socket.socket) -> int | None:
        for fd in os.listdir("/proc/self/fd"):
            try:
                sock = socket.socket(fileno=os.dup(int(fd)))
            except OSError:
                continue
            with sock:
                try:
                    if sock.getpeername() == client.getsockname():
                        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                except OSError:
                    continue
        return None

    with serving() as (server, _):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        response = connection.getresponse()
        response.read()
        assert response.status == 200
        assert connection.sock is not None
        assert server_end_nodelay(connection.sock)
        connection.close()
