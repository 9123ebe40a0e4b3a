"""Readers that never read (issue 34): 60 connections per server that ask and never take the answer.

Each daemon runs as its own process, over plain HTTP and over TLS (the same web config file on
both); `slow_readers.py` (another process) keeps 60 connections that
each pipeline requests with a 4 KiB receive window and read nothing, reopening any the server
drops (from the scraper's own address for the exporter: an unread answer holds no slot, so
sharing an address with an attacker costs nothing). Meanwhile this process scrapes the exporter,
or sends Alertmanager notifications to the receiver, as the real clients do: every one must be
answered 200 within the client's deadline (Prometheus' default scrape timeout, 10 s), and the
liveness probe must keep answering. Before,
an unread answer held one of the server's request slots until its 30 s write deadline, and 60 of
them answered every scrape and probe with 503.
"""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.exporter.tls_material import make_tls_files
from tests.reliability.test_hostile_network import (
    EXPORTER_RSS_LIMIT,
    RECEIVER_RSS_LIMIT,
    TOKEN,
    peak_rss,
    receiver_command,
)
from tests.reliability.test_hostile_network import _limit_descriptors as limit_descriptors
from tests.support.procs import free_port, running

pytestmark = pytest.mark.slow

READERS = Path(__file__).with_name("slow_readers.py")
CLIENT_DEADLINE_S = 10.0  # Prometheus' default scrape_timeout
ATTACK_SECONDS = 15.0  # longer than the write deadline: dropped readers come back


def readers(
    port: int, path: str, tls_ca: Path | None = None, pipeline: int = 50, source: str = "127.0.0.1"
) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(READERS), "--port", str(port), "--connections", "60"]
    cmd += ["--pipeline", str(pipeline), "--source", source]
    cmd += ["--seconds", str(ATTACK_SECONDS), "--path", path]
    if tls_ca is not None:
        cmd += ["--tls", "--ca", str(tls_ca)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def ask(
    port: int, method: str, path: str, headers: dict[str, str], body: bytes | None = None, tls=None
) -> tuple[int, bytes]:
    """One request on a fresh connection (a probe's way); (0, reason) when it failed."""
    if tls is not None:
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            "127.0.0.1", port, timeout=CLIENT_DEADLINE_S, context=tls
        )
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_DEADLINE_S)
    try:
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read()
    except OSError as exc:
        return 0, repr(exc).encode()
    finally:
        conn.close()


def under_attack(attacker: subprocess.Popen[str], step: Callable[[], None]) -> dict[str, int]:
    """Run `step` every 0.25 s until the attacker ends; its counts."""
    time.sleep(1.0)  # let the 60 readers connect and fill their windows first
    try:
        while attacker.poll() is None:
            step()
            time.sleep(0.25)
        out, _ = attacker.communicate(timeout=30)
    finally:
        if attacker.poll() is None:
            attacker.kill()
    assert attacker.returncode == 0
    doc: dict[str, int] = json.loads(out)
    return doc


def exporter_under_slow_readers(tmp_path: Path, tls: bool) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "gpulens.exporter.cli", "--simulate", "dgx-h100"]
    cmd += ["--web.listen-address", f"127.0.0.1:{port}"]
    context = None
    ca = None
    scheme = "http"
    if tls:
        (tmp_path / "tls").mkdir()
        files = make_tls_files(tmp_path / "tls")
        web = tmp_path / "web.yml"
        web.write_text(
            json.dumps(
                {
                    "tls_server_config": {
                        "cert_file": str(files.server_cert),
                        "key_file": str(files.server_key),
                    }
                }
            )
        )
        cmd += ["--web.config.file", str(web)]
        ca = files.ca_cert
        context = ssl.create_default_context(cafile=str(ca))
        context.check_hostname = False
        scheme = "https"
    ready = f"{scheme}://127.0.0.1:{port}/-/ready"
    scrapes: list[tuple[int, bytes]] = []
    probes: list[tuple[int, bytes]] = []

    def step() -> None:
        scrapes.append(ask(port, "GET", "/metrics", {"Accept-Encoding": "gzip"}, tls=context))
        probes.append(ask(port, "GET", "/-/healthy", {}, tls=context))

    log = tmp_path / "exporter.log"
    with running(cmd, ready, log, 60, {"TMPDIR": str(tmp_path)}, limit_descriptors, context) as proc:
        counts = under_attack(readers(port, "/metrics", ca), step)
        peak = peak_rss(proc.pid)
        assert proc.poll() is None
    failed = [s for s in scrapes if s[0] != 200]
    assert not failed, f"{len(failed)} of {len(scrapes)} scrapes failed: {failed[:3]}"
    assert all(p == (200, b"OK\n") for p in probes), [p for p in probes if p[0] != 200][:3]
    assert len(scrapes) >= 20
    assert counts["opened"] >= 60, counts
    assert counts["dropped_by_server"] >= 60, counts  # the write deadline let go of every reader
    assert peak < EXPORTER_RSS_LIMIT, f"peak RSS {peak / 2**20:.0f} MiB"
    assert "Traceback" not in (tmp_path / "exporter.log").read_text()


