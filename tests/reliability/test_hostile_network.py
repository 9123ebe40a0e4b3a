"""Hostile network (issue 17): thousands of idle and slowloris connections against the real daemons.

The exporter runs as its own process (`python -m gpulens.exporter.cli --simulate dgx-h100`) with
the systemd unit's default soft limit of 1,024 descriptors (RLIMIT_NOFILE set before exec). A
second process (`hostile_clients.py`) opens 5,000 connections at 1,000 a second, half of them
silent and half trickling a request head one byte at a time, and holds them. Meanwhile this
process scrapes `/metrics` every 50 ms over one kept-alive connection, as Prometheus does: every
scrape must answer 200 with the metrics on that one connection while the attack holds its
connections, and the exporter's peak RSS must stay under its DaemonSet limit of 256 MiB. The
remediation receiver gets the same with 2,000 connections and its 128 MiB limit. (The issue's
100 ms per scrape is a figure for `make bench`, not an assert: a loaded CI machine says nothing
about it.)
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import free_port, running

pytestmark = pytest.mark.slow

HOSTILE = Path(__file__).with_name("hostile_clients.py")
NOFILE = 1024
EXPORTER_RSS_LIMIT = 256 << 20  # deploy/kubernetes/exporter-daemonset.yaml
RECEIVER_RSS_LIMIT = 128 << 20  # deploy/kubernetes/remediate/deployment.yaml
TOKEN = "hostile-network-token"


@dataclass(frozen=True)
class Scrape:
    status: int
    seconds: float
    ok: bool
    reconnected: bool


def _limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@contextlib.contextmanager
def daemon(
    cmd: list[str], ready: str, log_path: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    """`cmd` under a 1,024-descriptor limit until the context exits; waits for `ready` to answer."""
    with running(cmd, ready, log_path, timeout=60, env=env, preexec_fn=_limit_descriptors) as proc:
        yield proc


def peak_rss(pid: int) -> int:
    """VmHWM: the highest resident set size the process has had, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def attack(port: int, connections: int, rate: float, hold: float, path: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(HOSTILE), "--port", str(port), "--connections", str(connections)]
    cmd += ["--rate", str(rate), "--hold", str(hold), "--path", path]
    return subprocess.Popen[bytes](cmd, stdout=subprocess.PIPE, text=True)


class KeptAliveClient:
    """One persistent connection, like Prometheus' scrape loop; a request on a connection the
    server closed while idle is retried once on a new one (Go's transport does the same), and the
    measured time covers both attempts."""

    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self.port = port
        self.headers = headers
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[Scrape, bytes]:
        started = time.perf_counter()
        reconnected = False
        for attempt in (1, 2):
            fresh = self.conn is None
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            try:
                self.conn.request(method, path, body=body, headers=self.headers)
                answer = self.conn.getresponse()
                data = answer.read()
                return Scrape(answer.status, time.perf_counter() - started, True, reconnected), data
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                self.conn = None
                if fresh or attempt == 2:
                    break
                reconnected = True
            except OSError:
                self.conn.close()
                self.conn = None
                break
        return Scrape(0, time.perf_counter() - started, False, reconnected), b""

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def receiver_command(tmp_path: Path, port: int) -> list[str]:
    """`gpulens remediate` on 127.0.0.1:`port` with the test token, over an scontrol that does nothing."""
    (tmp_path / "token").write_text(TOKEN)
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\nexit 0\n")
    scontrol.chmod(0o755)
    cmd = [sys.executable, "-m", "gpulens.cli", "remediate", "--web.listen-address", f"127.0.0.1:{port}"]
    return [*cmd, "--backend", "slurm", "--scontrol", str(scontrol), "--token-file", str(tmp_path / "token")]


