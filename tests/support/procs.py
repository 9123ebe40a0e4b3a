"""Start real Prometheus, Alertmanager and exporter processes on 127.0.0.1 for integration tests.

Everything listens on loopback only, on ports picked free by the OS, with data under a pytest
tmp dir; every process is stopped when its context manager exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_binary(*names: str) -> str:
    """Path of the first binary found, or skip (locally) / fail (in CI) the test."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    unavailable(f"none of {names} is installed (apt-get install prometheus prometheus-alertmanager)")


def unavailable(message: str, in_ci: str | None = None) -> NoReturn:
    """A tool a test needs is missing: skip locally, fail in CI (where `make test` provides every
    tool, so a missing one is a broken setup, never a reason to test less); `in_ci` replaces the
    message there."""
    if os.environ.get("CI"):
        pytest.fail(in_ci or message)
    pytest.skip(message)


# The Prometheus versions the PromQL-facing tests run on: Debian's (2.x, on PATH) and Prometheus 3,
# whose ranges are left-open and whose extrapolation therefore differs at every window's edge,
# built by `make prometheus3` into the directory GPULENS_PROMETHEUS3 names (prometheus, promtool).
PROMETHEUS_ENGINES = ("prometheus-2", "prometheus-3")


def use_prometheus(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `engine`'s prometheus and promtool the first on PATH for this test (skip locally, fail
    in CI when Prometheus 3 is not built)."""
    if engine == "prometheus-2":
        return
    built = os.environ.get("GPULENS_PROMETHEUS3", "")
    if not (built and all(os.access(Path(built) / b, os.X_OK) for b in ("prometheus", "promtool"))):
        unavailable("Prometheus 3 is not built (make prometheus3; GPULENS_PROMETHEUS3 names its directory)")
    monkeypatch.setenv("PATH", f"{built}{os.pathsep}{os.environ.get('PATH', '')}")


def backfill_openmetrics(openmetrics: Path, db: Path, promtool: str | None = None) -> Path:
    """`promtool tsdb create-blocks-from openmetrics`: a history's `metrics.om` as TSDB blocks under
    `db`, for a Prometheus started with `storage=db`; returns `db`."""
    command = [promtool or find_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics"]
    subprocess.run([*command, str(openmetrics), str(db)], check=True, capture_output=True, timeout=120)
    return db


def wait_http(
    url: str,
    timeout: float = 30.0,
    proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
    context: ssl.SSLContext | None = None,
) -> None:
    """Wait until `url` answers 200 (over HTTPS trusting `context`), failing early if `proc` died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready")
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s: {last}")


@contextlib.contextmanager
def running(
    cmd: Sequence[str],
    ready_url: str,
    log_path: Path,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    context: ssl.SSLContext | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `cmd` until the context exits; the log goes to `log_path` and is shown on failure.

    `preexec_fn` runs in the child before exec (e.g. lowering RLIMIT_NOFILE for a daemon that must
    hold under the systemd unit's limits)."""
    log = log_path.open("wb")
    proc = subprocess.Popen[bytes](
        list(cmd),
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        preexec_fn=preexec_fn,
    )
    try:
        try:
            wait_http(ready_url, timeout=timeout, proc=proc, context=context)
        except Exception:
            log.flush()
            sys.stderr.write(log_path.read_text(errors="replace")[-4000:])
            raise
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@dataclass
class PromAPI:
    """A tiny client for the Prometheus HTTP API used by tests."""

    base_url: str

    def get(self, path: str, **params: str) -> dict[str, Any]:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        doc: dict[str, Any] = body["data"]
        return doc

    def query(self, expr: str, time_s: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if time_s is not None:
            params["time"] = str(time_s)
        items: list[dict[str, Any]] = self.get("/api/v1/query", **params)["result"]
        return items

    def wait_for(self, expr: str, timeout: float = 60.0, predicate=bool) -> list[dict[str, Any]]:
        """Poll an instant query until `predicate(result)` holds."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if predicate(result):
                return result
            time.sleep(0.5)
        raise TimeoutError(f"{expr!r} did not satisfy the predicate in {timeout}s; last: {result}")


@contextlib.contextmanager
def prometheus(
    tmp_path: Path,
    scrape_targets: Sequence[str],
    rule_files: Sequence[Path] = (),
    alertmanager_url: str | None = None,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    storage: Path | None = None,
    extra_args: Sequence[str] = (),
    scrape_config: dict[str, Any] | None = None,
) -> Iterator[PromAPI]:
    """A real Prometheus scraping `scrape_targets` (host:port) as job "gpulens".

    `scrape_config` entries (for example `relabel_configs`) are added to that job's config.
    """
    binary = find_binary("prometheus")
    port = free_port()
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "scrape_configs": [
            {
                "job_name": "gpulens",
                "static_configs": [{"targets": list(scrape_targets)}],
                **(scrape_config or {}),
            }
        ],
        "rule_files": [str(p) for p in rule_files],
    }
    if alertmanager_url:
        config["alerting"] = {
            "alertmanagers": [
                {"static_configs": [{"targets": [urllib.parse.urlparse(alertmanager_url).netloc]}]}
            ]
        }
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(json.dumps(config))
    data = storage or tmp_path / "prom-data"
    cmd = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=3650d",
        *extra_args,
    ]
    base = f"http://127.0.0.1:{port}"
    with running(cmd, f"{base}/-/ready", tmp_path / "prometheus.log", timeout=60):
        yield PromAPI(base)


@contextlib.contextmanager
def alertmanager(tmp_path: Path, config_path: Path) -> Iterator[str]:
    """A real Alertmanager with `config_path`; yields its base URL."""
    binary = find_binary("prometheus-alertmanager", "alertmanager")
    port = free_port()
    cluster_port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [
        binary,
        f"--config.file={config_path}",
        f"--storage.path={tmp_path / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--cluster.listen-address=127.0.0.1:{cluster_port}",
        f"--web.external-url={base}",
    ]
    with running(cmd, f"{base}/-/ready", tmp_path / "alertmanager.log", timeout=60):
        yield base


@contextlib.contextmanager
def exporter(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`gpulens-exporter` (this checkout) on a free loopback port; yields host:port."""
    port = free_port()
    cmd = [sys.executable, "-m", "gpulens.exporter.cli", "--web.listen-address", f"127.0.0.1:{port}", *args]
    with running(cmd, f"http://127.0.0.1:{port}/-/healthy", tmp_path / "exporter.log", timeout=60, env=env):
        yield f"127.0.0.1:{port}"
