"""`python -m gpulens.devtools.reliability.soak`: the verdict logic, and a short real run end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.devtools.reliability.soak import Measurement, ScrapeStats, judge, log_summary


def run_of(rss: list[float], threads: list[int]) -> list[Measurement]:
    return [
        Measurement(real_s=i * 5.0, simulated_h=i * 0.25, rss_mib=r, threads=t, fds=5, cpu_s=i * 1.0)
        for i, (r, t) in enumerate(zip(rss, threads, strict=True))
    ]


def test_a_steady_process_is_flat() -> None:
    rss = [30.0, 38.0] + [40.0 + (i % 3) * 0.2 for i in range(60)]  # warm-up, then noise only
    verdict = judge(run_of(rss, [13] * 62), ScrapeStats(latencies=[0.002] * 100), max_rss_growth_mib=8)
    assert verdict.flat, verdict.reasons
    assert verdict.rss_growth_mib < 1


def test_a_leak_is_not_flat() -> None:
    rss = [40.0 + 0.5 * i for i in range(62)]  # half a MiB per measurement, ~30 MiB over the run
    verdict = judge(run_of(rss, [13] * 62), ScrapeStats(), max_rss_growth_mib=8)
    assert not verdict.flat
    assert "RSS grew" in verdict.reasons[0]


def test_a_thread_leak_is_not_flat() -> None:
    verdict = judge(
        run_of([40.0] * 62, [13 + i // 10 for i in range(62)]), ScrapeStats(), max_rss_growth_mib=8
    )
    assert not verdict.flat
    assert any("thread count rose" in r for r in verdict.reasons)


def test_connection_threads_of_concurrent_scrapers_are_not_a_leak() -> None:
    threads = [13 + (i * 7) % 21 for i in range(62)]  # 13..33 at random moments, no trend
    verdict = judge(run_of([40.0] * 62, [13] * 6 + threads[6:]), ScrapeStats(), max_rss_growth_mib=8)
    assert verdict.flat, verdict.reasons


def test_failed_scrapes_are_not_flat() -> None:
    stats = ScrapeStats(latencies=[0.01], errors=["URLError: refused"])
    verdict = judge(run_of([40.0] * 20, [13] * 20), stats, max_rss_growth_mib=8)
    assert not verdict.flat and verdict.scrape_errors == 1


@pytest.mark.slow
def test_a_short_soak_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpulens.devtools.reliability.soak",
            "--sim-hours",
            "0.25",
            "--sim-speed",
            "150",
            "--measure-every",
            "0.5",
            "--scrapers",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    report = json.loads((out / "report.json").read_text())
    verdict = report["verdict"]
    assert verdict["scrape_errors"] == 0 and verdict["scrapes"] > 20
    assert verdict["threads_max"] < 40  # one per GPU worker, Xid, attribution, HTTP: never unbounded
    assert len(report["series"]) >= 10
    assert "| RSS max (MiB) |" in (out / "report.md").read_text()
    assert all(row["lines"] > 0 for row in report["log_summary"])
    assert (out / "exporter.log").exists()


def test_log_summary_groups_messages_by_shape(tmp_path: Path) -> None:
    log = tmp_path / "exporter.log"
    log.write_text(
        "2026-11-29 21:31:02,328 WARNING gpulens.exporter: xid 79 on GPU 2\n"
        "2026-11-29 21:31:03,100 WARNING gpulens.exporter: xid 13 on GPU 3\n"
        "2026-11-29 21:31:04,000 WARNING gpulens.exporter: GPU 2: GPU lost: NVMLError_GpuIsLost (15)\n"
    )
    assert log_summary(log) == [
        ("WARNING gpulens.exporter: xid N on GPU N", 2),
        ("WARNING gpulens.exporter: GPU N: GPU lost: NVMLError_GpuIsLost (N)", 1),
    ]


def test_log_summary_groups_logfmt_lines_by_level_logger_and_message(tmp_path: Path) -> None:
    log = tmp_path / "exporter.log"
    log.write_text(
        'time=2026-12-01T23:27:11.233Z level=warning logger=gpulens.exporter msg="xid 79 on GPU 2"\n'
        'time=2026-12-01T23:27:12.001Z level=warning logger=gpulens.exporter msg="xid 13 on GPU 3"\n'
        'time=2026-12-01T23:27:13.000Z level=error logger=gpulens.exporter msg="file \\"a b\\" refused"\n'
    )
    assert log_summary(log) == [
        ("WARNING gpulens.exporter: xid N on GPU N", 2),
        ('ERROR gpulens.exporter: file "a b" refused', 1),
    ]


def test_bad_arguments_exit_2_with_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpulens.devtools.reliability.soak", "--sim-hours", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("expected a positive number, got -1")
