"""The live stack the dashboard tests query and draw: the scenario nodes' exporters, scraped by one
Prometheus per version (Debian's 2.x and Prometheus 3) with the shipped rules loaded, and the real
analyzer's recommendations served as node_exporter's textfile collector would serve them.

Started once for tests/dashboards (conftest.py's `live_stacks`): test_queries_e2e.py asks every
query of both Prometheus versions, test_render.py draws every dashboard against Debian's.
"""

from __future__ import annotations

import contextlib
import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.dashboards.model import REPO
from tests.support.procs import PROMETHEUS_ENGINES, PromAPI, exporter, prometheus, use_prometheus

RULE_FILES = [REPO / "alerts" / "recording_rules.yml", REPO / "alerts" / "gpu_alerts.yml"]
CLUSTER = "e2e"
HEALTHY = "dgx-h100"  # 8x H100: MIG, MPS, exclusive and idle GPUs
SCENARIOS = {
    HEALTHY: "every panel must show data here unless listed below",
    "faults": "lost GPU, Xids, ECC, row remaps, throttling (sim/scenarios/faults.yaml)",
    "k8s-a100-mixed": "the built-in scenario with a time-sliced GPU",
}


class TextfileServer:
    """node_exporter's textfile collector in miniature: serves one *.prom file as /metrics.

    The analyzer writes its recommendations with `gpulens recommend --textfile FILE`; in production
    node_exporter exposes that file. Before the file exists this serves an empty exposition.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        textfile = path

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = textfile.read_bytes() if textfile.exists() else b""
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def publish_recommendations(prom: PromAPI, textfile: Path) -> None:
    """Run the real analyzer against this Prometheus, as the weekly job would (short window)."""
    cmd = [sys.executable, "-m", "gpulens.cli", "recommend", "--prometheus", prom.base_url,
           "--window", "20s", "--step", "2s", "--format", "json", "--textfile", str(textfile)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        pytest.fail(f"gpulens recommend failed ({result.returncode}): {result.stderr[-2000:]}")
    prom.wait_for("count(gpulens_recommendation_info)", timeout=30)


@dataclass
class Stack:
    prom: PromAPI
    nodes: dict[str, str]  # scenario -> instance label of its exporter
    started: float
    errors: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> str:
        return self.nodes[HEALTHY]

    def range_s(self) -> int:
        return max(30, int(time.time() - self.started))


@contextlib.contextmanager
def started_stacks(base: Path) -> Iterator[dict[str, Stack | BaseException]]:
    """The scenario nodes scraped by one Prometheus per version, both started at once so that they
    gather their samples in the same seconds (one after the other, that wait came twice); each has
    its own textfile target and its own analyzer run. An engine that cannot start (Prometheus 3
    not built) is kept as its skip or failure, for that engine's tests only."""
    with contextlib.ExitStack() as stack_:
        nodes = {}
        for scenario in SCENARIOS:
            (base / scenario).mkdir()
            nodes[scenario] = stack_.enter_context(
                exporter(base / scenario, "--simulate", scenario, "--interval", "1")
            )
        # a cluster label on every target, as a global view (Thanos, Mimir) or external labels give
        cluster = {"relabel_configs": [{"target_label": "cluster", "replacement": CLUSTER}]}
        stacks: dict[str, Stack | BaseException] = {}
        for engine in PROMETHEUS_ENGINES:
            home = base / engine
            home.mkdir()
            textfile = stack_.enter_context(TextfileServer(home / "recommendations.prom"))
            try:
                with pytest.MonkeyPatch.context() as monkeypatch:
                    use_prometheus(engine, monkeypatch)
                    targets = [*nodes.values(), textfile]
                    prom = stack_.enter_context(
                        prometheus(home, targets, rule_files=RULE_FILES, scrape_config=cluster)
                    )
            except (pytest.skip.Exception, pytest.fail.Exception) as exc:
                stacks[engine] = exc
                continue
            stacks[engine] = Stack(prom, nodes, time.time())
        healthy, faulty = nodes[HEALTHY], nodes["faults"]
        for engine, found in stacks.items():
            if isinstance(found, BaseException):
                continue
            for expr in (
                f'count(instance_gpu_job:gpu_job_memory_used:ratio{{instance="{healthy}"}})',
                f'count(gpu_mig_sm_active_ratio{{instance="{healthy}"}})',
                f'count(gpu_xid_errors_total{{instance="{faulty}"}})',
                'count(ALERTS{alertstate="firing", severity="critical"})',
            ):
                found.prom.wait_for(expr, timeout=120)
            # rates over $__rate_interval need a few samples of every counter
            time.sleep(max(0.0, 20 - (time.time() - found.started)))
            publish_recommendations(found.prom, base / engine / "recommendations.prom")
        yield stacks


def engine_stack(stacks: dict[str, Stack | BaseException], engine: str) -> Stack:
    """`engine`'s stack, or the skip or failure it got when it could not start."""
    found = stacks[engine]
    if isinstance(found, BaseException):
        raise found
    return found
