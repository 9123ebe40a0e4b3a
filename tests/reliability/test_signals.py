"""Signals and exit paths of the real daemons (issue 17 item 9): SIGHUP reloads the exporter's web
config as Prometheus' exporters do, a bad reload keeps the running configuration, the receiver logs
SIGHUP and carries on, and the simulator's temporary directory is gone after every way out."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from tests.support.procs import free_port, wait_http

pytestmark = pytest.mark.slow


def users(**passwords: str) -> str:
    lines = "".join(
        f"  {user}: '{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=4)).decode()}'\n"
        for user, pw in passwords.items()
    )
    return "basic_auth_users:\n" + lines


def status(url: str, user: str, password: str) -> int:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            status: int = answer.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:  # not listening yet
        return 0


@contextlib.contextmanager
def exporter(tmp_path: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    port = free_port()
    log_path = tmp_path / "exporter.log"
    cmd = [sys.executable, "-m", "gpulens.exporter.cli", "--simulate", "dgx-h100"]
    cmd += ["--web.listen-address", f"127.0.0.1:{port}", *extra]
    with log_path.open("wb") as log:
        proc = subprocess.Popen[bytes](
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp_path)}
        )
        try:
            yield proc, f"http://127.0.0.1:{port}", log_path
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def wait_line(log: Path, needle: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if needle in line:
                return line
        time.sleep(0.1)
    raise AssertionError(f"no log line with {needle!r}: {log.read_text()[-2000:]}")


def sim_dirs(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("gpulens-sim-*"))


def test_sighup_reloads_the_web_config(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text(users(alice="first"))
    with exporter(tmp_path, "--web.config.file", str(config)) as (proc, url, log):
        deadline = time.monotonic() + 30
        while status(f"{url}/-/healthy", "alice", "first") != 200:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        config.write_text(users(alice="second", bob="third"))
        proc.send_signal(signal.SIGHUP)
        wait_line(log, "reloaded")
        assert proc.poll() is None
        assert status(f"{url}/metrics", "alice", "second") == 200
        assert status(f"{url}/metrics", "bob", "third") == 200
        assert status(f"{url}/metrics", "alice", "first") == 401


def test_a_broken_config_on_sighup_is_one_error_line_and_the_old_one_stays(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text(users(alice="first"))
    with exporter(tmp_path, "--web.config.file", str(config)) as (proc, url, log):
        deadline = time.monotonic() + 30
        while status(f"{url}/-/healthy", "alice", "first") != 200:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        config.write_text("basic_auth_users:\n  alice: not-a-hash\n")
        proc.send_signal(signal.SIGHUP)
        line = wait_line(log, "keeping the previous")
        assert "basic_auth_users.alice" in line and "not-a-hash" not in line
        assert status(f"{url}/metrics", "alice", "first") == 200
    assert "Traceback" not in log.read_text()


def test_sighup_without_a_web_config_is_logged_and_ignored(tmp_path: Path) -> None:
    with exporter(tmp_path) as (proc, url, log):
        wait_http(f"{url}/-/ready", timeout=30, proc=proc)
        proc.send_signal(signal.SIGHUP)
        wait_line(log, "SIGHUP")
        time.sleep(0.3)
        assert proc.poll() is None
        with urllib.request.urlopen(f"{url}/-/healthy", timeout=5) as answer:
            assert answer.status == 200


def test_the_simulator_directory_is_removed_after_a_sighup_and_a_sigterm(tmp_path: Path) -> None:
    with exporter(tmp_path) as (proc, url, _):
        wait_http(f"{url}/-/ready", timeout=30, proc=proc)
        assert len(sim_dirs(tmp_path)) == 1
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    assert sim_dirs(tmp_path) == []


def test_the_receiver_logs_sighup_and_keeps_serving(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sighup-token")
    port = free_port()
    cmd = [sys.executable, "-m", "gpulens.cli", "remediate", "--web.listen-address", f"127.0.0.1:{port}"]
    cmd += ["--backend", "slurm", "--token-file", str(tmp_path / "token")]
    log_path = tmp_path / "receiver.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen[bytes](cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_http(f"http://127.0.0.1:{port}/-/healthy", timeout=30, proc=proc)
            proc.send_signal(signal.SIGHUP)
            wait_line(log_path, "SIGHUP")
            time.sleep(0.3)
            assert proc.poll() is None
            wait_http(f"http://127.0.0.1:{port}/-/healthy", timeout=5, proc=proc)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
