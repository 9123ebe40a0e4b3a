"""The simulated MPS control daemon: the percentage clients run under, its files, its control client."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpulens.sim import mpscontrol
from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.scenario import ScenarioError
from gpulens.sim.scenariofile import parse_scenario

T0 = 1_750_000_000.0
GIB = 1024**3
PLUGIN_PIPE = "/mps/nvidia.com/gpu/pipe"  # the device plugin's pipe directory inside a pod


def _scenario(mps: dict[str, Any] | None = None, environ: dict[str, str] | None = None, **workload: Any):
    client: dict[str, Any] = {
        "pid": 200,
        "gpu": 0,
        "kind": "mps_client",
        "workload": {"pattern": "constant", "memory": "4GiB", **workload},
    }
    if environ is not None:
        client["environ"] = environ
    return {
        "gpus": [{"model": "A100-80GB", "mps": {"server_pid": 100, **(mps or {})}}],
        "processes": [client],
    }


def _client_cap(mps: dict[str, Any], environ: dict[str, str] | None = None) -> float | None:
    return parse_scenario(_scenario(mps, environ), "t.yaml").processes[0].sm_cap


def _client_limit(mps: dict[str, Any], environ: dict[str, str] | None = None, **client: Any) -> int | None:
    data = _scenario(mps, environ)
    data["processes"][0].update(client)
    return parse_scenario(data, "t.yaml").processes[0].memory_limit_bytes


# -- the stand-in control client ------------------------------------------------------------------


def _control(pipe_dir: Path, commands: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)}
    return subprocess.run(
        mpscontrol.client_argv(),  # what the exporter is given as --mps-control
        input=commands,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def daemon_dir(tmp_path: Path) -> Path:
    state = mpscontrol.DaemonState(default_active_thread_percentage=25.0, servers={4100: 25.0, 4200: 50.0})
    (tmp_path / mpscontrol.STATE_FILE).write_text(state.to_json())
    return tmp_path


def test_the_control_client_lists_the_daemons_servers(daemon_dir: Path) -> None:
    result = _control(daemon_dir, "get_server_list\n")
    assert (result.returncode, result.stdout) == (0, "4100\n4200\n")


def test_the_control_client_prints_the_daemons_default_percentage(daemon_dir: Path) -> None:
    assert _control(daemon_dir, "get_default_active_thread_percentage\n").stdout == "25.0\n"


def test_the_control_client_prints_a_servers_percentage(daemon_dir: Path) -> None:
    assert _control(daemon_dir, "get_active_thread_percentage 4200\n").stdout == "50.0\n"


def test_the_control_client_answers_commands_in_order(daemon_dir: Path) -> None:
    commands = "get_active_thread_percentage 4100\nget_active_thread_percentage 4200\n"
    assert _control(daemon_dir, commands).stdout == "25.0\n50.0\n"


def test_the_control_client_names_a_server_the_daemon_does_not_know(daemon_dir: Path) -> None:
    assert _control(daemon_dir, "get_active_thread_percentage 7\n").stdout == "Server 7 not found\n"


def test_the_control_client_without_a_daemon_fails_on_stderr(tmp_path: Path) -> None:
    result = _control(tmp_path, "get_server_list\n")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"Cannot find MPS control daemon process (pipe directory {tmp_path})\n"


def test_the_control_client_command_line_quotes_the_program_for_a_shell() -> None:
    assert shlex.split(mpscontrol.client_command()) == list(mpscontrol.client_argv())


# -- the scenario keys ------------------------------------------------------------------------------


def test_an_mps_gpu_defaults_to_mps_own_daemon_settings() -> None:
    mps = parse_scenario(_scenario(), "t.yaml").gpus[0].mps
    assert mps is not None and (mps.active_thread_percentage, mps.pipe_dir) == (100.0, "/tmp/nvidia-mps")
    assert mps.pinned_memory_limit is None


@pytest.mark.parametrize("raw", ["20GiB", "20480MiB", 20 * GIB])
def test_a_daemons_pinned_memory_limit_is_a_size_or_bytes(raw: Any) -> None:
    mps = parse_scenario(_scenario({"pinned_memory_limit": raw}), "t.yaml").gpus[0].mps
    assert mps is not None and mps.pinned_memory_limit == 20 * GIB


@pytest.mark.parametrize(
    ("mps", "message"),
    [
        (
            {"active_thread_percentage": 0},
            "t.yaml: gpus[0].mps.active_thread_percentage: expected a percentage above 0, at most 100, "
            "found 0",
        ),
        (
            {"active_thread_percentage": 150},
            "t.yaml: gpus[0].mps.active_thread_percentage: expected a percentage above 0, at most 100, "
            "found 150",
        ),
        (
            {"active_thread_percentage": "25%"},
            "t.yaml: gpus[0].mps.active_thread_percentage: expected a percentage above 0, at most 100, "
            "found '25%'",
        ),
        (
            {"active_thread_percentage": True},
            "t.yaml: gpus[0].mps.active_thread_percentage: expected a percentage above 0, at most 100, "
            "found boolean true",
        ),
        (
            {"pinned_memory_limit": 0},
            "t.yaml: gpus[0].mps.pinned_memory_limit: expected a size above 0 in whole MiB, like 20480MiB "
            "or 20GiB, found 0",
        ),
        (
            {"pinned_memory_limit": "1.5MiB"},
            "t.yaml: gpus[0].mps.pinned_memory_limit: expected a size above 0 in whole MiB, like 20480MiB "
            "or 20GiB, found '1.5MiB'",
        ),
        (
            {"pinned_memory_limit": "lots"},
            "t.yaml: gpus[0].mps.pinned_memory_limit: expected a size like 512MiB, 10GiB or a number of "
            "bytes, found 'lots'",
        ),
        (
            {"pipe_dir": "mps/pipe"},
            "t.yaml: gpus[0].mps.pipe_dir: expected an absolute directory like /tmp/nvidia-mps "
            "(at most 256 characters, no . or ..), found 'mps/pipe'",
        ),
        (
            {"pipe_dir": "/mps/../etc"},
            "t.yaml: gpus[0].mps.pipe_dir: expected an absolute directory like /tmp/nvidia-mps "
            "(at most 256 characters, no . or ..), found '/mps/../etc'",
        ),
        (
            {"pipe_dir": "/mps/pipe/"},
            "t.yaml: gpus[0].mps.pipe_dir: expected an absolute directory like /tmp/nvidia-mps "
            "(at most 256 characters, no . or ..), found '/mps/pipe/'",
        ),
        (
            {"pipe_dir": "/" + "p" * 256},
            "t.yaml: gpus[0].mps.pipe_dir: expected an absolute directory like /tmp/nvidia-mps "
            f"(at most 256 characters, no . or ..), found '/{'p' * 256}'",
        ),
    ],
)
def test_bad_daemon_settings_get_one_line_errors(mps: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as error:
        parse_scenario(_scenario(mps), "t.yaml")
    assert str(error.value) == message


def test_a_client_naming_another_pipe_directory_gets_a_one_line_error() -> None:
    with pytest.raises(ScenarioError) as error:
        parse_scenario(_scenario({"pipe_dir": PLUGIN_PIPE}, {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/x"}), "t.yaml")
    assert str(error.value) == (
        "t.yaml: processes[0].environ.CUDA_MPS_PIPE_DIRECTORY: expected /mps/nvidia.com/gpu/pipe "
        "(GPU 0's mps.pipe_dir) or nothing, found '/tmp/x'"
    )


# -- the cap a client runs under ----------------------------------------------------------------------


def test_a_client_without_the_variable_runs_under_the_daemons_percentage() -> None:
    assert _client_cap({"active_thread_percentage": 25}) == pytest.approx(0.25)


def test_a_clients_variable_below_the_daemons_percentage_lowers_its_cap() -> None:
    assert _client_cap({"active_thread_percentage": 50}, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20"}) == (
        pytest.approx(0.2)
    )


def test_a_clients_variable_above_the_daemons_percentage_does_not_raise_its_cap() -> None:
    assert _client_cap({"active_thread_percentage": 25}, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "60"}) == (
        pytest.approx(0.25)
    )


def test_a_daemon_at_100_percent_leaves_a_client_without_the_variable_uncapped() -> None:
    assert _client_cap({"active_thread_percentage": 100}) is None


# -- the memory limit a client runs under ---------------------------------------------------------


def test_a_client_without_the_variable_runs_under_the_daemons_pinned_limit() -> None:
    assert _client_limit({"pinned_memory_limit": "20GiB"}) == 20 * GIB


def test_a_clients_pinned_limit_below_the_daemons_lowers_its_limit() -> None:
    limit = _client_limit({"pinned_memory_limit": "20GiB"}, {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8G"})
    assert limit == 8 * GIB


def test_a_clients_pinned_limit_above_the_daemons_does_not_raise_its_limit() -> None:
    limit = _client_limit({"pinned_memory_limit": "20GiB"}, {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=30G"})
    assert limit == 20 * GIB


def test_a_frameworks_memory_limit_below_the_daemons_holds() -> None:
    assert _client_limit({"pinned_memory_limit": "20GiB"}, memory_limit="6GiB") == 6 * GIB


def test_a_daemon_without_a_pinned_limit_leaves_a_client_without_the_variable_unlimited() -> None:
    assert _client_limit({}) is None


def test_a_client_without_the_variable_on_a_25_percent_daemon_keeps_at_most_a_quarter_of_the_sms_busy() -> (
    None
):
    data = _scenario({"active_thread_percentage": 25, "pipe_dir": PLUGIN_PIPE}, sm=0.8, busy=0.9)
    clock = ManualClock(T0)
    node = build_node(parse_scenario(data, "t.yaml"), clock=clock)
    readings = []
    for second in range(60, 600, 37):
        clock.set(T0 + second)
        readings.append(node.gpu_state(0).activity.sm)
    assert max(readings) <= 0.25 + 1e-9
    assert min(readings) == pytest.approx(0.25)  # its demand (80 % of the SMs) keeps it at the cap


# -- the files the node leaves ----------------------------------------------------------------------


def _node_files(tmp_path: Path, *faults: dict[str, Any]):
    """Two GPUs whose servers one device-plugin daemon runs (25 %), a third on the host's default."""
    gpus = [
        {
            "model": "A100-80GB",
            "mps": {"server_pid": 100, "active_thread_percentage": 25, "pipe_dir": PLUGIN_PIPE},
        },
        {
            "model": "A100-80GB",
            "mps": {"server_pid": 110, "active_thread_percentage": 25, "pipe_dir": PLUGIN_PIPE},
        },
        {"model": "A100-80GB", "mps": {"server_pid": 120}},
    ]
    clients = [
        {
            "pid": 200 + i,
            "gpu": i,
            "kind": "mps_client",
            "workload": {"pattern": "constant", "memory": "1GiB"},
        }
        for i in range(3)
    ]
    data: dict[str, Any] = {"gpus": gpus, "processes": clients}
    if faults:
        data["faults"] = {"timeline": list(faults)}
    clock = ManualClock(T0)
    node = build_node(parse_scenario(data, "t.yaml"), clock=clock, procfs_root=tmp_path / "proc")
    return node, clock


