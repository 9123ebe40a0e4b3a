"""Measure one exporter process from outside: CPU, RSS, start-up, scrape latency and size.

Everything is read from /proc and over loopback HTTP, so gpulens-exporter and a peer
(nvitop-exporter), both under `gpulens sim run`, are measured by exactly the same code in the same
run; the measured process is the program, not the launcher that runs the simulated node.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (the sim launcher runs the measured program as a child)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(int(child) for child in task.read_text().split())
            except OSError:
                continue
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def thread_count(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def find_measured_pid(root: int, marker: str, timeout: float = 30.0) -> int:
    """The process in `root`'s tree whose command line contains `marker`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in process_tree(root):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline and " sim run " not in cmdline:
                return pid
        time.sleep(0.05)
    raise RuntimeError(f"no process with {marker!r} under pid {root}")


def http_get(port: int, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def wait_ready(port: int, path: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> float:
    """Seconds until `path` answers 200 with a non-empty body."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before it was ready")
        try:
            status, body = http_get(port, path, timeout=5)
            if status == 200 and body:
                return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"port {port} not ready after {timeout}s")


@dataclass
class LatencyResult:
    concurrency: int
    requests: int
    median_ms: float
    p99_ms: float
    errors: int
    wall_s: float


def scrape_load(port: int, concurrency: int, total: int, path: str = "/metrics") -> LatencyResult:
    """`total` GETs spread over `concurrency` threads, each on a fresh connection like Prometheus'
    first scrape; returns latency percentiles."""
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    per_thread = max(1, total // concurrency)

    def worker() -> None:
        nonlocal errors
        mine: list[float] = []
        failed = 0
        for _ in range(per_thread):
            started = time.perf_counter()
            try:
                status, _ = http_get(port, path)
                if status != 200:
                    failed += 1
            except OSError:
                failed += 1
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)
            errors += failed

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return LatencyResult(
        concurrency, len(latencies), statistics.median(latencies) * 1e3, p99 * 1e3, errors, wall
    )


_WRK_PERCENTILE = re.compile(r"^\s+(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s)\s*$")
_WRK_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk_load(port: int, concurrency: int, seconds: float, path: str = "/metrics") -> LatencyResult:
    """Load from wrk (a separate C process, so the client never competes for our GIL), with
    keep-alive and `Accept-Encoding: gzip` like Prometheus' scrapes."""
    wrk = shutil.which("wrk")
    assert wrk is not None
    threads = min(concurrency, 2)
    out = subprocess.run(
        [
            wrk,
            f"-t{threads}",
            f"-c{concurrency}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "30s",
            "--latency",
            "-H",
            "Accept-Encoding: gzip",
            f"http://127.0.0.1:{port}{path}",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    ).stdout
    percentiles: dict[str, float] = {}
    requests, errors = 0, 0
    for line in out.splitlines():
        if match := _WRK_PERCENTILE.match(line):
            percentiles[match.group(1)] = float(match.group(2)) * _WRK_UNITS[match.group(3)]
        elif "requests in" in line:
            requests = int(line.split()[0])
        elif line.strip().startswith(("Non-2xx", "Socket errors")):
            errors += sum(int(n) for n in re.findall(r"\d+", line.split(":", 1)[1]))
    return LatencyResult(
        concurrency,
        requests,
        percentiles.get("50", float("nan")),
        percentiles.get("99", float("nan")),
        errors,
        seconds,
    )


PACED_SCRAPERS = 20
PACED_EVERY_S = 0.1


def paced_load(
    port: int, scrapers: int, every: float, seconds: float, path: str = "/metrics"
) -> LatencyResult:
    """`scrapers` kept-alive connections, each asking every `every` seconds (phases spread evenly
    over the interval, as Prometheus spreads its targets) and never twice at once: a scrape that
    outlasts the interval skips the ticks it missed, as Prometheus does. Unlike wrk's closed loop,
    where each connection asks again the moment it is answered and latency is the queue of 20
    requests in front of one event loop, this is latency at a fixed request rate
    (`scrapers / every` per second). Latency runs from the request's send to its last body byte;
    the client is Python (asyncio, one thread, in the bench's process, not the measured one)."""
    return asyncio.run(_paced(port, scrapers, every, seconds, path))


async def _paced(port: int, scrapers: int, every: float, seconds: float, path: str) -> LatencyResult:
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2
    end = start + seconds
    latencies: list[float] = []
    errors = 0
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept-Encoding: gzip\r\n\r\n".encode()

    async def scrape(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        return int(head.split(b" ", 2)[1])

    async def scraper(index: int) -> None:
        nonlocal errors
        tick = start + every * index / scrapers
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while tick < end:
            await asyncio.sleep(max(0.0, tick - loop.time()))
            started = time.perf_counter()
            try:
                if connection is None:
                    connection = await asyncio.open_connection("127.0.0.1", port)
                status = await asyncio.wait_for(scrape(*connection), 30.0)
                if status != 200:
                    errors += 1
            except (
                OSError,
                asyncio.IncompleteReadError,
                asyncio.LimitOverrunError,
                TimeoutError,
                ValueError,
            ):
                errors += 1
                if connection is not None:
                    connection[1].close()
                connection = None
            latencies.append(time.perf_counter() - started)
            tick += every
            while tick < loop.time():  # overran: skip the missed ticks
                tick += every
        if connection is not None:
            connection[1].close()

    began = time.perf_counter()
    await asyncio.gather(*(scraper(i) for i in range(scrapers)))
    wall = time.perf_counter() - began
    if not latencies:
        return LatencyResult(scrapers, 0, float("nan"), float("nan"), errors, wall)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return LatencyResult(
        scrapers, len(latencies), statistics.median(latencies) * 1e3, p99 * 1e3, errors, wall
    )


@dataclass
class ExporterResult:
    name: str
    version: str
    startup_s: float = 0.0
    interval_s: float = 0.0
    idle_window_s: float = 0.0
    idle_cpu_s: float = 0.0
    cpu_per_cycle_ms: float = 0.0
    saturated: bool = False
    core_percent_at_5s: float = 0.0
    response_bytes: int = 0
    rss_warm_bytes: int = 0
    rss_after_bytes: int = 0
    threads_warm: int = 0
    threads_after: int = 0
    scrapes_total: int = 0
    load_generator: str = ""
    load_average: float = 0.0  # 1-minute load average when the measurement started
    latency: list[LatencyResult] = field(default_factory=list)  # closed loop (wrk or threads)
    paced: list[LatencyResult] = field(default_factory=list)  # PACED_SCRAPERS every PACED_EVERY_S
    paced_every_s: float = PACED_EVERY_S


def measure_exporter(
    name: str,
    version: str,
    command: Sequence[str],
    port: int,
    marker: str,
    interval: float,
    idle_window: float,
    scrape_counts: dict[int, int],
    soak_scrapes: int,
    log_path: Path,
    wrk_seconds: float = 10.0,
) -> ExporterResult:
    """Start `command`, measure it as described in docs/benchmarks.md, stop it."""
    result = ExporterResult(name=name, version=version, interval_s=interval, idle_window_s=idle_window)
    result.load_average = round(os.getloadavg()[0], 2)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            result.startup_s = wait_ready(port, "/metrics", proc)
            pid = find_measured_pid(proc.pid, marker)
            time.sleep(interval * 2)  # warm-up: a few sampling cycles
            cpu_before = cpu_seconds(pid)
            time.sleep(idle_window)
            result.idle_cpu_s = cpu_seconds(pid) - cpu_before
            # both exporters sample at a fixed rate: idle_window/interval cycles, unless a cycle
            # outlasts the interval (then the loop is busy all the time and this is a lower bound)
            result.saturated = result.idle_cpu_s > 0.9 * idle_window
            result.cpu_per_cycle_ms = result.idle_cpu_s / (idle_window / interval) * 1e3
            result.core_percent_at_5s = result.cpu_per_cycle_ms / 1e3 / 5.0 * 100
            _, body = http_get(port, "/metrics")
            result.response_bytes = len(body)
            result.rss_warm_bytes, result.threads_warm = rss_bytes(pid), thread_count(pid)
            for concurrency, count in scrape_counts.items():
                if shutil.which("wrk"):
                    result.latency.append(wrk_load(port, concurrency, wrk_seconds))
                else:
                    result.latency.append(scrape_load(port, concurrency, count))
            result.load_generator = "wrk" if shutil.which("wrk") else "python threads"
            result.paced.append(paced_load(port, PACED_SCRAPERS, PACED_EVERY_S, wrk_seconds))
            done = sum(r.requests for r in result.latency) + sum(r.requests for r in result.paced)
            if soak_scrapes > done:
                # keep scraping until `soak_scrapes` were served (bounded in time for a slow peer)
                if shutil.which("wrk"):
                    estimate = wrk_seconds * (soak_scrapes - done) / max(result.latency[-1].requests, 1)
                    done += wrk_load(port, 20, min(max(estimate, 1.0), 120.0)).requests
                else:
                    done += scrape_load(port, 20, soak_scrapes - done).requests
            result.scrapes_total = done
            result.rss_after_bytes, result.threads_after = rss_bytes(pid), thread_count(pid)
        finally:
            try:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, 9)
                proc.wait()
    return result
