"""Every query of the migration guides runs on a real Prometheus scraping gpulens.

A ```promql block must return data. A ```promql alert block is an alert expression: it must be a
valid query and every metric it reads must be served (an alert that fires is not expected on a
healthy simulated node); only counters that appear with their first event are exempt.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.attribution.kubelet import FakeKubelet, kubelet_server
from tests.dcgm.kubelet_allocations import scenario_allocations
from tests.support.procs import PromAPI, exporter, prometheus

DOCS = Path(__file__).parents[2] / "docs"
BLOCK = re.compile(r"^```promql( alert)?\n(.*?)^```", re.MULTILINE | re.DOTALL)
METRIC = re.compile(r"\b((?:gpu|gpulens|DCGM|nvidia_gpu)_[A-Za-z0-9_]+)\b")
FIRST_EVENT_COUNTERS = {"gpu_xid_errors_total"}  # no series before a GPU's first Xid

GUIDES = {
    "migrate-dcgm-exporter.md": ["--simulate", "k8s-a100-mixed", "--compat", "dcgm", "--profiling", "dcgm"],
    "migrate-nvidia-gpu-exporter.md": ["--simulate", "dgx-h100"],
    "migrate-jobstats.md": ["--simulate", "dgx-h100", "--compat", "jobstats"],
}


def blocks(guide: str) -> list[tuple[bool, str]]:
    return [
        (bool(alert), " ".join(body.split())) for alert, body in BLOCK.findall((DOCS / guide).read_text())
    ]


@pytest.fixture(scope="module", params=sorted(GUIDES))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, PromAPI]]:
    guide: str = request.param
    tmp_path = tmp_path_factory.mktemp(guide.removesuffix(".md"))
    args = [*GUIDES[guide], "--interval", "1"]
    with kubelet_server(FakeKubelet(scenario_allocations("k8s-a100-mixed"))) as socket:
        if "k8s-a100-mixed" in args:
            args += ["--pod-resources-socket", str(socket)]
        with exporter(tmp_path, *args) as target:
            scrape = {"static_configs": [{"targets": [target], "labels": {"cluster": "della"}}]}
            with prometheus(tmp_path, [target], scrape_config=scrape) as prom:
                prom.wait_for("count_over_time(gpu_up[1m]) > 10", timeout=60)
                yield guide, prom


def test_every_guide_has_queries() -> None:
    for guide in GUIDES:
        assert len(blocks(guide)) >= 5, guide


@pytest.mark.slow
def test_every_query_of_the_guide_returns_data(served: tuple[str, PromAPI]) -> None:
    guide, prom = served
    empty = [query for alert, query in blocks(guide) if not alert and not prom.query(query)]
    assert empty == [], guide


@pytest.mark.slow
def test_every_alert_expression_is_valid_and_reads_served_metrics(served: tuple[str, PromAPI]) -> None:
    guide, prom = served
    missing = []
    for alert, query in blocks(guide):
        if not alert:
            continue
        prom.query(query)  # raises on a query Prometheus rejects
        for name in set(METRIC.findall(query)) - FIRST_EVENT_COUNTERS:
            if not prom.query(name):
                missing.append((query, name))
    assert missing == [], guide