def _state(proc: Path, pipe_dir: str) -> dict[str, Any] | None:
    path = proc / ".root" / pipe_dir.lstrip("/") / mpscontrol.STATE_FILE
    return json.loads(path.read_text()) if path.exists() else None


def _environ(proc: Path, pid: int) -> dict[str, str]:
    raw = (proc / str(pid) / "environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if entry)


def test_every_process_root_links_to_the_node_root(tmp_path: Path) -> None:
    _node_files(tmp_path)
    proc = tmp_path / "proc"
    assert os.readlink(proc / "200" / "root") == "../.root"
    assert (proc / "100" / "root").resolve() == (proc / ".root").resolve()


def test_a_client_gets_its_gpus_pipe_directory(tmp_path: Path) -> None:
    _node_files(tmp_path)
    proc = tmp_path / "proc"
    assert _environ(proc, 200)["CUDA_MPS_PIPE_DIRECTORY"] == PLUGIN_PIPE
    assert _environ(proc, 202)["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"


def test_servers_sharing_a_pipe_directory_are_one_daemons_list(tmp_path: Path) -> None:
    _node_files(tmp_path)
    proc = tmp_path / "proc"
    assert _state(proc, PLUGIN_PIPE) == {
        "default_active_thread_percentage": 25.0,
        "servers": [
            {"pid": 100, "active_thread_percentage": 25.0},
            {"pid": 110, "active_thread_percentage": 25.0},
        ],
    }
    assert _state(proc, "/tmp/nvidia-mps") == {
        "default_active_thread_percentage": 100.0,
        "servers": [{"pid": 120, "active_thread_percentage": 100.0}],
    }


def test_a_daemon_whose_servers_disagree_keeps_mps_default(tmp_path: Path) -> None:
    gpus = [
        {"model": "A100-80GB", "mps": {"server_pid": 100, "active_thread_percentage": 25}},
        {"model": "A100-80GB", "mps": {"server_pid": 110, "active_thread_percentage": 50}},
    ]
    build_node(parse_scenario({"gpus": gpus}, "t.yaml"), clock=ManualClock(T0), procfs_root=tmp_path / "proc")
    state = _state(tmp_path / "proc", "/tmp/nvidia-mps")
    assert state is not None and state["default_active_thread_percentage"] == 100.0


def test_the_stand_in_answers_through_a_clients_root(tmp_path: Path) -> None:
    _node_files(tmp_path)
    result = _control(tmp_path / "proc" / "200" / f"root{PLUGIN_PIPE}", "get_active_thread_percentage 110\n")
    assert (result.returncode, result.stdout) == (0, "25.0\n")


def test_a_restarted_server_is_listed_by_its_new_pid(tmp_path: Path) -> None:
    node, clock = _node_files(tmp_path, {"at": 10, "gpu": 0, "mps_restart": "5s"})
    clock.set(T0 + 20)
    node.gpu_state(0)
    state = _state(tmp_path / "proc", PLUGIN_PIPE)
    assert state is not None and [s["pid"] for s in state["servers"]] == [101, 110]


def test_a_daemon_file_goes_while_no_server_of_its_pipe_directory_runs(tmp_path: Path) -> None:
    node, clock = _node_files(tmp_path, {"at": 10, "gpu": 2, "mps_restart": "5s"})
    clock.set(T0 + 12)
    node.gpu_state(2)
    proc = tmp_path / "proc"
    assert _state(proc, "/tmp/nvidia-mps") is None
    assert not (proc / ".root" / "tmp").exists()  # the directories made for it go too
    assert _state(proc, PLUGIN_PIPE) is not None  # the other daemon's servers still run


def test_closing_the_node_removes_only_its_own_files(tmp_path: Path) -> None:
    foreign = tmp_path / "proc" / ".root" / "tmp" / "keep"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("someone else's")
    node, _ = _node_files(tmp_path)
    node.close()
    assert sorted(str(p.relative_to(tmp_path / "proc")) for p in (tmp_path / "proc").rglob("*")) == [
        ".root",
        ".root/tmp",
        ".root/tmp/keep",
    ]


def test_status_shows_the_pid_the_daemon_knows_a_server_by(tmp_path: Path) -> None:
    _node_files(tmp_path)
    status = (tmp_path / "proc" / "100" / "status").read_text()
    assert "NSpid:\t100\n" in status


# -- the exporter, sampling the node, asks its daemon through the stand-in --------------------------

PLUGIN_SHAPED = """\
name: mps-plugin
gpus:
  - model: A100-80GB
    mps: {server_pid: 3100, active_thread_percentage: 25, pipe_dir: /mps/nvidia.com/gpu/pipe}
processes:
  - {pid: 4101, gpu: 0, kind: mps_client, job: {kubernetes: {namespace: ml, pod: embed-0}}, start: -1h,
     workload: {pattern: constant, memory: 4GiB, sm: 0.1, busy: 0.5}}
  - {pid: 4102, gpu: 0, kind: mps_client, job: {kubernetes: {namespace: ml, pod: rank-0}}, start: -1h,
     environ: {CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: "10"},
     workload: {pattern: constant, memory: 4GiB, sm: 0.1, busy: 0.5}}
"""


def test_gpulens_simulate_records_the_cap_a_device_plugin_daemon_gives_clients_without_the_variable(
    tmp_path: Path,
) -> None:
    from gpulens.analyzer.history import read_history  # deferred: pandas
    from gpulens.sim.history import simulate

    (tmp_path / "plugin.yaml").write_text(PLUGIN_SHAPED)
    simulate(str(tmp_path / "plugin.yaml"), duration_s=300, out=tmp_path / "h", step_s=60, seed=0)
    samples = read_history(tmp_path / "h").samples
    caps = samples[samples["metric"] == "gpu_job_mps_active_thread_ratio"]
    assert {job: set(group["value"]) for job, group in caps.groupby("job_id")} == {
        "ml/embed-0": {0.25},  # the daemon's 100/replicas, asked through the stand-in
        "ml/rank-0": {0.1},  # its own variable, below the daemon's
    }