def run_attack(
    pid: int,
    port: int,
    client: KeptAliveClient,
    probe: tuple[str, str, bytes | None],
    connections: int,
    every: float,
) -> tuple[list[Scrape], list[bytes], dict[str, int], list[int]]:
    method, path, body = probe
    attacker = attack(port, connections, rate=500.0, hold=5.0, path=path)
    scrapes: list[Scrape] = []
    bodies: list[bytes] = []
    descriptors: list[int] = []
    try:
        while attacker.poll() is None:
            scrape, data = client.request(method, path, body)
            scrapes.append(scrape)
            bodies.append(data)
            descriptors.append(open_descriptors(pid))
            time.sleep(every)
        out, _ = attacker.communicate(timeout=10)
    finally:
        if attacker.poll() is None:
            attacker.kill()
        client.close()
    assert attacker.returncode == 0
    return scrapes, bodies, json.loads(out), descriptors


def test_5000_idle_and_slowloris_connections_under_1024_descriptors_leave_every_scrape_answered(
    tmp_path: Path, bad_input
) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "gpulens.exporter.cli", "--simulate", "dgx-h100"]
    cmd += ["--web.listen-address", f"127.0.0.1:{port}"]
    ready = f"http://127.0.0.1:{port}/-/ready"
    with daemon(cmd, ready, tmp_path / "exporter.log", {"TMPDIR": str(tmp_path)}) as proc:
        client = KeptAliveClient(port, {"Accept-Encoding": "gzip"})
        scrapes, bodies, counts, descriptors = run_attack(
            proc.pid, port, client, ("GET", "/metrics", None), 5000, every=0.05
        )
        peak = peak_rss(proc.pid)
        after = KeptAliveClient(port, {}).request("GET", "/metrics")
        assert proc.poll() is None
    bad_input("hostile connections (idle)", counts["idle"])
    bad_input("hostile connections (slowloris)", counts["slow"])

    assert counts["opened"] == 5000 and counts["idle"] == 2500 and counts["slow"] == 2500, counts
    failed = [s for s, b in zip(scrapes, bodies, strict=True) if s.status != 200 or not b]
    assert not failed, f"{len(failed)} of {len(scrapes)} scrapes failed: {failed[:3]}"
    assert len(scrapes) >= 100, "the attack was too short to measure"
    assert not any(s.reconnected for s in scrapes), "the scraper's kept-alive connection was closed"
    assert peak < EXPORTER_RSS_LIMIT, f"peak RSS {peak / 2**20:.0f} MiB"
    assert max(descriptors) < NOFILE
    # what the exporter could not hold it closed: the attacker kept at most a fraction
    assert counts["closed_by_server"] + counts["answered_by_server"] >= 5000 - NOFILE // 2, counts
    assert after[0].status == 200 and b"gpu_up" in after[1]
    log = (tmp_path / "exporter.log").read_text()
    assert "Traceback" not in log


def test_2000_idle_and_slowloris_connections_under_1024_descriptors_leave_the_receiver_answering(
    tmp_path: Path, bad_input
) -> None:
    port = free_port()
    cmd = receiver_command(tmp_path, port)
    ready = f"http://127.0.0.1:{port}/-/healthy"
    watchdog = {"status": "firing", "labels": {"alertname": "Watchdog"}, "fingerprint": "f"}
    notification = json.dumps({"version": "4", "status": "firing", "alerts": [watchdog]}).encode()
    with daemon(cmd, ready, tmp_path / "receiver.log", {}) as proc:
        client = KeptAliveClient(
            port, {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        )
        posts, bodies, counts, descriptors = run_attack(
            proc.pid, port, client, ("POST", "/alerts", notification), 2000, every=0.1
        )
        peak = peak_rss(proc.pid)
        assert proc.poll() is None
    bad_input("hostile connections (idle, receiver)", counts["idle"])
    bad_input("hostile connections (slowloris, receiver)", counts["slow"])

    assert counts["opened"] == 2000, counts
    failed = [s for s in posts if s.status != 200]
    assert not failed, f"{len(failed)} of {len(posts)} notifications failed: {failed[:3]}"
    assert all(json.loads(b)["queued"] == 1 for b in bodies)  # acknowledged once queued
    assert len(posts) >= 50
    assert peak < RECEIVER_RSS_LIMIT, f"peak RSS {peak / 2**20:.0f} MiB"
    assert max(descriptors) < NOFILE
    assert counts["closed_by_server"] + counts["answered_by_server"] >= 2000 - 256, counts
    assert "Traceback" not in (tmp_path / "receiver.log").read_text()
