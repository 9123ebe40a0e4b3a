"""Security (issue 11): TLS + basic auth with real HTTPS, nothing leaked, labels escaped, and the
remediation receiver refusing callers without the shared secret.

Certificates (a CA, a server certificate for 127.0.0.1, a client certificate, and a rogue CA's
client certificate) are generated here with `cryptography`; passwords are bcrypt hashes.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import json
import logging
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpulens.exporter.server import HttpServer
from gpulens.httpd.webconfig import load_web_config
from tests.reliability.expo import parsed_samples, series
from tests.reliability.harness import LiveExporter, live_exporter
from tests.support.procs import free_port

PASSWORD = "correct horse battery staple"
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-PLANTED-ENV-SECRET",
    "DATABASE_URL": "postgres://admin:PLANTED-DB-PASSWORD@db/prod",
    "HF_TOKEN": "hf_PLANTEDTOKEN0123456789",
}
CMDLINE_SECRET = "--api-key=sk-PLANTED-CMDLINE-SECRET"
PLANTED_USER = "planted-user-mallory"

pytestmark = pytest.mark.slow  # real HTTP(S) against a running exporter


# ---- certificates ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path
    rogue_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _cert(subject: str, key, issuer: str, issuer_key, *, ca: bool = False, ip: str | None = None):
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ip:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert=None, key=None) -> Path:
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca_key, rogue_ca_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert("gpulens test CA", ca_key, "gpulens test CA", ca_key, ca=True)
    server_key, client_key, rogue_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    return Pki(
        ca=_write(d / "ca.crt", ca),
        server_cert=_write(
            d / "server.crt", _cert("exporter", server_key, "gpulens test CA", ca_key, ip="127.0.0.1")
        ),
        server_key=_write(d / "server.key", key=server_key),
        client_cert=_write(d / "client.crt", _cert("prometheus", client_key, "gpulens test CA", ca_key)),
        client_key=_write(d / "client.key", key=client_key),
        rogue_cert=_write(d / "rogue.crt", _cert("prometheus", rogue_key, "rogue CA", rogue_ca_key)),
        rogue_key=_write(d / "rogue.key", key=rogue_key),
    )


def web_config(tmp_path: Path, pki: Pki, client_auth: str | None = None) -> Path:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    if client_auth:
        tls |= {"client_ca_file": str(pki.ca), "client_auth_type": client_auth}
    path = tmp_path / "web.yml"
    path.write_text(json.dumps({"tls_server_config": tls, "basic_auth_users": {"prometheus": hashed}}))
    return path


@contextlib.contextmanager
def https_server(live: LiveExporter, config: Path) -> Iterator[str]:
    server = HttpServer(live.exporter, "127.0.0.1", 0, load_web_config(config))
    server.start()
    try:
        yield f"https://127.0.0.1:{server.port}"
    finally:
        server.stop()


def client_context(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def fetch(
    url: str, ctx: ssl.SSLContext, authorization: str | None = None
) -> tuple[int, dict[str, Any], bytes]:
    headers = {"Authorization": authorization} if authorization else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=5, context=ctx
        ) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveExporter]:
    def plant(node) -> None:
        # secrets in the environment and command line of processes the exporter attributes
        node.add_process(
            {
                "pid": 99001,
                "gpu": 7,
                "user": PLANTED_USER,
                "name": "python",
                "cmdline": ["python", "serve.py", CMDLINE_SECRET],
                "environ": SECRETS,
                "workload": {"pattern": "constant", "memory": "1GiB"},
            }
        )
        # a job id carrying exposition syntax: quotes, backslashes, a newline and a fake sample
        node.add_process(
            {
                "pid": 99002,
                "gpu": 6,
                "user": PLANTED_USER,
                "environ": {"SLURM_JOB_ID": 'evil"} 1\nfake_injected_metric{a="b"} 42\\', **SECRETS},
                "workload": {"pattern": "constant", "memory": "1GiB"},
            }
        )

    with live_exporter(
        tmp_path_factory.mktemp("security"),
        interval=0.5,
        before_start=plant,
        collectors=frozenset({"device", "memory", "processes", "jobs", "mps", "mig", "xid"}),
    ) as running:
        running.wait_for(
            lambda b: any(lab.get("gpu") == "6" for lab, _ in series(b, "gpu_job_info")),
            what="the planted jobs",
        )
        yield running


# ---- TLS and basic auth -------------------------------------------------------------------------
def test_https_with_the_right_password_serves_metrics(live: LiveExporter, pki: Pki, tmp_path: Path) -> None:
    with https_server(live, web_config(tmp_path, pki)) as url:
        status, _, body = fetch(f"{url}/metrics", client_context(pki), basic("prometheus", PASSWORD))
    assert status == 200 and b"gpu_up" in body


WRONG = {
    "no credentials": None,
    "wrong password": basic("prometheus", "Tr0ub4dor&3"),
    "unknown user": basic("root", PASSWORD),
    "empty password": basic("prometheus", ""),
    "password prefix": basic("prometheus", PASSWORD[:-1]),
    "bearer instead": f"Bearer {PASSWORD}",
    "not base64": "Basic !!!not-base64!!!",
    "no colon": "Basic " + base64.b64encode(PASSWORD.encode()).decode(),
    "huge": "Basic " + "A" * 60000,
    "non-utf8": "Basic " + base64.b64encode(b"prometheus:\xff\xfe").decode(),
}


@pytest.mark.parametrize("path", ["/metrics", "/", "/-/healthy", "/-/ready", "/nope"])
def test_wrong_credentials_get_401_and_nothing_else(
    live: LiveExporter, pki: Pki, tmp_path: Path, path: str, bad_input
) -> None:
    with https_server(live, web_config(tmp_path, pki)) as url:
        for what, authorization in WRONG.items():
            bad_input("credentials")
            status, headers, body = fetch(f"{url}{path}", client_context(pki), authorization)
            assert status == 401, what
            assert "Basic" in headers.get("WWW-Authenticate", ""), what
            assert body == b"Unauthorized\n", (what, body[:80])
        status, _, _ = fetch(f"{url}{path}", client_context(pki), basic("prometheus", PASSWORD))
        assert status in (200, 404)
    log_text = "\n".join(live.logs.lines(min_level=logging.DEBUG))
    assert PASSWORD not in log_text and "Tr0ub4dor" not in log_text  # credentials never logged
    assert base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode() not in log_text


def test_plain_http_to_the_tls_port_gets_no_metrics(live: LiveExporter, pki: Pki, tmp_path: Path) -> None:
    with https_server(live, web_config(tmp_path, pki)) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            with contextlib.suppress(OSError):
                answer = sock.recv(65536)
    assert b"gpu_up" not in answer


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_below_1_2_is_refused(live: LiveExporter, pki: Pki, tmp_path: Path) -> None:
    with https_server(live, web_config(tmp_path, pki)) as url:
        ctx = client_context(pki)
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            fetch(f"{url}/metrics", ctx, basic("prometheus", PASSWORD))


def test_mutual_tls_accepts_only_certificates_from_the_client_ca(
    live: LiveExporter, pki: Pki, tmp_path: Path
) -> None:
    config = web_config(tmp_path, pki, client_auth="RequireAndVerifyClientCert")
    with https_server(live, config) as url:
        ok = fetch(
            f"{url}/metrics",
            client_context(pki, pki.client_cert, pki.client_key),
            basic("prometheus", PASSWORD),
        )
        assert ok[0] == 200 and b"gpu_up" in ok[2]
        for cert, key in ((None, None), (pki.rogue_cert, pki.rogue_key)):
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                fetch(f"{url}/metrics", client_context(pki, cert, key), basic("prometheus", PASSWORD))
        still = fetch(
            f"{url}/-/healthy",
            client_context(pki, pki.client_cert, pki.client_key),
            basic("prometheus", PASSWORD),
        )
        assert still[0] == 200  # failed handshakes did not take the listener down


def test_a_stalled_tls_handshake_does_not_block_other_clients(
    live: LiveExporter, pki: Pki, tmp_path: Path
) -> None:
    with https_server(live, web_config(tmp_path, pki)) as url:
        port = int(url.rsplit(":", 1)[1])
        stalled = [socket.create_connection(("127.0.0.1", port), timeout=3) for _ in range(20)]
        try:
            status, _, _ = fetch(f"{url}/metrics", client_context(pki), basic("prometheus", PASSWORD))
            assert status == 200
            for sock in stalled:  # answered while every stalled handshake is still open
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(1)
        finally:
            for sock in stalled:
                sock.close()


# ---- nothing leaked ------------------------------------------------------------------------------
def leaked(text: str) -> list[str]:
    planted = [*SECRETS.values(), "PLANTED", CMDLINE_SECRET, "sk-PLANTED", "serve.py", PLANTED_USER]
    return [needle for needle in planted if needle in text]


def test_no_environment_command_line_or_user_name_in_metrics_landing_page_or_logs(live: LiveExporter) -> None:
    live.logs.setLevel(logging.DEBUG)
    time.sleep(1.1)  # two more samples, logged at debug
    metrics = live.scrape().body.decode()
    landing = live.scrape("/").body.decode()
    log_text = "\n".join(live.logs.lines(min_level=logging.DEBUG))
    assert 'pid="99001"' in metrics  # the planted process is exported (per-pid collector on)...
    assert leaked(metrics) == []  # ...without its environment, command line or user
    assert leaked(landing) == []
    assert leaked(log_text) == []


def test_hostile_job_ids_are_escaped_and_cannot_inject_samples(live: LiveExporter, tmp_path: Path) -> None:
    body = live.scrape().body
    samples = parsed_samples(body)  # the strict parser accepts the whole exposition
    assert not [s for s in samples if s.name.startswith("fake_injected_metric")]
    assert not [line for line in body.decode().splitlines() if line.startswith("fake_injected_metric")]
    jobs = [s.labels["job_id"] for s in samples if s.name == "gpu_job_info" and s.labels.get("gpu") == "6"]
    assert jobs and all("\n" not in j and '"' not in j for j in jobs), jobs
    assert any("evil" in j for j in jobs), jobs
    promtool = shutil.which("promtool")
    if promtool:
        path = tmp_path / "metrics.prom"
        path.write_bytes(body)
        done = subprocess.run(
            [promtool, "check", "metrics"], stdin=path.open("rb"), capture_output=True, text=True
        )
        assert "error" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr


# ---- the remediation receiver ----------------------------------------------------------------------
TOKEN = "remediate-shared-token-7f3a"


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    d = tmp_path_factory.mktemp("remediate")
    record = d / "scontrol-calls.txt"
    scontrol = d / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    scontrol.chmod(0o755)
    (d / "token").write_text(TOKEN + "\n")
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "gpulens.cli",
        "remediate",
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--backend",
        "slurm",
        "--apply",
        "--token-file",
        str(d / "token"),
        "--scontrol",
        str(scontrol),
    ]
    log = (d / "remediate.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/healthy", timeout=1):
                    break
            except (urllib.error.URLError, OSError):
                assert proc.poll() is None, (d / "remediate.log").read_text()
                assert time.monotonic() < deadline, "receiver did not start"
                time.sleep(0.1)
        yield url, record
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def webhook(node: str) -> bytes:
    alert = {
        "status": "firing",
        "labels": {
            "alertname": "GPUXidFallenOffBus",
            "instance": f"{node}:9842",
            "gpu": "0",
            "uuid": "GPU-0",
            "severity": "critical",
            "remediate": "isolate_node",
        },
        "annotations": {"summary": "x."},
        "startsAt": "2026-11-29T21:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": f"fp-{node}",
    }
    return json.dumps(
        {
            "version": "4",
            "status": "firing",
            "receiver": "gpulens-remediate",
            "groupKey": "{}:{}",
            "truncatedAlerts": 0,
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://am",
            "alerts": [alert],
        }
    ).encode()


def post(url: str, body: bytes, authorization: str | None) -> int:
    headers = {
        "Content-Type": "application/json",
        **({"Authorization": authorization} if authorization else {}),
    }
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=10) as r:
            status: int = r.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code


REFUSED = {
    "none": None,
    "wrong token": "Bearer not-the-token",
    "empty bearer": "Bearer ",
    "token prefix": f"Bearer {TOKEN[:-1]}",
    "token plus suffix": f"Bearer {TOKEN}x",
    "token as basic password": basic("alertmanager", TOKEN),
    "unknown scheme": f"Token {TOKEN}",
    "huge": "Bearer " + "x" * 60000,
}


def test_the_remediation_receiver_refuses_callers_without_the_token(
    receiver: tuple[str, Path], bad_input
) -> None:
    url, record = receiver
    for what, authorization in REFUSED.items():
        bad_input("remediation caller")
        assert post(f"{url}/alerts", webhook("refused-node"), authorization) == 401, what
        assert post(f"{url}/-/breaker/reset", b"", authorization) == 401, what
    assert not record.exists() or "refused-node" not in record.read_text()


def test_the_remediation_receiver_acts_for_the_authenticated_caller(receiver: tuple[str, Path]) -> None:
    url, record = receiver
    assert post(f"{url}/alerts", webhook("gpu-node-17"), f"Bearer {TOKEN}") == 200  # queued; acted on next
    deadline = time.monotonic() + 10
    while not (record.exists() and "gpu-node-17" in record.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "gpu-node-17" in record.read_text()


@pytest.mark.slow
def test_a_real_prometheus_scrapes_over_mutual_tls_with_basic_auth_and_wrong_credentials_fail(
    live: LiveExporter, pki: Pki, tmp_path: Path
) -> None:
    from tests.support.procs import PromAPI, find_binary, running

    config = web_config(tmp_path, pki, client_auth="RequireAndVerifyClientCert")
    with https_server(live, config) as url:
        target = url.removeprefix("https://")
        tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}

        def job(name: str, password: str) -> dict[str, Any]:
            return {
                "job_name": name,
                "scheme": "https",
                "tls_config": tls,
                "basic_auth": {"username": "prometheus", "password": password},
                "static_configs": [{"targets": [target]}],
            }

        prom_config = tmp_path / "prometheus.yml"
        prom_config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s"},
                    "scrape_configs": [job("gpulens-tls", PASSWORD), job("gpulens-wrong", "guess")],
                }
            )
        )
        port = free_port()
        cmd = [
            find_binary("prometheus"),
            f"--config.file={prom_config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        with running(cmd, f"http://127.0.0.1:{port}/-/ready", tmp_path / "prometheus.log", timeout=60):
            prom = PromAPI(f"http://127.0.0.1:{port}")
            good = prom.wait_for('up{job="gpulens-tls"} == 1', timeout=30)
            assert len(good) == 1
            assert len(prom.wait_for('gpu_up{job="gpulens-tls"}', predicate=lambda r: len(r) == 8)) == 8
            assert prom.wait_for('up{job="gpulens-wrong"} == 0', timeout=30)
            assert prom.query('gpu_up{job="gpulens-wrong"}') == []


def test_the_remediation_receiver_in_basic_auth_mode_refuses_wrong_credentials(bad_input) -> None:
    import threading

    from gpulens.remediate.auth import Authenticator
    from gpulens.remediate.breaker import CircuitBreaker
    from gpulens.remediate.server import RemediateServer
    from gpulens.remediate.service import Remediator
    from gpulens.remediate.slurm import SlurmIsolator

    remediator = Remediator(
        SlurmIsolator(scontrol="/nonexistent/scontrol"), CircuitBreaker(3, 3600), dry_run=True
    )
    server = RemediateServer(
        ("127.0.0.1", 0), remediator, Authenticator(username="alertmanager", password="am-secret-pw")
    )
    remediator.start()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/alerts"
        refused = {
            "none": None,
            "wrong password": basic("alertmanager", "guess"),
            "wrong user": basic("admin", "am-secret-pw"),
            "password as bearer": "Bearer am-secret-pw",
            "empty": basic("", ""),
            "not base64": "Basic %%%",
        }
        for what, authorization in refused.items():
            bad_input("remediation caller")
            assert post(url, webhook("basic-node"), authorization) == 401, what
        assert remediator.drain(30) and remediator.state()["actions"] == []
        assert post(url, webhook("basic-node"), basic("alertmanager", "am-secret-pw")) == 200
        assert remediator.drain(30), "the queued notification was acted on"
        assert remediator.state()["actions"]  # recorded (dry-run: logged, not executed)
    finally:
        server.shutdown()
        server.server_close()
        remediator.stop()
