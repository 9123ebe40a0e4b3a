"""`gpulens bench`: measure gpulens-exporter and nvitop-exporter on the same simulated node.

Both run as separate processes on the same scenario (default `large`: 8 GPUs, 56 MIG instances,
about 200 processes) through the same simulated NVML library, and are measured by the same code
(`measure.py`) in the same run, so the ratios hold even though absolute numbers vary by machine.
Results go to docs/benchmarks.md (table + command) and a JSON file; the ratio lines print last.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from gpulens import __version__
from gpulens.bench.measure import ExporterResult, measure_exporter
from gpulens.bench.report import ratio_lines, render_markdown


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _machine() -> dict[str, str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    import os

    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def run_bench(args: argparse.Namespace) -> dict:
    scrape_counts = {1: args.scrapes_single, 20: args.scrapes_concurrent}
    results: list[ExporterResult] = []
    workdir = Path(tempfile.mkdtemp(prefix="gpulens-bench-"))
    port = _free_port()
    print(f"measuring gpulens-exporter on {args.scenario} ...", file=sys.stderr)
    results.append(
        measure_exporter(
            "gpulens-exporter",
            __version__,
            [
                sys.executable,
                "-m",
                "gpulens.exporter.cli",
                "--simulate",
                args.scenario,
                "--listen",
                f"127.0.0.1:{port}",
                "--interval",
                str(args.interval),
                "--log-level",
                "warning",
            ],
            port,
            "gpulens.exporter.cli",
            args.interval,
            args.idle_window,
            scrape_counts,
            args.soak,
            workdir / "gpulens.log",
        )
    )
    peer = shutil.which("nvitop-exporter", path=str(Path(sys.executable).parent)) or shutil.which(
        "nvitop-exporter"
    )
    if args.no_peer:
        print("peer skipped (--no-peer)", file=sys.stderr)
    elif peer is None:
        print("nvitop-exporter not installed (pip install nvitop-exporter): peer skipped", file=sys.stderr)
    else:
        port = _free_port()
        print(f"measuring nvitop-exporter on {args.scenario} (gpulens sim run) ...", file=sys.stderr)
        results.append(
            measure_exporter(
                "nvitop-exporter",
                metadata.version("nvitop-exporter"),
                [
                    sys.executable,
                    "-m",
                    "gpulens.cli",
                    "sim",
                    "run",
                    args.scenario,
                    "--",
                    peer,
                    "--bind-address",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--interval",
                    str(args.interval),
                ],
                port,
                "nvitop-exporter",
                args.interval,
                args.idle_window,
                scrape_counts,
                args.soak,
                workdir / "nvitop.log",
            )
        )
    return {
        "command": "make bench  (= gpulens bench " + " ".join(sys.argv[2:]) + ")",
        "scenario": args.scenario,
        "machine": _machine(),
        "exporters": [dataclasses.asdict(r) for r in results],
    }


def cmd_bench(args: argparse.Namespace) -> int:
    data = run_bench(args)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    if args.out:
        Path(args.out).write_text(render_markdown(data))
        print(f"wrote {args.out}", file=sys.stderr)
    print("\n".join(ratio_lines(data)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmark the exporter against nvitop-exporter")
    parser.add_argument("--scenario", default="large", help="simulated node (default: large)")
    parser.add_argument("--interval", type=float, default=2.0, help="sampling interval of both exporters")
    parser.add_argument("--idle-window", type=float, default=30.0, help="seconds of CPU measurement")
    parser.add_argument("--scrapes-single", type=int, default=300, help="scrapes with 1 scraper")
    parser.add_argument("--scrapes-concurrent", type=int, default=2000, help="scrapes with 20 scrapers")
    parser.add_argument("--wrk-seconds", type=float, default=10.0, help="duration of each wrk load")
    parser.add_argument("--soak", type=int, default=10000, help="total scrapes before the final RSS")
    parser.add_argument("--no-peer", action="store_true", help="measure gpulens-exporter only")
    parser.add_argument("--out", default="docs/benchmarks.md", help="Markdown report ('' to skip)")
    parser.add_argument("--json", default="docs/benchmarks.json", help="JSON results ('' to skip)")
    parser.set_defaults(func=cmd_bench)
