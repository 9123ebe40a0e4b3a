"""A real exporter for the reliability suite: engine node + `Exporter` + `HttpServer` on loopback.

Tests drive faults through the node's runtime injection (`set_lost`, `set_hang`, ...) while
scraping over real HTTP, and read what the exporter logged through a capturing handler on the
`gpulens` logger, so "one clear line per fault" is checked on the records a deployment would see.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulens.exporter.app import Exporter
from gpulens.exporter.config import ExporterConfig
from gpulens.exporter.server import HttpServer
from gpulens.sim.clock import RealClock
from gpulens.sim.engine import ScenarioNode, build_node
from gpulens.sim.install import install, uninstall
from gpulens.sim.mpscontrol import client_argv
from gpulens.sim.scenario import Scenario
from gpulens.sim.scenariofile import BUILTIN_DIR, load_scenario
from tests.reliability.expo import value

SCRAPE_TIMEOUT_S = 5.0


def scenario_file(tmp_path: Path, base: str = "dgx-h100", timeline: str = "", name: str = "") -> Path:
    """A copy of a built-in scenario with a fault timeline appended (entries are YAML flow maps)."""
    text = (BUILTIN_DIR / f"{base}.yaml").read_text()
    if timeline:
        text += "\nfaults:\n  timeline:\n" + "".join(f"    - {line}\n" for line in timeline.splitlines())
    path = tmp_path / (name or f"{base}-faults.yaml")
    path.write_text(text)
    return path


class LogCapture(logging.Handler):
    """Keeps every record of the `gpulens` loggers (thread-safe) for assertions."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock_records = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_records:
            self.records.append(record)

    def lines(self, min_level: int = logging.INFO, since: int = 0) -> list[str]:
        with self._lock_records:
            chosen = self.records[since:]
        return [f"{r.levelname} {r.getMessage()}" for r in chosen if r.levelno >= min_level]

    def matching(self, *needles: str, min_level: int = logging.INFO, since: int = 0) -> list[str]:
        """Lines at `min_level` or above that contain every needle (case-insensitive)."""
        return [
            line
            for line in self.lines(min_level, since)
            if all(needle.lower() in line.lower() for needle in needles)
        ]

    def mark(self) -> int:
        with self._lock_records:
            return len(self.records)


@contextlib.contextmanager
def captured_logs(level: int = logging.DEBUG) -> Iterator[LogCapture]:
    root = logging.getLogger("gpulens")
    handler = LogCapture()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


@dataclass(frozen=True)
class Scrape:
    status: int
    seconds: float
    body: bytes


@dataclass
class LiveExporter:
    node: ScenarioNode
    exporter: Exporter
    server: HttpServer
    logs: LogCapture
    scrapes: list[Scrape] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def scrape(self, path: str = "/metrics") -> Scrape:
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(self.url + path, timeout=SCRAPE_TIMEOUT_S) as response:
                body, status = response.read(), response.status
        except urllib.error.HTTPError as exc:
            body, status = exc.read(), exc.code
        result = Scrape(status, time.perf_counter() - started, body)
        if path == "/metrics":
            self.scrapes.append(result)
        return result

    def value(self, name: str, **labels: str) -> float | None:
        return value(self.scrape().body, name, **labels)

    def wait_for(self, predicate: Callable[[bytes], bool], timeout: float = 15.0, what: str = "") -> bytes:
        """Scrape every 50 ms until `predicate(body)` holds; every scrape is recorded."""
        deadline = time.monotonic() + timeout
        body = b""
        while time.monotonic() < deadline:
            body = self.scrape().body
            if predicate(body):
                return body
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")

    def wait_value(self, name: str, expected: float | None, timeout: float = 15.0, **labels: str) -> bytes:
        return self.wait_for(
            lambda body: value(body, name, **labels) == expected,
            timeout,
            f"{name}{labels} == {expected}",
        )

    def assert_scrapes_healthy(self) -> None:
        """Every /metrics scrape so far answered 200 with a body (how fast is `make bench`'s figure,
        not an assert: a loaded CI machine says nothing about it)."""
        assert self.scrapes, "no scrapes recorded"
        bad = [s.status for s in self.scrapes if s.status != 200 or not s.body]
        assert not bad, f"{len(bad)} of {len(self.scrapes)} scrapes failed: {bad[:5]}"


@contextlib.contextmanager
def live_exporter(
    tmp_path: Path,
    scenario: str | Path | Scenario = "dgx-h100",
    *,
    interval: float = 0.4,
    nvml_timeout: float = 0.3,
    before_start: Callable[[ScenarioNode], Any] | None = None,
    **config: Any,
) -> Iterator[LiveExporter]:
    """Node (real clock, fake procfs) + exporter sampling in the background + HTTP on 127.0.0.1."""
    loaded = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    roots = {name: tmp_path / name for name in ("proc", "pods", "job-mapping")}
    for path in roots.values():
        path.mkdir(exist_ok=True)
    node = build_node(
        loaded,
        clock=RealClock(),
        procfs_root=roots["proc"],
        pods_root=roots["pods"],
        job_mapping_dir=roots["job-mapping"],
    )
    settings: dict[str, Any] = {
        "interval": interval,
        "nvml_timeout": nvml_timeout,
        "pod_resources_socket": None,
        "pod_logs_dir": roots["pods"],
        "job_mapping_dir": roots["job-mapping"],
        # the node's MPS control daemons answer through the simulator's stand-in client, as under
        # `--simulate` (sim/node.py): the real program is not installed here
        "mps_control": client_argv(),
    }
    settings.update(config)
    with captured_logs() as logs:
        install(node)
        if before_start is not None:
            before_start(node)
        exporter = Exporter(
            ExporterConfig(**settings), node=node, logger=logging.getLogger("gpulens.exporter")
        )
        server = HttpServer(exporter, "127.0.0.1", 0)
        exporter.start()
        server.start()
        live = LiveExporter(node=node, exporter=exporter, server=server, logs=logs)
        try:
            deadline = time.monotonic() + 15
            while live.scrape("/-/ready").status != 200:  # the first sample is published
                assert time.monotonic() < deadline, "no first sample within 15 s"
                time.sleep(0.05)
            yield live
        finally:
            server.stop()
            exporter.close()
            uninstall()
            node.close()
