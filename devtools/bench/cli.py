"""`gpulens bench`: measure gpulens-exporter and nvitop-exporter on the same simulated node,
and the analyzer at DESIGN §8 scale (`analyzer_bench.py`: PromQL path and file path).

Both run as separate processes on the same scenario (default `large`: 8 GPUs, 56 MIG instances,
about 200 processes) under `gpulens sim run`, so both call the native simulated NVML library (C,
like the real one) while the engine runs in the launcher, and are measured by the same code
(`measure.py`) in the same run, so the ratios hold even though absolute numbers vary by machine.
Results go to docs/benchmarks.md (table + command) and a JSON file; the ratio lines print last.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from gpulens import __version__
from gpulens.devtools.bench.analyzer_bench import RUNS, run_analyzer_bench
from gpulens.devtools.bench.analyzer_report import analyzer_target_lines
from gpulens.devtools.bench.breakdown import measure_breakdown
from gpulens.devtools.bench.measure import ExporterResult, measure_exporter
from gpulens.devtools.bench.report import ratio_lines, render_markdown
from gpulens.devtools.ports import free_port


def _machine() -> dict[str, str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="gpulens-bench-"))
    results = run_exporters(args, workdir) if args.exporter else []
    data: dict[str, Any] = {
        "command": "make bench (= " + " ".join(["gpulens bench", *sys.argv[2:]]) + ")",
        "scenario": args.scenario,
        "machine": _machine(),
        "exporters": [dataclasses.asdict(r) for r in results],
    }
    if results:
        print(f"splitting one gpulens sampling cycle on {args.scenario} by code ...", file=sys.stderr)
        load = os.getloadavg()[0]
        breakdown = measure_breakdown(args.scenario, interval=args.interval, cycles=args.breakdown_cycles)
        data["breakdown"] = {
            **dataclasses.asdict(breakdown),
            "load_average_1m": round(load, 2),
            "gpulens_cycle_ms": breakdown.gpulens_cycle_ms,
            "gpulens_cycle_ms_upper": breakdown.gpulens_cycle_ms_upper,
        }
    if args.analyzer:
        print(
            f"measuring the analyzer ({','.join(args.analyzer_runs)}): {args.analyzer_jobs:,} jobs x 7 days "
            f"(PromQL; {args.analyzer_large_jobs:,} for rules-large), "
            f"{args.analyzer_samples:,} samples (files) ...",
            file=sys.stderr,
        )
        try:
            data["analyzer"] = run_analyzer_bench(
                args.analyzer_jobs,
                args.analyzer_samples,
                args.analyzer_step,
                workdir / "analyzer",
                sys.stderr,
                compaction=args.analyzer_compaction,
                large_jobs=args.analyzer_large_jobs,
                thanos=args.analyzer_thanos,
                runs=frozenset(args.analyzer_runs),
                repeats=args.analyzer_repeats,
            )
        except RuntimeError as exc:  # a missing tool, a failed backfill: the exporter part still counts
            print(f"gpulens bench: the analyzer run failed: {exc}", file=sys.stderr)
            data["analyzer_error"] = str(exc)
        else:
            data["analyzer"]["cores"] = data["machine"]["cores"]
    shutil.rmtree(workdir, ignore_errors=True)
    return data


def sim_run(scenario: str, *options: str) -> list[str]:
    """`gpulens sim run SCENARIO [options] --`: the program after it runs on the native simulated
    driver, the engine in the launcher (whose CPU is not the measured program's)."""
    return [sys.executable, "-m", "gpulens.cli", "sim", "run", scenario, *options, "--"]


def run_exporters(args: argparse.Namespace, workdir: Path) -> list[ExporterResult]:
    scrape_counts = {1: args.scrapes_single, 20: args.scrapes_concurrent}
    results: list[ExporterResult] = []
    port = free_port()
    print(f"measuring gpulens-exporter on {args.scenario} (gpulens sim run) ...", file=sys.stderr)
    procfs = workdir / "proc"  # the simulated processes' /proc files, for attribution
    procfs.mkdir(parents=True, exist_ok=True)
    results.append(
        measure_exporter(
            "gpulens-exporter",
            __version__,
            [
                *sim_run(args.scenario, "--no-procview", "--procfs-dir", str(procfs)),
                sys.executable,
                "-m",
                "gpulens.exporter.cli",
                "--path.procfs",
                str(procfs),
                "--web.listen-address",
                f"127.0.0.1:{port}",
                "--interval",
                str(args.interval),
                "--log.level",
                "warning",
            ],
            port,
            "gpulens.exporter.cli",
            args.interval,
            args.idle_window,
            scrape_counts,
            args.soak,
            workdir / "gpulens.log",
            wrk_seconds=args.wrk_seconds,
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
        port = free_port()
        print(f"measuring nvitop-exporter on {args.scenario} (gpulens sim run) ...", file=sys.stderr)
        results.append(
            measure_exporter(
                "nvitop-exporter",
                metadata.version("nvitop-exporter"),
                [
                    *sim_run(args.scenario),
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
                wrk_seconds=args.wrk_seconds,
            )
        )
    return results


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        data = run_bench(args)
    except RuntimeError as exc:  # a missing promtool/prometheus, a failed backfill: one line
        print(f"gpulens: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    if args.out:
        Path(args.out).write_text(render_markdown(data))
        print(f"wrote {args.out}", file=sys.stderr)
    if "analyzer" in data:
        print("\n".join(analyzer_target_lines(data["analyzer"])))
    if data["exporters"]:
        print("\n".join(ratio_lines(data)))
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _runs(text: str) -> tuple[str, ...]:
    chosen = tuple(r.strip() for r in text.split(",") if r.strip())
    unknown = [r for r in chosen if r not in RUNS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(RUNS)}, got {text!r}")
    return chosen


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmark the exporter against nvitop-exporter, and the analyzer at scale"
    )
    parser.add_argument("--scenario", default="large", help="simulated node (default: large)")
    parser.add_argument("--interval", type=float, default=2.0, help="sampling interval of both exporters")
    parser.add_argument("--idle-window", type=float, default=30.0, help="seconds of CPU measurement")
    parser.add_argument("--scrapes-single", type=int, default=300, help="scrapes with 1 scraper")
    parser.add_argument("--scrapes-concurrent", type=int, default=2000, help="scrapes with 20 scrapers")
    parser.add_argument("--wrk-seconds", type=float, default=10.0, help="duration of each wrk load")
    parser.add_argument("--soak", type=int, default=10000, help="total scrapes before the final RSS")
    parser.add_argument("--no-peer", action="store_true", help="measure gpulens-exporter only")
    parser.add_argument(
        "--breakdown-cycles", type=_positive, default=5, help="cycles timed and profiled in-process (5)"
    )
    parser.add_argument(
        "--exporter",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the exporters (default: on)",
    )
    parser.add_argument(
        "--analyzer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the analyzer at scale: recording-rule, raw, Thanos and file paths (default: on)",
    )
    parser.add_argument(
        "--analyzer-jobs", type=_positive, default=10_000, help="jobs over 7 days (default 10000)"
    )
    parser.add_argument(
        "--analyzer-samples",
        type=_positive,
        default=20_000_000,
        help="raw samples for the file path (default 20000000)",
    )
    parser.add_argument(
        "--analyzer-step",
        type=_positive,
        default=300,
        help="seconds between samples of the backfilled TSDB (default 300)",
    )
    parser.add_argument(
        "--analyzer-large-jobs",
        type=int,
        default=50_000,
        help="jobs of the second recording-rule run, for the cost per job (default 50000; 0: skip)",
    )
    parser.add_argument(
        "--analyzer-thanos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also through a Thanos querier over two Prometheus shards (default: on; `make thanos` builds "
        "it, skipped without it)",
    )
    parser.add_argument(
        "--analyzer-runs",
        type=_runs,
        default=RUNS,
        metavar="RUN,...",
        help=f"which analyzer runs, comma-separated (default: all of {','.join(RUNS)}); e.g. rules "
        "alone for the recording-rule path at --analyzer-jobs",
    )
    parser.add_argument(
        "--analyzer-repeats",
        type=_positive,
        default=3,
        help="runs of each analyzer path on the same data; the median run is reported (default 3)",
    )
    parser.add_argument(
        "--analyzer-compaction",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let Prometheus compact the backfilled blocks before measuring (default: on; ~1 min)",
    )
    parser.add_argument("--out", default="docs/benchmarks.md", help="Markdown report ('' to skip)")
    parser.add_argument("--json", default="docs/benchmarks.json", help="JSON results ('' to skip)")
    parser.set_defaults(func=cmd_bench)
