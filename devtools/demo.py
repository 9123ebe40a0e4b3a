"""`python -m gpulens.devtools.demo`: the whole gpulens stack on one machine, no GPU and no Docker needed.

What `make demo` runs. It generates a week of history for a simulated 8-GPU node as fleets are
usually found (`typical-fleet`: one job per GPU, mostly under-used, a memory hog, a leak, an idle
GPU), backfills it into a local Prometheus TSDB with promtool, starts Prometheus (shipped rules), Alertmanager
(shipped config), the remediation webhook (dry-run) and the exporter live on a simulated node,
all on 127.0.0.1, then runs the weekly report against that Prometheus. Everything lives under one
state directory (`.demo/` by default): data, logs, pid files and `state.json` (ports and paths, for
people and for tests). `--stop` stops what a previous run started.

Each step is a function that first checks that the piece it needs exists, so a missing piece is
one clear line naming it rather than a traceback halfway through.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from gpulens.devtools.ports import pick_port
from gpulens.sim.scenariofile import load_scenario

DURATION_RE = re.compile(r"^(\d+)([smhdw])$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

#: Ports tried first; a busy one is replaced by a free port (Debian's own prometheus.service
#: already holds 9090/9093 on many machines, hence the 19xxx defaults for the demo's copies).
PREFERRED_PORTS = {"prometheus": 19090, "alertmanager": 19093, "exporter": 9842, "remediate": 9843}

#: Where the shipped Alertmanager config sends remediation webhooks, and the token it sends.
SHIPPED_REMEDIATE_PORT = 9843
SHIPPED_TOKEN_FILE = "/etc/gpulens/remediate.token"


class DemoError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


# --------------------------------------------------------------------------------------------
# options and layout


def parse_duration(text: str) -> int:
    """Seconds in a Prometheus-style duration with one unit (`90m`, `1d`, `7d`)."""
    match = DURATION_RE.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise DemoError(f"duration {text!r}: expected a number and one unit of s/m/h/d/w, e.g. 7d")
    return int(match.group(1)) * UNIT_SECONDS[match.group(2)]


def default_step(history_s: int) -> str:
    """History sample step: at most about 2,500 points per series whatever the length.

    A week at 4 m keeps `gpulens simulate` and the promtool backfill within a couple of minutes on
    two cores; shorter histories get a finer step. The step stays under Prometheus' 5 m lookback so
    instant queries anywhere in the backfilled range find a sample.
    """
    for step in (15, 30, 60, 120, 240):
        if history_s / step <= 2600:
            break
    return f"{step // 60}m" if step % 60 == 0 else f"{step}s"


def find_repo_root() -> Path:
    """The gpulens checkout: the demo uses its shipped `alerts/` rules and Alertmanager config."""
    candidates = [Path(__file__).resolve().parents[1], Path.cwd()]
    for candidate in candidates:
        if (candidate / "alerts").is_dir() and (candidate / "setup.py").is_file():
            return candidate
    raise DemoError("cannot find the gpulens checkout (alerts/ and setup.py): run from the repository root")


@dataclass(frozen=True)
class Layout:
    """Where everything of one demo lives, under a single state directory."""

    root: Path

    @property
    def history(self) -> Path:
        return self.root / "history"

    @property
    def tsdb(self) -> Path:
        return self.root / "prometheus" / "data"

    @property
    def prometheus_config(self) -> Path:
        return self.root / "prometheus" / "prometheus.yml"

    @property
    def alertmanager_config(self) -> Path:
        return self.root / "alertmanager" / "alertmanager.yml"

    @property
    def alertmanager_data(self) -> Path:
        return self.root / "alertmanager" / "data"

    @property
    def token_file(self) -> Path:
        return self.root / "alertmanager" / "remediate.token"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def pid_file(self, name: str) -> Path:
        return self.run / f"{name}.pid"


@dataclass(frozen=True)
class Options:
    layout: Layout
    repo: Path
    history: str = "7d"
    step: str = ""
    history_scenario: str = "typical-fleet"
    live_scenario: str = "faults"
    python: str = sys.executable


@dataclass(frozen=True)
class HistoryRange:
    """What promtool backfilled: block count, time range (seconds since epoch) and samples."""

    blocks: int = 0
    min_time: float = 0.0
    max_time: float = 0.0
    samples: int = 0


@dataclass
class State:
    """What a running demo exposes: written to `state.json` for people, `--stop` and tests."""

    started_at: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    live_instance: str = ""
    history: HistoryRange = field(default_factory=HistoryRange)
    report: dict[str, str] = field(default_factory=dict)

    def save(self, layout: Layout) -> None:
        layout.state_file.write_text(json.dumps(asdict(self), indent=2) + "\n")


# --------------------------------------------------------------------------------------------
# progress and subprocesses


class Progress:
    """Numbered step lines, with a heartbeat showing the latest log line of a long command."""

    def __init__(self, total: int, out: TextIO | None = None) -> None:
        self.total = total
        self.index = 0
        self.out = out or sys.stdout
        self.interval = 10.0 if self.out.isatty() else 30.0

    def say(self, text: str) -> None:
        """Print a line; a closed terminal or pipe (`make demo | head`) must not stop the cleanup."""
        with contextlib.suppress(OSError, ValueError):
            print(text, file=self.out, flush=True)

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        self.index += 1
        started = time.monotonic()
        self.say(f"[{self.index}/{self.total}] {title} ...")
        yield
        self.say(f"      done in {time.monotonic() - started:.0f} s")

    @contextlib.contextmanager
    def heartbeat(self, log: Path) -> Iterator[None]:
        stop = threading.Event()
        started = time.monotonic()

        def beat() -> None:
            while not stop.wait(self.interval):
                last = last_line(log)
                self.say(f"      ... {time.monotonic() - started:.0f} s{'  ' + last[:90] if last else ''}")

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def last_line(path: Path) -> str:
    """The last non-empty line of a log (progress bars with carriage returns count as lines)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 4096))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in re.split(r"[\r\n]+", tail) if line.strip()]
    return lines[-1] if lines else ""


