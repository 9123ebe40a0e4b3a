"""One set of conventions for both servers (issue 32 item 7): the exporter and `gpulens remediate`
take the same web config file (TLS, basic auth, headers), log formats and self-metrics flags.

Each server runs as its own process, as it is deployed; HTTPS is checked with the standard
library's client trusting a throwaway CA, and the receiver gets its notifications from a real
Alertmanager over TLS.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import yaml

from tests.alerts.test_alertmanager import shipped_config_copy
from tests.exporter.tls_material import TlsFiles, make_tls_files
from tests.support.procs import alertmanager, free_port, running

TOKEN = "conventions-token"
USER, PASSWORD = "prometheus", "scrape-pw"
SERVERS = ("exporter", "receiver")
# what basic auth guards on each: the exporter everything, the receiver its state and writes
PROTECTED = {"exporter": "/metrics", "receiver": "/-/state"}
LOGFMT_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)(?: |$)')


@dataclass(frozen=True)
class Served:
    port: int
    context: ssl.SSLContext | None
    log: Path

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        if self.context is None:
            conn: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        else:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=self.context)
        try:
            conn.request("GET", path, headers=headers or {})
            answer = conn.getresponse()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
        finally:
            conn.close()


def command(server: str, port: int, tmp_path: Path, *extra: str) -> list[str]:
    """The server on 127.0.0.1:`port` with the new flag names; the receiver over a no-op scontrol."""
    listen = ["--web.listen-address", f"127.0.0.1:{port}"]
    if server == "exporter":
        return [sys.executable, "-m", "gpulens.exporter.cli", "--simulate", "dgx-h100", *listen, *extra]
    (tmp_path / "token").write_text(TOKEN)
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\nexit 0\n")
    scontrol.chmod(0o755)
    cmd = [sys.executable, "-m", "gpulens.cli", "remediate", "--backend", "slurm", *listen]
    return [*cmd, "--scontrol", str(scontrol), "--token-file", str(tmp_path / "token"), *extra]


def web_config(tmp_path: Path, tls: TlsFiles) -> Path:
    """One file for both servers: TLS, one basic auth user (bcrypt, low cost for speed), a header."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key)},
                "basic_auth_users": {USER: hashed},
                "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
            }
        )
    )
    return path


def trusting(ca: Path) -> ssl.SSLContext:
    """A client that verifies the server's certificate (it names 127.0.0.1) against `ca`."""
    return ssl.create_default_context(cafile=str(ca))


