"""The real daemon (`python -m gpulens.exporter.cli --simulate ...`) under faults, and with Prometheus.

Scenario files here are the built-in `dgx-h100` plus a fault timeline, so the tests do not depend
on the exact contents of other built-in scenarios.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from gpulens.sim.scenariofile import BUILTIN_DIR
from tests.exporter.expo import samples, value
from tests.support.procs import exporter, prometheus


def scenario_with_faults(tmp_path: Path, timeline: str) -> Path:
    base = (BUILTIN_DIR / "dgx-h100.yaml").read_text()
    path = tmp_path / "dgx-h100-faults.yaml"
    path.write_text(base + "\nfaults:\n  timeline:\n" + timeline)
    return path


def scrape(target: str) -> tuple[int, float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as response:
        body = response.read()
        status = response.status
    return status, time.perf_counter() - started, body


def test_scrapes_are_answered_while_a_gpu_is_lost_and_another_hangs(tmp_path: Path) -> None:
    # a scrape never calls NVML: with the 60 s hang, one that waited on it would time out (5 s)
    scenario = scenario_with_faults(
        tmp_path,
        "    - {at: 0s, lost: forever, gpu: 4}\n    - {at: 0s, hang: 60s, gpu: 5}\n",
    )
    args = ("--simulate", str(scenario), "--interval", "1", "--nvml.timeout", "0.3", "--no-collector.jobs")
    with exporter(tmp_path, *args) as target:
        deadline = time.monotonic() + 20
        body = b""
        while time.monotonic() < deadline:
            body = scrape(target)[2]
            if samples(body, "gpu_up") and value(body, "gpu_up", gpu="5") == 0:
                break
            time.sleep(0.2)
        results = [scrape(target) for _ in range(15)]
    assert all(status == 200 for status, _, _ in results)
    body = results[-1][2]
    assert value(body, "gpu_up", gpu="4") == 0  # lost
    assert value(body, "gpu_up", gpu="5") == 0  # hung call
    assert value(body, "gpu_up", gpu="3") == 1
    assert value(body, "gpu_power_watts", gpu="3") is not None
    assert value(body, "gpulens_collector_success", collector="power_thermal") == 0
    assert value(body, "gpulens_nvml_up") == 1


@pytest.mark.slow
def test_prometheus_scraping_the_simulated_dgx_h100(tmp_path: Path) -> None:
    scenario = scenario_with_faults(
        tmp_path,
        "    - {at: 12s, xid: 79, gpu: 3}\n    - {at: 12s, xid: 94, gpu: 0, instance: 2}\n",
    )
    started = time.monotonic()
    with (
        exporter(tmp_path, "--simulate", str(scenario), "--interval", "1") as target,
        prometheus(tmp_path, [target]) as prom,
    ):
        up = prom.wait_for("gpu_up", predicate=lambda r: len(r) == 8)
        assert {s["metric"]["gpu"]: s["value"][1] for s in up} == {str(i): "1" for i in range(8)}
        if time.monotonic() - started < 10:
            assert prom.query("gpu_xid_errors_total") == []  # nothing before the injected Xid

        # MIG: instance used + instance reserved adds up to the parent's used memory (docs/metrics.md)
        check = (
            "sum by (gpu, uuid) (gpu_mig_memory_used_bytes + gpu_mig_memory_reserved_bytes)"
            " - on (gpu, uuid) gpu_memory_used_bytes"
        )
        diffs = prom.wait_for(check, predicate=lambda r: len(r) == 2)
        assert all(abs(float(s["value"][1])) < 1 for s in diffs), diffs

        mps = prom.query("gpu_mps_clients > 0")
        assert [(s["metric"]["gpu"], s["value"][1]) for s in mps] == [("2", "3")]
        assert prom.query("gpu_mps_server_active == 1")[0]["metric"]["gpu"] == "2"

        xid = prom.wait_for('gpu_xid_errors_total{xid="79"}', timeout=60)
        assert [(s["metric"]["gpu"], s["value"][1]) for s in xid] == [("3", "1")]
        mig_xid = prom.wait_for('gpu_mig_xid_errors_total{xid="94"}', timeout=30)
        assert [(s["metric"]["gpu_instance"], s["value"][1]) for s in mig_xid] == [("2", "1")]
        assert prom.query('gpu_xid_errors_total{gpu="0",xid="94"}')[0]["value"][1] == "1"

        # per-job series join with device series; job memory on a GPU sums to its processes' memory
        joined = prom.query("gpu_job_memory_used_bytes * on (gpu, uuid) group_left (model) gpu_info")
        assert {s["metric"]["job_id"] for s in joined} >= {"5101", "5107"}
        assert prom.query('gpulens_collector_success{collector="jobs"}')[0]["value"][1] == "1"
