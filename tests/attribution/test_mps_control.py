"""Asking an MPS control daemon what its clients' servers run under: runs, parsing, cache, bounds.

The control program is the simulator's stand-in (or a small script for what a broken one does),
run for real; the clock is a fake one where the test is about the TTL or the sample's time.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Mapping, Sequence

import pytest

from gpulens.exporter.attribution.logonce import LogOnce
from gpulens.exporter.attribution.mps_control import (
    ControlError,
    ControlTimeout,
    MpsControl,
    RunResult,
    parse_nspid,
    parse_percentage,
    run_bounded,
)
from gpulens.sim.mpscontrol import DaemonState

STAND_IN = (sys.executable, "-m", "gpulens.sim.mpscontrol")
PIPE = "/mps/nvidia.com/gpu/pipe"
TIMEOUT = 30.0  # generous: a Python start-up on a shared machine; bounds are tested apart


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingRunner:
    """run_bounded, counting the runs and the pipe directories they went to."""

    def __init__(self) -> None:
        self.pipes: list[str] = []

    def __call__(
        self, argv: Sequence[str], env: Mapping[str, str], stdin: bytes, timeout: float
    ) -> RunResult:
        self.pipes.append(env["CUDA_MPS_PIPE_DIRECTORY"])
        return run_bounded(argv, env, stdin, timeout)


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def control(node, command=STAND_IN, **kwargs) -> MpsControl:
    node.procfs.mkdir(parents=True, exist_ok=True)
    kwargs.setdefault("timeout_s", TIMEOUT)
    return MpsControl(command, node.procfs, LogOnce(node.logger), **kwargs)


def plugin_daemon(node, pct: float = 25.0) -> None:
    node.mps_daemon(PIPE, DaemonState(pct, {7: pct}).to_json())


def ask(mps: MpsControl, client: int = 100, servers: Sequence[int] = ()) -> float | None:
    mps.start_sample(set(servers))
    return mps.thread_ratio(client, PIPE, servers)


@pytest.mark.parametrize(
    ("text", "ratio"),
    [
        *[("33.0", 0.33), ("33", 0.33), (" 33.0 %\n", 0.33), ("100.0", 1.0)],
        *[("0", None), ("100.5", None), ("nan", None), ("inf", None), ("Server 12 not found", None)],
        ("", None),
    ],
)
def test_percentages_are_read_leniently_and_anything_else_is_unknown(text, ratio) -> None:
    assert parse_percentage(text) == (pytest.approx(ratio) if ratio is not None else None)


def test_a_servers_pid_in_the_daemons_namespace_is_the_last_nspid_field() -> None:
    status = "Name:\tnvidia-cuda-mps\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t4711\t12\t7\n"
    assert parse_nspid(status) == (7, 1000)


def test_the_one_server_a_daemon_lists_gives_its_percentage(node) -> None:
    node.mps_client(100, "0::/user.slice\n", PIPE)
    node.mps_daemon(PIPE, DaemonState(100.0, {7: 25.0}).to_json())
    assert ask(control(node)) == pytest.approx(0.25)


def test_a_daemon_without_servers_gives_its_default(node) -> None:
    node.mps_client(100, "0::/user.slice\n", PIPE)
    node.mps_daemon(PIPE, DaemonState(33.0, {}).to_json())
    assert ask(control(node)) == pytest.approx(0.33)


def test_the_pipe_directory_is_the_one_the_client_sees_through_its_root(node) -> None:
    node.mps_client(100, "0::/user.slice\n", PIPE)
    plugin_daemon(node)
    runner = CountingRunner()
    ask(control(node, runner=runner))
    assert set(runner.pipes) == {f"{node.procfs}/100/root{PIPE}"}


def test_two_clients_of_one_daemon_cost_one_exchange_per_ttl(node) -> None:
    for pid in (100, 101):
        node.mps_client(pid, "0::/user.slice\n", PIPE)
    plugin_daemon(node)
    clock, runner = Clock(), CountingRunner()
    mps = control(node, runner=runner, clock=clock, ttl_s=60.0)
    mps.start_sample(set())
    assert [mps.thread_ratio(pid, PIPE, ()) for pid in (100, 101)] == [0.25, 0.25]
    one_exchange = len(runner.pipes)  # default and servers, then the server's percentage
    clock.now += 59.0
    assert [ask(mps, pid) for pid in (100, 101)] == [0.25, 0.25]
    assert len(runner.pipes) == one_exchange
    clock.now += 2.0
    assert [ask(mps, pid) for pid in (100, 101)] == [0.25, 0.25]
    assert len(runner.pipes) == 2 * one_exchange == 4


def test_a_pipe_directory_without_a_daemon_is_unknown_and_logged_once_naming_it(node, caplog) -> None:
    node.mps_client(100, "0::/user.slice\n", PIPE)
    node.mps_daemon(PIPE, "{}")  # the stand-in then answers as a client without a daemon: exit 1
    clock = Clock()
    mps = control(node, clock=clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert ask(mps) is None
            clock.now += 61.0
    [line] = [r.getMessage() for r in caplog.records if "MPS control daemon" in r.getMessage()]
    assert f"{node.procfs}/100/root{PIPE}" in line and "exit status 1" in line
    assert "Cannot find MPS control daemon" in line


def test_a_failure_is_cached_for_the_ttl(node) -> None:
    node.mps_client(100, "0::/user.slice\n", PIPE)
    node.mps_daemon(PIPE, "{}")
    clock, runner = Clock(), CountingRunner()
    mps = control(node, runner=runner, clock=clock)
    for _ in range(3):
        assert ask(mps) is None
        clock.now += 10.0
    assert len(runner.pipes) == 1


def test_garbage_is_unknown(node, caplog) -> None:
    node.mps_client(100, "0::/user.slice\n", PIPE)
    plugin_daemon(node)
    mps = control(node, command=python("print('hello'); print('world')"))
    with caplog.at_level(logging.WARNING):
        assert ask(mps) is None
    assert any("unparsable server list" in r.getMessage() for r in caplog.records)


def test_more_than_64_kib_of_output_is_unknown(node, caplog) -> None:
    node.mps_client(100, "0::/user.slice\n", PIPE)
    plugin_daemon(node)
    mps = control(node, command=python("import sys\nwhile True: sys.stdout.write('25.0\\n' * 4096)"))
    with caplog.at_level(logging.WARNING):
        assert ask(mps) is None
    assert any("more than 64 KiB of output" in r.getMessage() for r in caplog.records)


def test_the_output_read_is_bounded_and_the_program_killed() -> None:
    endless = python("import sys\nwhile True: sys.stdout.write('x' * 65536)")
    with pytest.raises(ControlError, match="more than 64 KiB"):
        run_bounded(endless, {}, b"", TIMEOUT)


def test_a_program_that_does_not_answer_is_killed_at_the_timeout() -> None:
    with pytest.raises(ControlTimeout):
        run_bounded(python("import time; time.sleep(600)"), {}, b"", 0.2)


def test_a_missing_program_is_a_control_error_not_a_crash(tmp_path) -> None:
    with pytest.raises(ControlError, match="cannot run"):
        run_bounded((str(tmp_path / "absent"),), {}, b"", TIMEOUT)


def test_a_samples_daemons_share_one_timeout_and_the_rest_wait_for_the_next_sample(node) -> None:
    # each run "takes" 0.3 s of a 1 s timeout: the first daemon's two runs leave too little for
    # the second's, which is asked at the next sample without a failure being cached or logged
    clock = Clock()

    def slow(argv: Sequence[str], env: Mapping[str, str], stdin: bytes, timeout: float) -> RunResult:
        if timeout < 0.3:
            clock.now += timeout
            raise ControlTimeout(f"no answer within {timeout:g}s")
        clock.now += 0.3
        return run_bounded(argv, env, stdin, TIMEOUT)

    for pid, pipe in ((100, PIPE), (101, "/other/pipe")):
        node.mps_client(pid, "0::/user.slice\n", pipe)
        node.mps_daemon(pipe, DaemonState(25.0, {7: 25.0}).to_json())
    mps = control(node, runner=slow, clock=clock, timeout_s=1.0)
    mps.start_sample(set())
    assert [mps.thread_ratio(100, PIPE, ()), mps.thread_ratio(101, "/other/pipe", ())] == [0.25, None]
    mps.start_sample(set())
    assert mps.thread_ratio(101, "/other/pipe", ()) == 0.25


def test_a_client_that_exited_has_no_daemon_to_ask(node) -> None:
    runner = CountingRunner()
    assert ask(control(node, runner=runner), client=999) is None
    assert runner.pipes == []


# -- a client whose own view cannot be reached: --mps-pipe-dir --------------------------------


def refusing_roots(path: str) -> os.stat_result:
    """os.stat as the kernel's ptrace check answers an exporter without capabilities: every
    `/proc/<pid>/root` refused (tests run as root, which no mode bits refuse)."""
    if "/root/" in path:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    return os.stat(path)


def seen_by_exporter(node, pipe_dir: str = PIPE) -> str:
    """The daemon's pipe directory as the exporter sees it (the chart mounts the MPS root at the
    same path as on the host)."""
    return str(node.fs_root / pipe_dir.lstrip("/"))


def test_a_client_whose_environment_cannot_be_read_gets_the_cap_of_the_mps_pipe_dir_daemon(node) -> None:
    node.mps_client(100, "0::/user.slice\n", PIPE)
    plugin_daemon(node, pct=25.0)
    runner = CountingRunner()
    mps = control(node, runner=runner, fallback_pipe_dir=seen_by_exporter(node))
    mps.start_sample(set())
    assert mps.thread_ratio(100, None, ()) == pytest.approx(0.25)
    assert set(runner.pipes) == {seen_by_exporter(node)}


def test_a_client_whose_root_is_refused_gets_the_cap_of_the_mps_pipe_dir_daemon(node) -> None:
    node.mps_client(100, "0::/user.slice\n", PIPE)
    plugin_daemon(node, pct=25.0)
    runner = CountingRunner()
    mps = control(node, runner=runner, fallback_pipe_dir=seen_by_exporter(node), stat=refusing_roots)
    assert ask(mps) == pytest.approx(0.25)
    assert set(runner.pipes) == {seen_by_exporter(node)}


def test_a_refused_root_is_logged_once_naming_the_fallback_it_uses(node, caplog) -> None:
    for pid in (100, 101):
        node.mps_client(pid, "0::/user.slice\n", PIPE)
    plugin_daemon(node)
    mps = control(node, fallback_pipe_dir=seen_by_exporter(node), stat=refusing_roots)
    with caplog.at_level(logging.INFO):
        assert [ask(mps, pid) for pid in (100, 101)] == [0.25, 0.25]
    [line] = [r.getMessage() for r in caplog.records if "pipe directory" in r.getMessage()]
    assert f"{node.procfs}/100/root{PIPE}: permission denied" in line
    assert f"--mps-pipe-dir {seen_by_exporter(node)}" in line


def test_clients_reached_through_their_own_view_and_the_fallback_share_one_exchange(node) -> None:
    for pid in (100, 101):
        node.mps_client(pid, "0::/user.slice\n", PIPE)
    plugin_daemon(node)
    runner = CountingRunner()
    mps = control(node, runner=runner, fallback_pipe_dir=seen_by_exporter(node))
    mps.start_sample(set())
    assert [mps.thread_ratio(100, PIPE, ()), mps.thread_ratio(101, None, ())] == [0.25, 0.25]
    assert len(runner.pipes) == 2  # one exchange: default and servers, then the server's percentage


def test_without_mps_pipe_dir_unreachable_clients_are_unknown_with_one_warning(node, caplog) -> None:
    for pid in (100, 101):
        node.mps_client(pid, "0::/user.slice\n", PIPE)
    plugin_daemon(node)
    clock, runner = Clock(), CountingRunner()
    mps = control(node, runner=runner, clock=clock, stat=refusing_roots)
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            mps.start_sample(set())
            assert [mps.thread_ratio(100, PIPE, ()), mps.thread_ratio(101, None, ())] == [None, None]
            clock.now += 61.0
    [line] = [r.getMessage() for r in caplog.records if "pipe directory" in r.getMessage()]
    assert "--mps-pipe-dir is unset" in line
    assert runner.pipes == []


def test_an_mps_pipe_dir_without_a_directory_is_unknown_and_logged_once_naming_the_flag(node, caplog) -> None:
    node.mps_client(100, "0::/user.slice\n", PIPE)
    absent = str(node.root / "no-mps-here")
    mps = control(node, fallback_pipe_dir=absent)
    with caplog.at_level(logging.WARNING):
        for pid in (100, 101):
            mps.start_sample(set())
            assert mps.thread_ratio(pid, None, ()) is None
    [line] = [r.getMessage() for r in caplog.records if "--mps-pipe-dir" in r.getMessage()]
    assert absent in line and "No such file or directory" in line