@contextmanager
def serving(
    server: str, tmp_path: Path, *extra: str, context: ssl.SSLContext | None = None
) -> Iterator[Served]:
    """`server` until the block ends (then SIGTERM); ready once /-/healthy answers 200, asked with
    the test's basic auth credentials (the exporter guards every path with them)."""
    port = free_port()
    served = Served(port, context, tmp_path / f"{server}.log")
    with served.log.open("wb") as log:
        proc = subprocess.Popen(command(server, port, tmp_path, *extra), stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, served.log.read_text()[-3000:]
                try:
                    if served.get("/-/healthy", basic(USER, PASSWORD))[0] == 200:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, served.log.read_text()[-3000:]
                time.sleep(0.1)
            yield served
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.parametrize("server", SERVERS)
def test_both_servers_serve_tls_and_basic_auth_from_the_same_web_config_file(
    server: str, tmp_path: Path
) -> None:
    tls = make_tls_files(tmp_path)
    web = web_config(tmp_path, tls)
    with serving(server, tmp_path, "--web.config.file", str(web), context=trusting(tls.ca_cert)) as served:
        path = PROTECTED[server]
        status, headers, _ = served.get(path, basic(USER, PASSWORD))
        assert status == 200
        assert headers["x-content-type-options"] == "nosniff"
        assert served.get(path, basic(USER, "wrong"))[0] == 401
        assert served.get(path)[0] == 401
        with pytest.raises((ssl.SSLError, ConnectionError)):  # no plain HTTP on the TLS port
            Served(served.port, None, served.log).get("/-/healthy")


def sample_names(exposition: bytes) -> set[bytes]:
    return {
        line.split(b"{")[0].split(b" ")[0] for line in exposition.splitlines() if not line.startswith(b"#")
    }


@pytest.mark.parametrize("server", SERVERS)
def test_both_servers_expose_process_and_python_self_metrics(server: str, tmp_path: Path) -> None:
    with serving(server, tmp_path) as served:
        deadline = time.monotonic() + 30
        while b"process_cpu_seconds_total" not in (body := served.get("/metrics")[2]):
            assert time.monotonic() < deadline, body[-2000:]  # the exporter's first sample
            time.sleep(0.2)
    names = sample_names(body)
    assert {b"process_resident_memory_bytes", b"process_open_fds", b"python_info"} <= names
    assert b"python_gc_collections_total" in names


@pytest.mark.parametrize("server", SERVERS)
def test_web_disable_exporter_metrics_leaves_the_self_metrics_out(server: str, tmp_path: Path) -> None:
    with serving(server, tmp_path, "--web.disable-exporter-metrics") as served:
        deadline = time.monotonic() + 30
        while b"gpulens_http_connections_accepted_total" not in (body := served.get("/metrics")[2]):
            assert time.monotonic() < deadline, body[-2000:]
            time.sleep(0.2)
    names = sample_names(body)
    assert not [n for n in names if n.startswith((b"process_", b"python_"))]


BAD_WEB_CONFIGS = [
    pytest.param(
        "tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n", "cert_file", id="no-cert"
    ),
    pytest.param("basic_auth_users:\n  alice: plaintext\n", "basic_auth_users.alice", id="not-bcrypt"),
    pytest.param("tls_server_config:\n  ciphers: [x]\n", "unknown field 'ciphers'", id="unknown-field"),
    pytest.param(
        "http_server_config:\n  headers:\n    Server: x\n", "http_server_config.headers", id="header"
    ),
]


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize(("text", "field"), BAD_WEB_CONFIGS)
def test_a_bad_web_config_file_is_one_line_naming_the_file_and_field(
    server: str, text: str, field: str, tmp_path: Path
) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    cmd = command(server, free_port(), tmp_path, "--web.config.file", str(path))
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert str(path) in lines[0] and field in lines[0]


def log_lines(served: Served) -> list[str]:
    """What the server wrote on stdout and stderr (read after it stopped: every line is out)."""
    return [line for line in served.log.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("server", SERVERS)
def test_json_logs_are_one_object_per_line_on_both_servers(server: str, tmp_path: Path) -> None:
    with serving(server, tmp_path, "--log.format", "json", "--log.level", "debug") as served:
        pass
    lines = log_lines(served)
    records = [json.loads(line) for line in lines]
    assert records and all({"time", "level", "logger", "msg"} <= set(r) for r in records)
    assert any(r["level"] == "info" and "listening" in r["msg"] for r in records), records


@pytest.mark.parametrize("server", SERVERS)
def test_logfmt_logs_are_key_value_lines_on_both_servers(server: str, tmp_path: Path) -> None:
    with serving(server, tmp_path, "--log.format", "logfmt", "--log.level", "info") as served:
        pass
    lines = log_lines(served)
    assert lines
    for line in lines:
        pairs = LOGFMT_PAIR.findall(line)
        assert "".join(f"{k}={v} " for k, v in pairs).strip() == line, line
        assert [k for k, _ in pairs][:4] == ["time", "level", "logger", "msg"], line
    assert any("listening" in line for line in lines)


def test_the_receiver_takes_warn_as_a_log_level(tmp_path: Path) -> None:
    with serving("receiver", tmp_path, "--log.level", "warn") as served:
        pass
    lines = log_lines(served)
    assert not any("level=info" in line for line in lines), lines


def test_the_receivers_earlier_flag_names_work_and_each_logs_one_warning_naming_the_new_one(
    tmp_path: Path,
) -> None:
    port = free_port()
    cmd = command("receiver", port, tmp_path)
    cmd = [arg if arg != "--web.listen-address" else "--listen" for arg in cmd] + ["--log-level", "info"]
    log = tmp_path / "receiver.log"
    with running(cmd, f"http://127.0.0.1:{port}/-/healthy", log, timeout=60):
        pass
    warnings = [line for line in log.read_text().splitlines() if "deprecated" in line]
    assert len(warnings) == 2, warnings
    assert "--listen is deprecated: use --web.listen-address" in warnings[0]
    assert "--log-level is deprecated: use --log.level" in warnings[1]
    assert all("level=warn" in line for line in warnings)


def test_the_receiver_over_tls_accepts_alertmanagers_notifications(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {"tls_server_config": {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key)}}
        )
    )
    context = trusting(tls.ca_cert)
    with serving("receiver", tmp_path, "--web.config.file", str(web), context=context) as served:
        url = f"https://127.0.0.1:{served.port}/alerts"
        config_path = shipped_config_copy(
            tmp_path, webhook_url=url, token_file=tmp_path / "token", group_wait="1s"
        )
        config = yaml.safe_load(config_path.read_text())
        (receiver,) = [r for r in config["receivers"] if r["name"] == "gpulens-remediate"]
        receiver["webhook_configs"][0]["http_config"]["tls_config"] = {"ca_file": str(tls.ca_cert)}
        config_path.write_text(yaml.safe_dump(config))
        alert = {
            "labels": {
                "alertname": "GPUXidFallenOffBus",
                "severity": "critical",
                "scope": "gpu",
                "class": "fault",
                "remediate": "isolate_node",
                "instance": "gpu-node-7:9842",
                "gpu": "2",
            }
        }
        with alertmanager(tmp_path, config_path) as am:
            request = urllib.request.Request(
                f"{am}/api/v2/alerts",
                data=json.dumps([alert]).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            urllib.request.urlopen(request, timeout=10).close()
            deadline = time.monotonic() + 60
            while True:
                state = json.loads(served.get("/-/state", {"Authorization": f"Bearer {TOKEN}"})[2])
                actions = [a for a in state["actions"] if a["alertname"] == "GPUXidFallenOffBus"]
                if actions:
                    break
                assert time.monotonic() < deadline, state
                time.sleep(0.25)
    assert actions[0]["node"] == "gpu-node-7" and actions[0]["result"] == "dry_run"
    assert "Traceback" not in served.log.read_text()


def test_the_receiver_rereads_its_web_config_file_on_sighup(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"

    def users(user: str, password: str) -> None:
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        web.write_text(yaml.safe_dump({"basic_auth_users": {user: hashed}}))

    users("old", "old-pw")
    port = free_port()
    log = tmp_path / "receiver.log"
    cmd = command("receiver", port, tmp_path, "--web.config.file", str(web))
    with running(cmd, f"http://127.0.0.1:{port}/-/healthy", log, timeout=60) as proc:
        served = Served(port, None, log)
        assert served.get("/-/state", basic("old", "old-pw"))[0] == 200
        users("new", "new-pw")
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "SIGHUP: reloaded" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        assert served.get("/-/state", basic("new", "new-pw"))[0] == 200
        assert served.get("/-/state", basic("old", "old-pw"))[0] == 401
        assert served.get("/-/state", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