def run_logged(cmd: Sequence[str], log: Path, progress: Progress, what: str, timeout: float) -> None:
    """Run a command to completion with its output in `log`; fail with the log's last line."""
    with log.open("ab") as handle, progress.heartbeat(log):
        handle.write(f"$ {' '.join(cmd)}\n".encode())
        handle.flush()
        try:
            proc = subprocess.run(
                list(cmd),
                stdout=handle,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise DemoError(f"{what} did not finish within {timeout:.0f} s (log: {log})") from exc
    if proc.returncode != 0:
        raise DemoError(f"{what} failed with exit status {proc.returncode}: {last_line(log)} (log: {log})")


def command_available(cmd: Sequence[str]) -> bool:
    """Whether `cmd --help` runs: how the demo tells a missing gpulens piece from a broken one."""
    try:
        proc = subprocess.run(
            [*cmd, "--help"], capture_output=True, timeout=60, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def require_binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise DemoError(
        f"{names[0]} is not installed: `make demo` installs it from Debian "
        f"(apt-get install prometheus prometheus-alertmanager)"
    )


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes], log: Path, name: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DemoError(f"{name} exited with status {proc.returncode}: {last_line(log)} (log: {log})")
        with contextlib.suppress(urllib.error.URLError, OSError):
            http_get(url, timeout=2)
            return
        time.sleep(0.2)
    raise DemoError(f"{name} did not answer {url} within {timeout:.0f} s: {last_line(log)} (log: {log})")


# --------------------------------------------------------------------------------------------
# daemons: started in their own session, recorded in pid files with their start time so that
# `--stop` never signals an unrelated process that reused the pid


def process_start_ticks(pid: int) -> str:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or "" when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def start_daemon(
    layout: Layout,
    name: str,
    cmd: Sequence[str],
    ready_url: str,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> int:
    """Start `cmd` detached (own session, output in its log), wait for `ready_url`, record its pid."""
    log = layout.log(name)
    with log.open("ab") as handle:
        handle.write(f"$ {' '.join(cmd)}\n".encode())
        handle.flush()
        proc = subprocess.Popen(
            list(cmd),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    layout.pid_file(name).write_text(f"{proc.pid} {process_start_ticks(proc.pid)}\n")
    wait_http(ready_url, timeout, proc, log, name)
    return proc.pid


def read_pid_file(path: Path) -> tuple[int, str] | None:
    try:
        parts = path.read_text().split()
        return int(parts[0]), parts[1] if len(parts) > 1 else ""
    except (OSError, ValueError, IndexError):
        return None


def is_ours(pid: int, ticks: str) -> bool:
    """The pid is alive and is still the process we started (same start time)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return not ticks or process_start_ticks(pid) in ("", ticks)


def stop_process(pid: int, ticks: str, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `grace` seconds."""
    if not is_ours(pid, ticks):
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not is_ours(pid, ticks) or process_is_zombie(pid):
                return
            time.sleep(0.1)


def process_is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def stop_demo(layout: Layout, say: Callable[[str], None]) -> list[str]:
    """Stop every daemon recorded under `layout.run`; remove the pid files. Returns what was stopped."""
    stopped: list[str] = []
    if not layout.run.is_dir():
        return stopped
    # reverse start order: Prometheus first, so it does not alert on the exporter going away
    for pid_file in sorted(
        layout.run.glob("*.pid"), key=lambda p: DAEMON_ORDER.get(p.stem, 99), reverse=True
    ):
        record = read_pid_file(pid_file)
        if record and is_ours(*record):
            say(f"      stopping {pid_file.stem} (pid {record[0]})")
            stop_process(*record)
            stopped.append(pid_file.stem)
        pid_file.unlink(missing_ok=True)
    return stopped


DAEMON_ORDER = {"alertmanager": 0, "remediate": 1, "exporter": 2, "prometheus": 3}


# --------------------------------------------------------------------------------------------
# the steps


@dataclass(frozen=True)
class Pieces:
    """The commands of the other gpulens parts the demo drives."""

    python: str

    @property
    def gpulens(self) -> list[str]:
        return [self.python, "-m", "gpulens.cli"]

    @property
    def exporter(self) -> list[str]:
        return [self.python, "-m", "gpulens.exporter.cli"]


def require_piece(cmd: Sequence[str], description: str) -> None:
    if not command_available(cmd):
        shown = " ".join(["gpulens", *cmd[3:]] if cmd[2] == "gpulens.cli" else ["gpulens-exporter", *cmd[3:]])
        raise DemoError(f"{description} is missing: `{shown} --help` does not run in this checkout")


def rule_files(repo: Path) -> list[Path]:
    """The shipped Prometheus rule files: every `alerts/*.yml` with a top-level `groups` list."""
    found: list[Path] = []
    for path in sorted((repo / "alerts").glob("*.y*ml")):
        try:
            document = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise DemoError(f"{path}: not valid YAML ({exc.__class__.__name__})") from exc
        if isinstance(document, dict) and isinstance(document.get("groups"), list):
            found.append(path)
    return found


def check_pieces(options: Options) -> None:
    """Fail before any slow work if a binary, a shipped file or a gpulens command is missing."""
    require_binary("promtool")
    require_binary("prometheus")
    require_binary("prometheus-alertmanager", "alertmanager")
    if not rule_files(options.repo):
        raise DemoError(
            f"the alert and recording rules are missing: no rule file in {options.repo / 'alerts'}"
        )
    if not (options.repo / "alerts" / "alertmanager.yml").is_file():
        raise DemoError(f"the Alertmanager config is missing: {options.repo / 'alerts' / 'alertmanager.yml'}")
    pieces = Pieces(options.python)
    require_piece([*pieces.gpulens, "simulate"], "the history simulator (`gpulens simulate`)")
    require_piece([*pieces.gpulens, "report"], "the weekly report (`gpulens report`)")
    require_piece([*pieces.gpulens, "remediate"], "the remediation webhook (`gpulens remediate`)")
    require_piece(pieces.exporter, "the exporter (`gpulens-exporter`)")


def prepare(options: Options, progress: Progress) -> None:
    """Stop a previous demo in the same directory and start from clean data."""
    layout = options.layout
    if stop_demo(layout, progress.say):
        progress.say("      (a previous demo was running in this directory: stopped it)")
    for path in (
        layout.history,
        layout.tsdb.parent,
        layout.alertmanager_config.parent,
        layout.report,
        layout.logs,
        layout.run,
    ):
        shutil.rmtree(path, ignore_errors=True)
    layout.state_file.unlink(missing_ok=True)
    for path in (
        layout.history,
        layout.tsdb,
        layout.alertmanager_data,
        layout.report,
        layout.logs,
        layout.run,
    ):
        path.mkdir(parents=True, exist_ok=True)


def history_start(now: float, history: str, step: str) -> int:
    """Start of a history that ends at (or just before) `now`, aligned to the step.

    Aligned so that the backfilled samples sit on the same grid as the report's PromQL steps, and
    ending at now so that the live data follows the history without a gap.
    """
    step_s = parse_duration(step)
    return int((now - parse_duration(history)) // step_s * step_s)


def generate_history(options: Options, progress: Progress, now: float) -> Path:
    """`gpulens simulate` writes the scenario's history, ending now, as OpenMetrics text."""
    layout = options.layout
    cmd = [
        *Pieces(options.python).gpulens,
        "simulate",
        options.history_scenario,
        "--duration",
        options.history,
        "--step",
        options.step,
        "--start",
        str(history_start(now, options.history, options.step)),
        "--out",
        str(layout.history),
        "--progress",
    ]
    run_logged(cmd, layout.log("simulate"), progress, "gpulens simulate", timeout=1200)
    metrics = layout.history / "metrics.om"
    if not metrics.is_file() or metrics.stat().st_size == 0:
        raise DemoError(f"gpulens simulate wrote no OpenMetrics history: {metrics} is missing or empty")
    return metrics


def backfill(options: Options, progress: Progress, metrics: Path) -> HistoryRange:
    """promtool turns the OpenMetrics history into TSDB blocks Prometheus loads at start."""
    layout = options.layout
    cmd = [
        require_binary("promtool"),
        "tsdb",
        "create-blocks-from",
        "openmetrics",
        "--max-block-duration=24h",
        str(metrics),
        str(layout.tsdb),
    ]
    run_logged(
        cmd, layout.log("backfill"), progress, "promtool tsdb create-blocks-from openmetrics", timeout=1200
    )
    return blocks_range(layout.tsdb)


def blocks_range(tsdb: Path) -> HistoryRange:
    """Time range and block count of the TSDB blocks under `tsdb` (from their meta.json)."""
    metas = []
    for meta in tsdb.glob("*/meta.json"):
        with contextlib.suppress(OSError, ValueError):
            metas.append(json.loads(meta.read_text()))
    if not metas:
        raise DemoError(f"promtool wrote no TSDB block under {tsdb}")
    min_ms = min(int(m["minTime"]) for m in metas)
    max_ms = max(int(m["maxTime"]) for m in metas)
    samples = sum(int(m.get("stats", {}).get("numSamples", 0)) for m in metas)
    return HistoryRange(blocks=len(metas), min_time=min_ms / 1000, max_time=max_ms / 1000, samples=samples)


def allocate_ports() -> dict[str, int]:
    ports: dict[str, int] = {}
    for name, preferred in PREFERRED_PORTS.items():
        ports[name] = pick_port(preferred, set(ports.values()))
    return ports


def localize_alertmanager(config: object, remediate_port: int, token_file: Path) -> object:
    """The shipped Alertmanager config, pointed at the demo's webhook port and token file.

    The shipped receiver posts to 127.0.0.1:9843 / localhost:9843 with the bearer token in
    /etc/gpulens/remediate.token; the demo's webhook may listen elsewhere, and its token lives
    under the state directory.
    """
    if isinstance(config, dict):
        return {
            key: localize_alertmanager(value, remediate_port, token_file) for key, value in config.items()
        }
    if isinstance(config, list):
        return [localize_alertmanager(value, remediate_port, token_file) for value in config]
    if isinstance(config, str):
        if config == SHIPPED_TOKEN_FILE:
            return str(token_file)
        return re.sub(
            rf"^(https?://(?:127\.0\.0\.1|localhost)):{SHIPPED_REMEDIATE_PORT}\b",
            rf"\g<1>:{remediate_port}",
            config,
        )
    return config


def write_token(path: Path) -> Path:
    """A fresh random bearer token shared by Alertmanager and the webhook (owner-only file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    return path


def start_alertmanager(options: Options, ports: dict[str, int]) -> int:
    layout = options.layout
    shipped = options.repo / "alerts" / "alertmanager.yml"
    write_token(layout.token_file)
    config = localize_alertmanager(yaml.safe_load(shipped.read_text()), ports["remediate"], layout.token_file)
    layout.alertmanager_config.write_text(yaml.safe_dump(config, sort_keys=False))
    base = f"http://127.0.0.1:{ports['alertmanager']}"
    cmd = [
        require_binary("prometheus-alertmanager", "alertmanager"),
        f"--config.file={layout.alertmanager_config}",
        f"--storage.path={layout.alertmanager_data}",
        f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
        f"--web.external-url={base}",
        "--cluster.listen-address=",  # no HA peers: no gossip port to pick
    ]
    return start_daemon(layout, "alertmanager", cmd, f"{base}/-/ready")


def start_remediate(options: Options, ports: dict[str, int]) -> int:
    cmd = [
        *Pieces(options.python).gpulens,
        "remediate",
        "--web.listen-address",
        f"127.0.0.1:{ports['remediate']}",
        "--backend",
        "slurm",  # the live faults node runs Slurm jobs; without --apply every action is only logged
        "--token-file",
        str(options.layout.token_file),
    ]
    return start_daemon(options.layout, "remediate", cmd, f"http://127.0.0.1:{ports['remediate']}/-/healthy")


def start_exporter(options: Options, ports: dict[str, int]) -> int:
    cmd = [
        *Pieces(options.python).exporter,
        "--web.listen-address",
        f"127.0.0.1:{ports['exporter']}",
        "--simulate",
        options.live_scenario,
    ]
    return start_daemon(options.layout, "exporter", cmd, f"http://127.0.0.1:{ports['exporter']}/-/ready")


def live_node_name(scenario: str) -> str | None:
    """Host name of the simulated node, used as its `instance` (as a real node name would be, so
    alerts, dashboards and the remediation's dry-run `scontrol` name a node, not 127.0.0.1)."""
    try:
        return load_scenario(scenario).hostname
    except Exception:  # an unknown or broken scenario: the exporter reports it when it starts
        return None


def prometheus_config(options: Options, ports: dict[str, int]) -> dict[str, object]:
    """Scrape the live exporter every 5 s, load the shipped rules, alert to the demo's Alertmanager."""
    exporter_target: dict[str, object] = {"targets": [f"127.0.0.1:{ports['exporter']}"]}
    node = live_node_name(options.live_scenario)
    if node:
        exporter_target["labels"] = {"instance": node}
    return {
        "global": {
            "scrape_interval": "5s",
            "evaluation_interval": "5s",
            "external_labels": {"gpulens_demo": "true"},
        },
        "rule_files": [str(path) for path in rule_files(options.repo)],
        "alerting": {
            "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}]
        },
        "scrape_configs": [
            {"job_name": "gpulens", "static_configs": [exporter_target]},
            {
                "job_name": "remediate",
                "static_configs": [{"targets": [f"127.0.0.1:{ports['remediate']}"]}],
            },
            {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{ports['prometheus']}"]}]},
            {
                "job_name": "alertmanager",
                "static_configs": [{"targets": [f"127.0.0.1:{ports['alertmanager']}"]}],
            },
        ],
    }


def start_prometheus(options: Options, ports: dict[str, int]) -> int:
    layout = options.layout
    layout.prometheus_config.write_text(yaml.safe_dump(prometheus_config(options, ports), sort_keys=False))
    base = f"http://127.0.0.1:{ports['prometheus']}"
    cmd = [
        require_binary("prometheus"),
        f"--config.file={layout.prometheus_config}",
        f"--storage.tsdb.path={layout.tsdb}",
        f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
        f"--web.external-url={base}",
        "--storage.tsdb.retention.time=30d",
        "--web.enable-lifecycle",
    ]
    return start_daemon(layout, "prometheus", cmd, f"{base}/-/ready", timeout=180)


def prom_query(base: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    try:
        body = json.loads(http_get(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=30))
    except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
        raise DemoError(f"Prometheus at {base} did not answer the query {expr!r}: {exc}") from exc
    if body.get("status") != "success":
        raise DemoError(f"Prometheus query {expr!r} failed: {body.get('error')}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def wait_for_data(base: str, history: HistoryRange, timeout: float = 90.0) -> int:
    """Wait for the first live scrape; check the backfilled history answers a query. Returns series."""
    deadline = time.monotonic() + timeout
    while not any(r["value"][1] == "1" for r in prom_query(base, 'up{job="gpulens"}')):
        if time.monotonic() > deadline:
            raise DemoError(
                f"Prometheus has not scraped the exporter after {timeout:.0f} s (see its targets page)"
            )
        time.sleep(1)
    middle = (history.min_time + history.max_time) / 2
    found = prom_query(base, 'count({__name__=~"gpu_.+"})', at=middle)
    if not found:
        raise DemoError(
            "Prometheus started but does not see the backfilled history (check logs/prometheus.log)"
        )
    return int(float(found[0]["value"][1]))


def run_report(
    options: Options, progress: Progress, ports: dict[str, int], history: HistoryRange
) -> dict[str, str]:
    """`gpulens report` against the demo's Prometheus over the simulated week (it ends where the
    history ends: the live node's first minutes would count its 8 GPUs as idle all week);
    returns the HTML and Markdown paths."""
    layout = options.layout
    cmd = [
        *Pieces(options.python).gpulens,
        "report",
        "--prometheus",
        f"http://127.0.0.1:{ports['prometheus']}",
        "--window",
        options.history,
        "--end",
        str(math.ceil(history.max_time)),
        "--step",
        options.step,
        "--out",
        str(layout.report),
        "--progress",
    ]
    run_logged(cmd, layout.log("report"), progress, "gpulens report", timeout=900)
    # report.html / summary.md by name; any other HTML / Markdown file if the names change
    html = sorted(layout.report.glob("*.html"), key=lambda p: p.name != "report.html")
    markdown = sorted(layout.report.glob("*.md"), key=lambda p: p.name != "summary.md")
    if not html or not markdown:
        raise DemoError(
            f"gpulens report finished but wrote no HTML report and Markdown summary in {layout.report}"
        )
    return {"html": str(html[0]), "markdown": str(markdown[0])}


# --------------------------------------------------------------------------------------------
# the run


def run_demo(options: Options, progress: Progress) -> State:
    """Every step in order; on failure, stop whatever this run started."""
    layout = options.layout
    state = State(started_at=datetime.now(UTC).isoformat(timespec="seconds"))
    try:
        with progress.step("checking the pieces (Prometheus, Alertmanager, gpulens commands, shipped rules)"):
            check_pieces(options)
            prepare(options, progress)
        now = time.time()
        with progress.step(
            f"simulating {options.history} of {options.history_scenario} history "
            f"(one sample every {options.step})"
        ):
            metrics = generate_history(options, progress, now)
            progress.say(f"      {metrics} ({metrics.stat().st_size / 1e6:.0f} MB)")
        with progress.step(
            "backfilling it into a Prometheus TSDB (promtool tsdb create-blocks-from openmetrics)"
        ):
            state.history = backfill(options, progress, metrics)
            progress.say(f"      {state.history.blocks} blocks, {state.history.samples:,} samples")
        ports = allocate_ports()
        state.ports = ports
        state.urls = {
            "prometheus": f"http://127.0.0.1:{ports['prometheus']}",
            "alertmanager": f"http://127.0.0.1:{ports['alertmanager']}",
            "exporter": f"http://127.0.0.1:{ports['exporter']}/metrics",
            "remediate": f"http://127.0.0.1:{ports['remediate']}",
        }
        with progress.step("starting Alertmanager (shipped config) and the remediation webhook (dry-run)"):
            state.pids["alertmanager"] = start_alertmanager(options, ports)
            state.pids["remediate"] = start_remediate(options, ports)
            state.save(layout)
        with progress.step(f"starting the exporter live on the simulated {options.live_scenario!r} node"):
            state.pids["exporter"] = start_exporter(options, ports)
            state.live_instance = live_node_name(options.live_scenario) or f"127.0.0.1:{ports['exporter']}"
            state.save(layout)
        with progress.step("starting Prometheus with the shipped rules on the backfilled TSDB"):
            state.pids["prometheus"] = start_prometheus(options, ports)
            state.save(layout)
            series = wait_for_data(state.urls["prometheus"], state.history)
            progress.say(f"      live scrapes arriving; {series:,} gpu_* series in the backfilled range")
        with progress.step(f"writing the weekly report (gpulens report --window {options.history})"):
            state.report = run_report(options, progress, ports, state.history)
            state.save(layout)
    except BaseException:
        stop_demo(layout, progress.say)
        raise
    return state


def summary(state: State, layout: Layout) -> str:
    start = datetime.fromtimestamp(state.history.min_time, UTC)
    end = datetime.fromtimestamp(state.history.max_time, UTC)
    return "\n".join(
        [
            "",
            "gpulens demo is running (everything on 127.0.0.1):",
            f"  Weekly report (HTML)   {state.report['html']}",
            f"  Summary (Markdown)     {state.report['markdown']}",
            f"  Prometheus             {state.urls['prometheus']}/graph   "
            f"(history {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC, then live)",
            f"  Alerts in Prometheus   {state.urls['prometheus']}/alerts",
            f"  Alertmanager           {state.urls['alertmanager']}   (the fault scenario fires alerts "
            "within a few minutes)",
            f"  Exporter               {state.urls['exporter']}   (node {state.live_instance!r})",
            f"  Remediation (dry-run)  {state.urls['remediate']}   (actions in {layout.log('remediate')})",
            f"  Logs, data, pid files  {layout.root}",
            "",
            "Try:  curl -s " + state.urls["exporter"] + " | grep ^gpu_xid",
            "Stop: make demo-stop   (or python -m gpulens.devtools.demo --stop)",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpulens.devtools.demo",
        description="Run the gpulens stack locally on a simulated GPU node (no GPU, no Docker).",
    )
    parser.add_argument("--stop", action="store_true", help="stop a running demo and remove its pid files")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="state directory for data, logs and pid files (default: .demo in the checkout)",
    )
    parser.add_argument(
        "--history",
        default=os.environ.get("GPULENS_DEMO_HISTORY", "7d"),
        help="length of the backfilled history (default 7d; env GPULENS_DEMO_HISTORY)",
    )
    parser.add_argument(
        "--step",
        default="",
        help="history sample step (default: at most ~2,500 points per series, 4m for 7d)",
    )
    parser.add_argument(
        "--scenario", default="typical-fleet", help="scenario of the history (default typical-fleet)"
    )
    parser.add_argument(
        "--live-scenario",
        default="faults",
        help="scenario the live exporter runs (default faults, which fires alerts)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    progress = Progress(total=7)
    try:
        repo = find_repo_root()
        layout = Layout((args.dir or repo / ".demo").resolve())
        if args.stop:
            stopped = stop_demo(layout, progress.say)
            progress.say(
                f"gpulens demo stopped ({', '.join(stopped)})"
                if stopped
                else f"no gpulens demo was running in {layout.root}"
            )
            return 0
        history_s = parse_duration(args.history)
        step = args.step or default_step(history_s)
        parse_duration(step)
        options = Options(
            layout=layout,
            repo=repo,
            history=args.history,
            step=step,
            history_scenario=args.scenario,
            live_scenario=args.live_scenario,
        )
        layout.root.mkdir(parents=True, exist_ok=True)
        state = run_demo(options, progress)
        state.save(layout)
        progress.say(summary(state, layout))
        return 0
    except DemoError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. a state directory that cannot be written
        print(f"demo: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: interrupted; stopped what it had started", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
