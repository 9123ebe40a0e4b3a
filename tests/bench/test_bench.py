"""`gpulens bench` runs end to end and reports what it measured (numbers are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from gpulens.devtools.bench.measure import paced_load
from gpulens.devtools.bench.report import ratio_lines, render_markdown, target_lines
from gpulens.httpd.server import Response, Server


def _exporter(name: str, cycle_ms: float, median_ms: float) -> dict[str, Any]:
    return {
        "name": name,
        "version": "1",
        "startup_s": 1.0,
        "cpu_per_cycle_ms": cycle_ms,
        "saturated": False,
        "core_percent_at_5s": cycle_ms / 50,
        "response_bytes": 1000,
        "rss_warm_bytes": 2**25,
        "rss_after_bytes": 2**25,
        "threads_warm": 3,
        "threads_after": 3,
        "scrapes_total": 10,
        "latency": [
            {
                "concurrency": 20,
                "requests": 10,
                "median_ms": median_ms,
                "p99_ms": median_ms * 2,
                "errors": 0,
                "wall_s": 1.0,
            }
        ],
    }


DATA = {
    "command": "make bench",
    "scenario": "large",
    "machine": {"cpu": "x", "cores": "2", "python": "3.11", "kernel": "k", "date": "d"},
    "exporters": [_exporter("gpulens-exporter", 10.0, 1.0), _exporter("nvitop-exporter", 60.0, 25.0)],
}


def test_ratios_compare_the_peer_with_gpulens():
    lines = ratio_lines(DATA)
    assert lines[0].startswith("CPU per sampling cycle: nvitop-exporter / gpulens = 6.0x")
    assert "scrape median with 20 scraper(s): nvitop-exporter / gpulens = 25.0x" in lines[1]


def test_targets_say_met_or_not_met():
    lines = target_lines(DATA)
    assert "scrape median under 20 scrapers, closed loop: 1.00 ms (target <= 2): met" in lines
    assert any(line.startswith("share of a core at 5 s") and line.endswith("met") for line in lines)


def test_the_cpu_ratio_is_a_target_line_of_its_own():
    assert "CPU per cycle, nvitop-exporter / gpulens: 6.00 x (target >= 5): met" in target_lines(DATA)


def test_a_target_met_by_a_thin_margin_says_so():
    thin = {**DATA, "exporters": [_exporter("gpulens-exporter", 19.0, 1.9), DATA["exporters"][1]]}
    lines = target_lines(thin)
    assert "CPU per sampling cycle: 19.00 ms (target <= 20): met, within 5 %" in lines
    assert "scrape median under 20 scrapers, closed loop: 1.90 ms (target <= 2): met, within 5 %" in lines


def test_the_paced_load_is_reported_beside_the_closed_loop_and_named_as_such():
    paced = {
        "concurrency": 20,
        "requests": 200,
        "median_ms": 0.5,
        "p99_ms": 12.0,
        "errors": 0,
        "wall_s": 10.0,
    }
    ours = {**_exporter("gpulens-exporter", 10.0, 3.0), "paced": [paced], "paced_every_s": 0.1}
    data = {**DATA, "exporters": [ours, DATA["exporters"][1]]}
    text = render_markdown(data)
    assert "| scrape median / p99, 20 scraper(s), closed loop (ms) | 3.00 / 6.00 |" in text
    assert "| scrape median / p99, 20 scrapers each every 0.1 s (paced) (ms) | 0.50 / 12.00 | - |" in text
    lines = target_lines(data)
    assert "scrape median under 20 scrapers, closed loop: 3.00 ms (target <= 2): NOT met" in lines
    assert "scrape p99 under 20 scrapers each every 0.1 s (paced): 12.00 ms (target <= 10): NOT met" in lines


def test_paced_scrapers_never_ask_faster_than_their_interval():
    server = Server(_Answer(), "127.0.0.1", 0)
    server.start()
    try:
        result = paced_load(server.port, scrapers=4, every=0.05, seconds=0.5)
    finally:
        server.stop()
    assert result.errors == 0
    assert 4 <= result.requests <= 4 * (0.5 / 0.05 + 1)


class _Answer:
    keep_body = False

    def check_head(self, head: object) -> None:
        return None

    def handle(self, request: object) -> Response:
        return Response(200, b"up 1\n" * 1000)


def test_the_breakdown_lists_where_the_remaining_time_goes():
    spot = {"where": "exporter/render.py:64", "function": "_fast_render", "part": "gpulens"}
    breakdown = {
        "scenario": "large",
        "cycles": 5,
        "cycle_cpu_ms": 30.0,
        "driver": "native",
        "simulated_driver_share": 0.0,
        "nvml_binding_share": 0.2,
        "gpulens_share": 0.5,
        "other_share": 0.3,
        "hotspots": [{**spot, "share": 0.25, "calls_per_cycle": 1.0}],
    }
    text = render_markdown({**DATA, "breakdown": breakdown})
    assert "| `_fast_render` | exporter/render.py:64 | gpulens | 25.0 % | 7.5 | 1 |" in text
    assert "native simulated driver" in text


def test_a_peer_that_completed_no_scrape_gets_no_ratio():
    stuck = _exporter("nvitop-exporter", 60.0, 0.0)
    stuck["latency"][0]["requests"] = 0
    data = {**DATA, "exporters": [DATA["exporters"][0], stuck]}
    assert any("nvitop-exporter completed no scrape in the window" in line for line in ratio_lines(data))
    assert "no scrape completed in 1 s" in render_markdown(data)


def test_markdown_names_the_command_and_both_exporters():
    text = render_markdown(DATA)
    assert "`make bench`" in text and "gpulens-exporter 1" in text and "nvitop-exporter 1" in text


@pytest.mark.slow
def test_bench_runs_both_exporters_and_prints_ratios_last(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "bench",
            "--no-analyzer",
            "--scenario",
            "dgx-h100",
            "--interval",
            "1",
            "--idle-window",
            "2",
            "--scrapes-single",
            "20",
            "--scrapes-concurrent",
            "40",
            "--soak",
            "0",
            "--wrk-seconds",
            "2",
            "--out",
            str(tmp_path / "b.md"),
            "--json",
            str(tmp_path / "b.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].startswith("response size: nvitop-exporter / gpulens")
    data = json.loads((tmp_path / "b.json").read_text())
    assert [e["name"] for e in data["exporters"]] == ["gpulens-exporter", "nvitop-exporter"]
    assert all(e["latency"][0]["errors"] == 0 for e in data["exporters"])
