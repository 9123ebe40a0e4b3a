"""Soak: run the real exporter through a simulated day (or more) and watch it for leaks.

    python -m gpulens.devtools.reliability.soak --out soak-report          # 24 simulated hours, ~8 minutes
    python -m gpulens.devtools.reliability.soak --sim-hours 1 --sim-speed 600 --out /tmp/soak

Why a separate command: an exporter runs for months, and what kills long-running daemons (a thread
per hung call never joined, a cache keyed by pid or MIG instance never pruned, a counter family whose
label set grows) only shows after thousands of sampling cycles with faults in between. The `faults`
scenario repeats every kind of fault every 3 simulated minutes, so a simulated day at 180x is ~480
fault cycles (lost GPUs, hung calls, MIG instances created and destroyed, MPS restarts, ECC storms,
Xids) and thousands of samples in about eight real minutes.

The exporter runs as its own process (`python -m gpulens.exporter.cli --simulate ... --sim-speed`),
is scraped by a few concurrent scrapers the whole time, and is measured from outside through /proc:
RSS, thread count, open file descriptors and CPU time, sampled every `--measure-every` seconds.
The report (`report.json`, `report.md` under `--out`) gives the series and a verdict: "flat" when,
after the warm-up (the first 10 % of the run), the median RSS, thread count and descriptor count of
the last tenth are within `--max-rss-growth-mib`, 3 threads and 8 descriptors of the first tenth's
(levels, not extremes: each in-flight scrape holds a connection thread and a socket for a moment).
Exit status 0 when flat and no scrape failed, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpulens.devtools.bench.measure import cpu_seconds, rss_bytes, thread_count
from gpulens.devtools.ports import free_port

MIB = 1024 * 1024
WARMUP_FRACTION = 0.1
THREAD_BAND = 3  # rise of the median thread count allowed after warm-up (a worker stuck in a hung call)
FD_BAND = 8  # rise of the median open-descriptor count allowed after warm-up


@dataclass(frozen=True)
class Measurement:
    """One look at the exporter process from outside."""

    real_s: float
    simulated_h: float
    rss_mib: float
    threads: int
    fds: int
    cpu_s: float


@dataclass
class ScrapeStats:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class Verdict:
    flat: bool
    rss_start_mib: float
    rss_end_mib: float
    rss_growth_mib: float
    rss_max_mib: float
    threads_min: int
    threads_max: int
    threads_end: int
    fds_min: int
    fds_max: int
    cpu_percent: float
    scrapes: int
    scrape_errors: int
    scrape_p50_ms: float
    scrape_p99_ms: float
    scrape_max_ms: float
    reasons: tuple[str, ...]


def _fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the exporter exited with status {proc.returncode} before it was ready")
        with contextlib.suppress(urllib.error.URLError, OSError), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout:g} s")


def _scrape_loop(url: str, stop: threading.Event, stats: ScrapeStats, pause: float) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = response.read()
            if response.status != 200 or b"gpulens_build_info" not in body:
                raise ValueError(f"status {response.status}, {len(body)} bytes")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            with stats.lock:
                stats.errors.append(f"{type(exc).__name__}: {exc}")
        else:
            with stats.lock:
                stats.latencies.append(time.perf_counter() - started)
        stop.wait(pause)


def judge(series: Sequence[Measurement], stats: ScrapeStats, max_rss_growth_mib: float) -> Verdict:
    """Flat or not, from the measurements after warm-up (the first 10 % of the run)."""
    if len(series) < 4:
        raise ValueError("too few measurements to judge; run longer or measure more often")
    warm = series[max(1, int(len(series) * WARMUP_FRACTION)) :]
    tail = warm[-max(1, len(warm) // 10) :]
    head = warm[: max(1, len(warm) // 10)]
    rss_start = statistics.median(m.rss_mib for m in head)
    rss_end = statistics.median(m.rss_mib for m in tail)
    threads = [m.threads for m in warm]
    fds = [m.fds for m in warm]
    latencies = sorted(stats.latencies) or [0.0]
    elapsed = series[-1].real_s - series[0].real_s
    reasons: list[str] = []
    if rss_end - rss_start > max_rss_growth_mib:
        reasons.append(f"RSS grew {rss_end - rss_start:.1f} MiB after warm-up (limit {max_rss_growth_mib:g})")
    # connection threads and sockets come and go with the scrapers, so compare levels, not extremes
    thread_rise = statistics.median(m.threads for m in tail) - statistics.median(m.threads for m in head)
    fd_rise = statistics.median(m.fds for m in tail) - statistics.median(m.fds for m in head)
    if thread_rise > THREAD_BAND:
        reasons.append(f"thread count rose by {thread_rise:g} after warm-up ({min(threads)}..{max(threads)})")
    if fd_rise > FD_BAND:
        reasons.append(f"open descriptors rose by {fd_rise:g} after warm-up ({min(fds)}..{max(fds)})")
    if stats.errors:
        reasons.append(f"{len(stats.errors)} scrapes failed, e.g. {stats.errors[0]}")
    return Verdict(
        flat=not reasons,
        rss_start_mib=round(rss_start, 1),
        rss_end_mib=round(rss_end, 1),
        rss_growth_mib=round(rss_end - rss_start, 1),
        rss_max_mib=round(max(m.rss_mib for m in series), 1),
        threads_min=min(threads),
        threads_max=max(threads),
        threads_end=series[-1].threads,
        fds_min=min(fds),
        fds_max=max(fds),
        cpu_percent=round(100 * (series[-1].cpu_s - series[0].cpu_s) / elapsed, 1) if elapsed > 0 else 0.0,
        scrapes=len(stats.latencies),
        scrape_errors=len(stats.errors),
        scrape_p50_ms=round(1000 * statistics.median(latencies), 2),
        scrape_p99_ms=round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 2),
        scrape_max_ms=round(1000 * latencies[-1], 2),
        reasons=tuple(reasons),
    )


def machine() -> dict[str, str]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": model or platform.processor() or "unknown",
        "cores": str(os.cpu_count() or 0),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


def log_summary(path: Path, top: int = 8) -> list[tuple[str, int]]:
    """The exporter's log lines grouped by message with numbers blanked (`GPU N`, `xid N`), most first.

    A message that grows with the number of samples rather than with the number of faults is log spam
    the verdict cannot see; this table makes it visible in the report.
    """
    counts: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            key = re.sub(r"\d+(\.\d+)?", "N", _log_message(line))
            counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])[:top]


# one logfmt pair: key=bare or key="quoted with \" escapes"
_LOGFMT_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')


def _log_message(line: str) -> str:
    """`LEVEL logger: message` of one log line, logfmt (the exporter's default) or the old text format.

    The timestamp is dropped so that lines group by what they say.
    """
    pairs = {key: value for key, value in _LOGFMT_PAIR.findall(line)}
    if "msg" in pairs and "level" in pairs:
        msg = pairs["msg"]
        if msg.startswith('"'):
            msg = msg[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        return f"{pairs['level'].upper()} {pairs.get('logger', '')}: {msg}"
    parts = line.split(" ", 2)  # "<date> <time> LEVEL logger: message"
    return parts[2] if len(parts) == 3 else line


def markdown(
    args: argparse.Namespace,
    verdict: Verdict,
    series: Sequence[Measurement],
    command: str,
    logs: Sequence[tuple[str, int]] = (),
) -> str:
    host = machine()
    step = max(1, len(series) // 12)
    rows = "\n".join(
        f"| {m.simulated_h:.1f} | {m.real_s:.0f} | {m.rss_mib:.1f} | {m.threads} | {m.fds} | {m.cpu_s:.1f} |"
        for m in [*series[::step], series[-1]]
    )
    reasons = "".join(f"\n- {r}" for r in verdict.reasons) or "\n- none"
    log_rows = "\n".join(f"| {n} | `{message.replace('|', '/')[:150]}` |" for message, n in logs) or "| 0 | |"
    v = verdict
    rss = f"{v.rss_start_mib} -> {v.rss_end_mib} ({v.rss_growth_mib:+})"
    threads = f"{v.threads_min}..{v.threads_max}, {v.threads_end}"
    latency = f"{v.scrape_p50_ms} / {v.scrape_p99_ms} / {v.scrape_max_ms} ms"
    return f"""# gpulens-exporter soak: {args.scenario}, {args.sim_hours:g} simulated hours

Command: `{command}`

Machine: {host["cpu"]}, {host["cores"]} cores, Python {host["python"]}, {host["system"]}

Verdict: **{"flat" if verdict.flat else "NOT flat"}**; reasons:{reasons}

| | value |
|---|---|
| RSS after warm-up -> end (MiB) | {rss} |
| RSS max (MiB) | {verdict.rss_max_mib} |
| threads after warm-up (min..max, end) | {threads} |
| open descriptors (min..max) | {verdict.fds_min}..{verdict.fds_max} |
| exporter CPU | {verdict.cpu_percent} % of one core |
| scrapes | {verdict.scrapes}, {verdict.scrape_errors} failed |
| scrape latency p50 / p99 / max | {latency} |

| simulated h | real s | RSS MiB | threads | fds | CPU s |
|---|---|---|---|---|---|
{rows}

Exporter log, most frequent messages (numbers blanked):

| lines | message |
|---|---|
{log_rows}
"""


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    real_seconds = args.sim_hours * 3600 / args.sim_speed
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "gpulens.exporter.cli",
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--simulate",
        args.scenario,
        "--sim-speed",
        f"{args.sim_speed:g}",
        "--interval",
        f"{args.interval:g}",
        "--log.level",
        "warning",
    ]
    command = " ".join(["python -m gpulens.devtools.reliability.soak", *sys.argv[1:]])
    print(
        f"soak: {args.sim_hours:g} simulated hours of {args.scenario} at {args.sim_speed:g}x "
        f"= {real_seconds:.0f} s, sampling every {args.interval:g} s, {args.scrapers} scrapers",
        file=sys.stderr,
    )
    base = f"http://127.0.0.1:{port}"
    with (out / "exporter.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        stats = ScrapeStats()
        stop = threading.Event()
        series: list[Measurement] = []
        try:
            _wait_ready(f"{base}/-/ready", proc)
            scrapers = [
                threading.Thread(
                    target=_scrape_loop, args=(f"{base}/metrics", stop, stats, args.scrape_pause), daemon=True
                )
                for _ in range(args.scrapers)
            ]
            for thread in scrapers:
                thread.start()
            started = time.monotonic()
            while True:
                elapsed = time.monotonic() - started
                if proc.poll() is not None:
                    stats.errors.append(f"exporter exited with status {proc.returncode} during the soak")
                    break
                series.append(
                    Measurement(
                        real_s=round(elapsed, 2),
                        simulated_h=round(elapsed * args.sim_speed / 3600, 3),
                        rss_mib=round(rss_bytes(proc.pid) / MIB, 2),
                        threads=thread_count(proc.pid),
                        fds=_fd_count(proc.pid),
                        cpu_s=round(cpu_seconds(proc.pid), 2),
                    )
                )
                if elapsed >= real_seconds:
                    break
                time.sleep(min(args.measure_every, max(0.0, real_seconds - elapsed)))
            stop.set()
            for thread in scrapers:
                thread.join(timeout=15)
        finally:
            stop.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                exit_code = proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                exit_code = proc.wait()
    if exit_code != 0:
        stats.errors.append(f"exporter exited with status {exit_code} on SIGTERM")
    verdict = judge(series, stats, args.max_rss_growth_mib)
    logs = log_summary(out / "exporter.log")
    report = {
        "command": command,
        "exporter_command": cmd,
        "machine": machine(),
        "scenario": args.scenario,
        "sim_hours": args.sim_hours,
        "sim_speed": args.sim_speed,
        "interval_s": args.interval,
        "scrapers": args.scrapers,
        "verdict": asdict(verdict),
        "log_summary": [{"message": m, "lines": n} for m, n in logs],
        "series": [asdict(m) for m in series],
    }
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(markdown(args, verdict, series, command, logs))
    print(
        f"soak: {'flat' if verdict.flat else 'NOT flat'}: RSS {verdict.rss_start_mib} -> "
        f"{verdict.rss_end_mib} MiB, threads {verdict.threads_min}..{verdict.threads_max}, "
        f"fds {verdict.fds_min}..{verdict.fds_max}, {verdict.scrapes} scrapes "
        f"({verdict.scrape_errors} failed, p99 {verdict.scrape_p99_ms} ms); report in {out}",
    )
    for reason in verdict.reasons:
        print(f"soak: {reason}", file=sys.stderr)
    return 0 if verdict.flat else 1


def _positive(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {raw}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gpulens.devtools.reliability.soak",
        description="Run gpulens-exporter through simulated hours of faults and check RSS/threads stay flat.",
    )
    p.add_argument("--scenario", default="faults", help="built-in scenario or YAML file (default faults)")
    p.add_argument("--sim-hours", type=_positive, default=24.0, help="simulated hours (default 24)")
    p.add_argument("--sim-speed", type=_positive, default=180.0, help="simulated seconds per second (180)")
    p.add_argument("--interval", type=_positive, default=0.25, help="exporter sampling interval, s (0.25)")
    p.add_argument("--scrapers", type=int, default=4, help="concurrent scrapers (default 4)")
    p.add_argument("--scrape-pause", type=float, default=0.05, help="pause between a scraper's requests")
    p.add_argument("--measure-every", type=_positive, default=5.0, help="seconds between measurements")
    p.add_argument("--max-rss-growth-mib", type=float, default=8.0, help="allowed RSS growth after warm-up")
    p.add_argument("--out", default="soak-report", help="report directory (default ./soak-report)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.scrapers < 0:
        print("soak: error: --scrapers must be >= 0", file=sys.stderr)
        return 2
    try:
        return run(args)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"soak: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
