"""`python -m gpulens.devtools.demo` end to end, as `make demo` runs it, with one day of history.

One demo run (module fixture) in a tmp state directory; the tests then look at what a user would:
the report files, the backfilled history and the live scrapes in the Prometheus it started, the
Alertmanager it started, and that `--stop` leaves no process behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import PromAPI, find_binary

pytestmark = pytest.mark.slow

HISTORY = "1d"
STEP = "4m"  # 360 simulated steps: the whole demo runs in well under a minute


def demo_cmd(state_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens.devtools.demo", "--dir", str(state_dir), *args]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any], str]]:
    for binary in ("promtool", "prometheus"):
        find_binary(binary)
    find_binary("prometheus-alertmanager", "alertmanager")
    state_dir = tmp_path_factory.mktemp("demo")
    result = subprocess.run(
        demo_cmd(state_dir, "--history", HISTORY, "--step", STEP), capture_output=True, text=True, timeout=600
    )
    try:
        assert result.returncode == 0, f"demo failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        state = json.loads((state_dir / "state.json").read_text())
        yield state_dir, state, result.stdout
    finally:
        subprocess.run(demo_cmd(state_dir, "--stop"), capture_output=True, timeout=120)


def test_the_demo_prints_where_the_report_and_the_uis_are(demo_run):
    _state_dir, state, stdout = demo_run
    for where in (
        state["report"]["html"],
        state["report"]["markdown"],
        state["urls"]["prometheus"],
        state["urls"]["alertmanager"],
    ):
        assert where in stdout


def test_the_report_exists(demo_run):
    _state_dir, state, _stdout = demo_run
    html = Path(state["report"]["html"])
    markdown = Path(state["report"]["markdown"])
    assert html.stat().st_size > 1000 and "<html" in html.read_text(errors="replace").lower()
    assert markdown.stat().st_size > 100


def test_prometheus_has_the_backfilled_history(demo_run):
    _state_dir, state, _stdout = demo_run
    api = PromAPI(state["urls"]["prometheus"])
    start, end = state["history"]["min_time"], state["history"]["max_time"]
    assert end - start >= 0.9 * 86400
    for at in (start + 3600, (start + end) / 2, end - 3600):
        found = api.query("count(gpu_memory_used_bytes)", time_s=at)
        assert found and float(found[0]["value"][1]) >= 8, f"no backfilled sample at {at}"


def test_prometheus_scrapes_the_live_exporter(demo_run):
    _state_dir, state, _stdout = demo_run
    api = PromAPI(state["urls"]["prometheus"])
    from gpulens.sim.scenariofile import load_scenario

    node = state["live_instance"]
    assert node == load_scenario("faults").hostname  # named like a node, not 127.0.0.1:port
    assert api.wait_for(f'up{{job="gpulens", instance="{node}"}} == 1', timeout=30)
    assert api.wait_for(f'count(gpu_up{{instance="{node}"}}) > 0', timeout=30)


def test_prometheus_loaded_the_shipped_rules_and_alertmanager_is_up(demo_run):
    _state_dir, state, _stdout = demo_run
    api = PromAPI(state["urls"]["prometheus"])
    groups = api.get("/api/v1/rules")["groups"]
    files = {Path(g["file"]).name for g in groups}
    assert {"recording_rules.yml", "gpu_alerts.yml"} <= files
    with urllib.request.urlopen(f"{state['urls']['alertmanager']}/-/ready", timeout=5) as response:
        assert response.status == 200
    assert api.get("/api/v1/alertmanagers")["activeAlertmanagers"]


def test_a_fault_alert_reaches_alertmanager_and_the_dry_run_webhook(demo_run):
    # the faults node loses a GPU (Xid 79) 15 s into its timeline: the shipped rules fire, the
    # shipped Alertmanager routes it to the webhook with the demo's port and token, and the
    # webhook logs the drain it would do for that node
    state_dir, state, _stdout = demo_run
    node = state["live_instance"]
    log = state_dir / "logs" / "remediate.log"
    deadline = time.monotonic() + 150
    alerts: list[dict] = []
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{state['urls']['alertmanager']}/api/v2/alerts", timeout=5) as response:
            alerts = json.load(response)
        if any(a["labels"].get("instance") == node for a in alerts) and f"NodeName={node}" in log.read_text():
            break
        time.sleep(2)
    assert any(
        a["labels"].get("instance") == node and a["labels"]["alertname"].startswith("GPU") for a in alerts
    )
    actions = [line for line in log.read_text().splitlines() if "DRY-RUN" in line]
    assert actions and all(f"NodeName={node}" in line for line in actions), log.read_text()[-2000:]


def test_pid_files_record_every_daemon_it_started(demo_run):
    state_dir, state, _stdout = demo_run
    # the pid files of the run are there and name live processes
    pids = {p.stem: int(p.read_text().split()[0]) for p in (state_dir / "run").glob("*.pid")}
    assert set(pids) == {"prometheus", "alertmanager", "exporter", "remediate"}
    assert pids == state["pids"]
    assert all(alive(pid) for pid in pids.values())


def test_stop_leaves_no_process_and_no_pid_file(demo_run):
    state_dir, state, _stdout = demo_run
    result = subprocess.run(demo_cmd(state_dir, "--stop"), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in state["pids"].values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, pid in state["pids"].items() if alive(pid)]
    assert not list((state_dir / "run").glob("*.pid"))
    again = subprocess.run(demo_cmd(state_dir, "--stop"), capture_output=True, text=True, timeout=60)
    assert "no gpulens demo was running" in again.stdout
