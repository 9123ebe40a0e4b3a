"""The pieces of `python -m gpulens.devtools.demo` that can be checked without running the stack."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpulens.devtools import demo

REPO = Path(__file__).resolve().parents[2]


def test_durations_accept_one_number_and_one_unit():
    assert demo.parse_duration("7d") == 7 * 86400
    assert demo.parse_duration("90m") == 5400
    for bad in ("7", "1d2h", "0d", "-1d", "d", "7 days"):
        with pytest.raises(demo.DemoError, match="expected a number and one unit"):
            demo.parse_duration(bad)


@pytest.mark.parametrize("history", ["6h", "1d", "7d", "30d"])
def test_default_step_bounds_the_points_per_series_and_stays_inside_the_lookback(history):
    seconds = demo.parse_duration(history)
    step = demo.parse_duration(demo.default_step(seconds))
    assert step < 300, "instant queries look back 5 minutes for a sample"
    assert seconds / step <= 2600 or step == 240


def test_a_week_of_history_is_sampled_every_four_minutes():
    assert demo.default_step(demo.parse_duration("7d")) == "4m"


def test_history_ends_at_now_on_the_step_grid():
    now = 1_800_000_123.4
    start = demo.history_start(now, "1d", "60s")
    assert start % 60 == 0
    assert now - 60 < start + 86400 <= now


def test_webhooks_to_the_shipped_remediation_port_and_token_move_to_the_demo_ones(tmp_path):
    token = tmp_path / "token"
    config = {
        "receivers": [
            {"name": "remediate", "webhook_configs": [{"url": "http://127.0.0.1:9843/api/v1/alerts"}]},
            {
                "name": "local",
                "webhook_configs": [
                    {
                        "url": "http://localhost:9843/hook",
                        "http_config": {
                            "authorization": {"credentials_file": "/etc/gpulens/remediate.token"}
                        },
                    }
                ],
            },
            {"name": "other", "webhook_configs": [{"url": "http://example.invalid:9843/hook"}]},
        ]
    }
    moved = demo.localize_alertmanager(config, 40001, token)
    urls = [r["webhook_configs"][0]["url"] for r in moved["receivers"]]
    assert urls == [
        "http://127.0.0.1:40001/api/v1/alerts",
        "http://localhost:40001/hook",
        "http://example.invalid:9843/hook",
    ]
    assert moved["receivers"][1]["webhook_configs"][0]["http_config"]["authorization"] == {
        "credentials_file": str(token)
    }


def test_the_webhook_token_is_random_and_private(tmp_path):
    first = demo.write_token(tmp_path / "a" / "token").read_text()
    second = demo.write_token(tmp_path / "b" / "token").read_text()
    assert len(first.strip()) == 64 and first != second
    assert (tmp_path / "a" / "token").stat().st_mode & 0o077 == 0


def test_rule_files_are_the_alerts_yaml_files_with_groups(tmp_path):
    (tmp_path / "alerts").mkdir()
    (tmp_path / "alerts" / "a_rules.yml").write_text("groups: []\n")
    (tmp_path / "alerts" / "alertmanager.yml").write_text("route: {receiver: x}\nreceivers: [{name: x}]\n")
    assert demo.rule_files(tmp_path) == [tmp_path / "alerts" / "a_rules.yml"]


def test_prometheus_config_loads_the_shipped_rules_and_scrapes_the_exporter_as_job_gpulens(tmp_path):
    options = demo.Options(layout=demo.Layout(tmp_path), repo=REPO)
    ports = {"prometheus": 1, "alertmanager": 2, "exporter": 3, "remediate": 4}
    config = demo.prometheus_config(options, ports)
    assert config["rule_files"] == [str(p) for p in demo.rule_files(REPO)]
    assert {Path(p).name for p in config["rule_files"]} >= {"recording_rules.yml", "gpu_alerts.yml"}
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]}
    assert jobs["gpulens"] == ["127.0.0.1:3"]
    # the live node is named like a real one (the scenario's host name), not by its loopback address
    (exporter,) = next(j for j in config["scrape_configs"] if j["job_name"] == "gpulens")["static_configs"]
    from gpulens.sim.scenariofile import load_scenario

    assert exporter["labels"] == {"instance": load_scenario("faults").hostname}
    # GPUExporterDown watches every scrape job named *gpulens*: only the exporter's may be
    assert [name for name in jobs if "gpulens" in name] == ["gpulens"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:2"]
    yaml.safe_dump(config)  # serialisable as written to prometheus.yml


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen[bytes](
        [sys.executable, "-c", "import time; time.sleep(120)"],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )


def alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def test_stop_ends_recorded_processes_and_removes_their_pid_files(tmp_path):
    layout = demo.Layout(tmp_path)
    layout.run.mkdir()
    proc = sleeper()
    try:
        layout.pid_file("exporter").write_text(f"{proc.pid} {demo.process_start_ticks(proc.pid)}\n")
        stopped = demo.stop_demo(layout, lambda _line: None)
        proc.wait(timeout=10)
        assert stopped == ["exporter"]
        assert not list(layout.run.glob("*.pid"))
    finally:
        if alive(proc):
            os.killpg(proc.pid, signal.SIGKILL)


def test_stop_never_signals_a_process_that_reused_a_recorded_pid(tmp_path):
    layout = demo.Layout(tmp_path)
    layout.run.mkdir()
    proc = sleeper()
    try:
        layout.pid_file("prometheus").write_text(f"{proc.pid} 1\n")  # started at another time
        assert demo.stop_demo(layout, lambda _line: None) == []
        time.sleep(0.2)
        assert alive(proc)
        assert not layout.pid_file("prometheus").exists()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_stop_with_nothing_running_says_so(tmp_path, capsys):
    assert demo.main(["--stop", "--dir", str(tmp_path)]) == 0
    assert "no gpulens demo was running" in capsys.readouterr().out


def fake_repo(tmp_path: Path, alertmanager: bool = True) -> Path:
    repo = tmp_path / "repo"
    (repo / "alerts").mkdir(parents=True)
    (repo / "setup.py").write_text("")
    (repo / "alerts" / "rules.yml").write_text("groups: []\n")
    if alertmanager:
        (repo / "alerts" / "alertmanager.yml").write_text("route: {receiver: x}\nreceivers: [{name: x}]\n")
    return repo


def run_main_in(monkeypatch, repo: Path, state: Path) -> int:
    monkeypatch.setattr(demo, "find_repo_root", lambda: repo)
    return demo.main(["--dir", str(state), "--history", "1h"])


def test_a_missing_shipped_file_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    code = run_main_in(monkeypatch, fake_repo(tmp_path, alertmanager=False), tmp_path / "state")
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.splitlines() == [err]
    assert err.startswith("demo: error: the Alertmanager config is missing:") and "alertmanager.yml" in err


def test_a_missing_gpulens_command_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "require_binary", lambda *names: "/bin/true")
    monkeypatch.setattr(demo, "command_available", lambda cmd: "simulate" not in cmd)
    code = run_main_in(monkeypatch, fake_repo(tmp_path), tmp_path / "state")
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err == "demo: error: the history simulator (`gpulens simulate`) is missing: " + (
        "`gpulens simulate --help` does not run in this checkout"
    )


def test_a_bad_history_length_is_one_line(tmp_path, capsys):
    assert demo.main(["--dir", str(tmp_path), "--history", "a week"]) == 1
    assert "duration 'a week': expected a number and one unit" in capsys.readouterr().err


def test_backfilled_range_comes_from_the_block_metadata(tmp_path):
    for name, lo, hi, samples in (("a", 1000, 8_200_000, 10), ("b", 8_200_000, 9_000_000, 5)):
        (tmp_path / name).mkdir()
        meta = {"minTime": lo, "maxTime": hi, "stats": {"numSamples": samples}}
        (tmp_path / name / "meta.json").write_text(json.dumps(meta))
    assert demo.blocks_range(tmp_path) == demo.HistoryRange(
        blocks=2, min_time=1.0, max_time=9000.0, samples=15
    )


def test_no_backfilled_block_is_one_clear_error(tmp_path):
    with pytest.raises(demo.DemoError, match="promtool wrote no TSDB block under"):
        demo.blocks_range(tmp_path)


def test_an_unwritable_state_directory_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert demo.main(["--dir", str(blocker / "state"), "--history", "1h"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and err.startswith("demo: error: ") and "state" in err


def test_a_prometheus_that_does_not_answer_is_a_demo_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(demo.DemoError, match="did not answer the query"):
        demo.prom_query(f"http://127.0.0.1:{port}", "up")
