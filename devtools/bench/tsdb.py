"""Real TSDBs on 127.0.0.1 for the analyzer's tests and benchmark: Prometheus, promtool, Thanos.

- `prometheus(...)` serves a backfilled TSDB (no scrape targets), optionally with external labels
  (a Thanos sidecar requires them).
- `backfill_rules(...)` evaluates the analyzer's recording rules over past data with `promtool
  tsdb create-blocks-from rules`, as Prometheus would have evaluated them live.
- `thanos_cluster(...)` runs a Thanos querier over one Prometheus + sidecar per shard.
- `lookback`, `query_requests`, `wait_for_compaction`: what the analyzer bench and tests ask of a
  running Prometheus (or querier): the lookback for backfilled data, queries served, compaction.

The Thanos binary is built from the Go module proxy by `make thanos` (Makefile) into
`~/.cache/gpulens-tools/bin/thanos-<version>`; `thanos_binary()` finds it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.devtools.ports import free_port
from gpulens.promscope.config import MixinConfig

THANOS_VERSION = "v0.42.3"
TOOLS_DIR = Path(os.environ.get("GPULENS_TOOLS_DIR", Path.home() / ".cache" / "gpulens-tools"))
BLOCK_S = 2 * 3600  # promtool's block range
BLOCK_MS = BLOCK_S * 1000
# The analyzer rules' mixin config for backfilled history: its series were never scraped, so they
# have no `job` label for the default selector to match; the cluster label stays (absent: a no-op).
BACKFILLED = MixinConfig(selector="")


class TsdbError(RuntimeError):
    """A TSDB process or tool failed; the message names it and where its log is."""


def thanos_binary() -> str | None:
    """`$GPULENS_THANOS`, the `make thanos` build, or `thanos` on PATH; None when there is none."""
    candidates = [os.environ.get("GPULENS_THANOS", ""), str(TOOLS_DIR / "bin" / f"thanos-{THANOS_VERSION}")]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    return shutil.which("thanos")


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise TsdbError(f"{name} not found on PATH (apt-get install prometheus)")
    return path


def _wait_ready(url: str, proc: subprocess.Popen[bytes], name: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise TsdbError(f"{name} exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TsdbError(f"{url} not ready after {timeout_s:.0f} s; see {log}")
        time.sleep(0.2)


@contextlib.contextmanager
def process(cmd: Sequence[str], ready_url: str, log: Path, timeout_s: float = 120.0) -> Iterator[None]:
    """Run `cmd` (output to `log`) until the context exits; ready when `ready_url` answers 200."""
    with log.open("w") as log_file:
        proc = subprocess.Popen(list(cmd), stdout=log_file, stderr=subprocess.STDOUT)
        try:
            _wait_ready(ready_url, proc, " ".join(Path(a).name for a in cmd[:2]), log, timeout_s)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def prometheus(
    tsdb: Path,
    lookback: str,
    log: Path,
    compaction: bool = True,
    external_labels: dict[str, str] | None = None,
    timeout_s: float = 120.0,
) -> Iterator[str]:
    """A real Prometheus on 127.0.0.1 serving `tsdb` (no scrape targets); yields its base URL.

    `lookback` (`--query.lookback-delta`) is below the data's step because backfilled blocks carry
    no staleness markers. With `compaction`, Prometheus compacts backfilled 2 h blocks as it would
    after weeks of scraping (the caller waits with `wait_for_compaction`); without, it keeps them.
    """
    config = tsdb.parent / f"{tsdb.name}-prometheus.yml"
    conf: dict[str, Any] = {"global": {"scrape_interval": "1m"}, "scrape_configs": []}
    if external_labels:
        conf["global"]["external_labels"] = external_labels
    config.write_text(json.dumps(conf))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [
        _binary("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={tsdb}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=3650d",
        f"--query.lookback-delta={lookback}",
    ]
    if not compaction:
        cmd += ["--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h"]
    with process(cmd, f"{base}/-/ready", log, timeout_s):
        yield base


def backfill_openmetrics(path: Path, tsdb: Path) -> None:
    """`promtool tsdb create-blocks-from openmetrics PATH TSDB`."""
    done = subprocess.run(
        [_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", "-q", str(path), str(tsdb)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise TsdbError(f"promtool failed on {path.name}: {done.stderr.strip()[-500:]}")


def _first_block_min_ms(out_dir: Path) -> int | None:
    times = [json.loads(meta.read_text())["minTime"] for meta in out_dir.glob("*/meta.json")]
    return min(times) if times else None


def backfill_rules(
    base_url: str, rule_text: str, start: float, end: float, out_dir: Path, interval_s: float
) -> list[Path]:
    """Evaluate the rules in `rule_text` over [start, end] against `base_url`; returns the new blocks.

    promtool evaluates a rule group at its own offset inside each interval (a hash of group name
    and file path, as Prometheus does live) and asks for whole seconds per 2 h block, so an
    evaluation less than a second before a block boundary is lost. The rule file's name decides
    the offset: if it lands there, the file is renamed and the backfill repeated.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    step_ms = int(interval_s * 1000)
    for attempt in range(8):
        # one name per attempt, the same for every call in a directory: shards backfilled from the
        # same file get the same offset, as Prometheus servers loading the same rule file do
        rule_file = out_dir.parent / f"analyzer_rules-{attempt}.yml"
        rule_file.write_text(rule_text)
        attempt_dir = out_dir / f"attempt-{attempt}"
        done = subprocess.run(
            [
                _binary("promtool"),
                "tsdb",
                "create-blocks-from",
                "rules",
                "--quiet",
                f"--url={base_url}",
                f"--start={int(start)}",
                f"--end={int(end)}",
                f"--output-dir={attempt_dir}",
                str(rule_file),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise TsdbError(f"promtool create-blocks-from rules failed: {done.stderr.strip()[-500:]}")
        first = _first_block_min_ms(attempt_dir)
        if first is None:
            raise TsdbError("promtool create-blocks-from rules wrote no block (no data in the range?)")
        if first % step_ms <= step_ms - 1000 or BLOCK_MS % step_ms:
            return blocks(attempt_dir)
        shutil.rmtree(attempt_dir)
    raise TsdbError("promtool: no rule file name gave an evaluation offset clear of the block boundaries")


def move_blocks(blocks: Sequence[Path], tsdb: Path) -> None:
    """Put finished blocks into a TSDB directory (Prometheus loads them when it next starts)."""
    tsdb.mkdir(parents=True, exist_ok=True)
    for block in blocks:
        shutil.move(str(block), str(tsdb / block.name))


def blocks(tsdb: Path) -> list[Path]:
    """The finished blocks of a TSDB directory (not its WAL, head chunks or lock files)."""
    return sorted(p for p in tsdb.iterdir() if (p / "meta.json").is_file()) if tsdb.is_dir() else []


def block_range_ms(block: Path) -> tuple[int, int]:
    """A TSDB block's [minTime, maxTime) in milliseconds, from its meta.json."""
    info = json.loads((block / "meta.json").read_text())
    return int(info["minTime"]), int(info["maxTime"])


def split_blocks(tsdb: Path, at_ms: int, first: Path, second: Path) -> None:
    """Move each block of `tsdb` into `first` (ends at or before `at_ms`) or `second` (starts at or after)."""
    for meta in sorted(tsdb.glob("*/meta.json")):
        info = json.loads(meta.read_text())
        if info["maxTime"] <= at_ms:
            move_blocks([meta.parent], first)
        elif info["minTime"] >= at_ms:
            move_blocks([meta.parent], second)
        else:
            raise TsdbError(f"block {meta.parent.name} spans the split at {at_ms} ms")


@dataclass(frozen=True)
class Shard:
    """One Prometheus of a Thanos deployment: its TSDB and the URL it is reached at."""

    tsdb: Path
    prometheus_url: str
    store_address: str  # the sidecar's gRPC StoreAPI


@contextlib.contextmanager
def thanos_cluster(
    tsdbs: Sequence[Path],
    lookback: str,
    workdir: Path,
    external_labels: dict[str, str] | None = None,
    compaction: bool = False,
    timeout_s: float = 120.0,
) -> Iterator[tuple[str, list[Shard]]]:
    """A Thanos querier over one Prometheus + Thanos sidecar per TSDB; yields (querier URL, shards).

    Every shard has the same external labels (as a sidecar and a store gateway serving one
    Prometheus' recent and old blocks do), so the querier merges their series into one.
    """
    thanos = thanos_binary()
    if thanos is None:
        raise TsdbError(
            f"thanos not found: run `make thanos` (builds {THANOS_VERSION} from the Go module proxy)"
        )
    labels = external_labels or {"cluster": "gpulens"}
    with contextlib.ExitStack() as stack:
        shards = []
        for n, tsdb in enumerate(tsdbs):
            prom = stack.enter_context(
                prometheus(
                    tsdb, lookback, workdir / f"shard-{n}-prometheus.log", compaction, labels, timeout_s
                )
            )
            grpc, http = free_port(), free_port()
            stack.enter_context(
                process(
                    [
                        thanos,
                        "sidecar",
                        f"--tsdb.path={tsdb}",
                        f"--prometheus.url={prom}",
                        f"--grpc-address=127.0.0.1:{grpc}",
                        f"--http-address=127.0.0.1:{http}",
                    ],
                    f"http://127.0.0.1:{http}/-/ready",
                    workdir / f"shard-{n}-sidecar.log",
                    timeout_s,
                )
            )
            shards.append(Shard(tsdb, prom, f"127.0.0.1:{grpc}"))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        stack.enter_context(
            process(
                [
                    thanos,
                    "query",
                    f"--http-address=127.0.0.1:{port}",
                    f"--grpc-address=127.0.0.1:{free_port()}",
                    *[f"--endpoint={s.store_address}" for s in shards],
                    f"--query.lookback-delta={lookback}",
                ],
                f"{base}/-/ready",
                workdir / "querier.log",
                timeout_s,
            )
        )
        wait_for_stores(base, len(shards), timeout_s)
        yield base, shards


def wait_for_stores(base: str, count: int, timeout_s: float) -> None:
    """Wait until the querier has connected to `count` StoreAPI endpoints."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/api/v1/stores", timeout=5) as resp:
                data = json.load(resp).get("data") or {}
            seen = sum(1 for stores in data.values() for s in stores or [] if not s.get("lastError"))
            if seen >= count:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TsdbError(f"thanos querier at {base} sees {seen} of {count} stores after {timeout_s:.0f} s")


def lookback(step_s: int) -> str:
    """Just under the step: backfilled blocks have no staleness markers, and a whole step would let a
    series linger one step; the rules' evaluation (at any offset within the step) sees its step."""
    return f"{step_s - 1}s999ms"


def self_metrics(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
        return text


def query_requests(base: str) -> int:
    """Instant queries served, from the server's own metrics (Prometheus or a Thanos querier)."""
    pattern = re.compile(
        r'^(?:prometheus_)?http_requests_total\{[^}]*handler="(?:/api/v1/query|query)"[^}]*\} (\S+)$', re.M
    )
    return int(sum(float(m) for m in pattern.findall(self_metrics(base))))


def _gauge(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(match.group(1)) if match else math.nan


def wait_for_compaction(base: str, timeout_s: float = 1800.0, settle_s: float = 10.0) -> int:
    """Wait until Prometheus has compacted the backfilled blocks and the block count is stable (a
    week of 10,000 jobs takes about 75 s on 2 cores; the timeout leaves room for 50,000 on a busy
    machine, and only a stuck Prometheus reaches it)."""
    deadline = time.monotonic() + timeout_s
    last, since = -1.0, time.monotonic()
    while time.monotonic() < deadline:
        text = self_metrics(base)
        blocks = _gauge(text, "prometheus_tsdb_blocks_loaded")
        compactions = _gauge(text, "prometheus_tsdb_compactions_total")
        if blocks != last:
            last, since = blocks, time.monotonic()
        elif compactions > 0 and time.monotonic() - since >= settle_s:
            return int(blocks)
        time.sleep(1.0)
    raise TsdbError(f"prometheus did not finish compacting within {timeout_s:.0f} s")