def test_sixty_readers_that_never_read_leave_every_scrape_and_probe_answered(tmp_path: Path) -> None:
    exporter_under_slow_readers(tmp_path, tls=False)


def test_sixty_tls_readers_that_never_read_leave_every_scrape_and_probe_answered(tmp_path: Path) -> None:
    exporter_under_slow_readers(tmp_path, tls=True)


def receiver_under_slow_readers(tmp_path: Path, tls: bool) -> None:
    port = free_port()
    cmd = receiver_command(tmp_path, port)
    context = None
    ca = None
    scheme = "http"
    if tls:
        (tmp_path / "tls").mkdir()
        files = make_tls_files(tmp_path / "tls")
        web = tmp_path / "web.yml"
        web.write_text(
            json.dumps(
                {
                    "tls_server_config": {
                        "cert_file": str(files.server_cert),
                        "key_file": str(files.server_key),
                    }
                }
            )
        )
        cmd += ["--web.config.file", str(web)]
        ca = files.ca_cert
        context = ssl.create_default_context(cafile=str(ca))
        scheme = "https"
    watchdog = {"status": "firing", "labels": {"alertname": "Watchdog"}, "fingerprint": "f"}
    notification = json.dumps({"version": "4", "status": "firing", "alerts": [watchdog]}).encode()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    posts: list[tuple[int, bytes]] = []
    probes: list[tuple[int, bytes]] = []
    peeks: list[int] = []

    def step() -> None:
        posts.append(ask(port, "POST", "/alerts", headers, notification, tls=context))
        probes.append(ask(port, "GET", "/-/healthy", {}, tls=context))
        peeks.append(ask(port, "GET", "/-/state", {}, tls=context)[0])  # what each attacker's request gets

    ready = f"{scheme}://127.0.0.1:{port}/-/healthy"
    log = tmp_path / "receiver.log"
    with running(cmd, ready, log, 60, {}, limit_descriptors, context) as proc:
        # the attackers hold no token: /-/state answers them a small 401 (it is behind the same
        # credentials as /alerts), enough of them pipelined to fill the socket buffers; from
        # another address than Alertmanager's, as on a real network (one address gets at most
        # --max-requests-per-client of the slots where a handler waits on the worker pool)
        counts = under_attack(readers(port, "/-/state", ca, pipeline=2000, source="127.0.0.2"), step)
        peak = peak_rss(proc.pid)
        assert proc.poll() is None
        state = ask(port, "GET", "/-/state", {"Authorization": f"Bearer {TOKEN}"}, tls=context)
    assert state[0] == 200 and b'"queue"' in state[1], state
    assert peeks and set(peeks) == {401}, peeks[:5]
    failed = [p for p in posts if p[0] != 200]
    assert not failed, f"{len(failed)} of {len(posts)} notifications failed: {failed[:3]}"
    assert all(p == (200, b"OK\n") for p in probes), [p for p in probes if p[0] != 200][:3]
    assert len(posts) >= 20
    assert counts["opened"] >= 60, counts
    assert peak < RECEIVER_RSS_LIMIT, f"peak RSS {peak / 2**20:.0f} MiB"
    assert "Traceback" not in log.read_text()


def test_sixty_readers_of_the_receivers_state_leave_every_notification_accepted(tmp_path: Path) -> None:
    receiver_under_slow_readers(tmp_path, tls=False)


def test_sixty_tls_readers_of_the_receivers_state_leave_every_notification_accepted(tmp_path: Path) -> None:
    receiver_under_slow_readers(tmp_path, tls=True)
