"""MPS clients' thread caps from their control daemon, as the attributor applies them.

The daemon is the simulator's stand-in control program behind a temp pipe directory that the
clients see through `/proc/<pid>/root` (the device plugin's layout: a host directory mounted at
`/mps/nvidia.com/gpu/pipe` in the pod). NVML (the process list) is stood in for by `ProcessRef`s.
"""

from __future__ import annotations

import logging
import sys

import pytest

from gpulens.exporter.attribution import ProcessRef
from gpulens.sim.mpscontrol import DaemonState
from tests.attribution.fakes import by_job, proc, slurm_v2

MPS_CONTROL = (sys.executable, "-m", "gpulens.sim.mpscontrol")
PIPE = "/mps/nvidia.com/gpu/pipe"
SERVER = 50  # host pid of the MPS server NVML lists on GPU 0
# generous: the stand-in is a Python start-up on a shared machine (the bound is tested in
# test_mps_control.py)
TIMEOUT = 30.0


def attributor(node, command=MPS_CONTROL):
    return node.attributor(mps_control=command, mps_control_timeout_seconds=TIMEOUT)


def plugin_daemon(node, pct: float = 25.0, pipe_dir: str = PIPE) -> None:
    """The device plugin's daemon: `set_default_active_thread_percentage 100/replicas`, one server."""
    node.mps_daemon(pipe_dir, DaemonState(pct, {7: pct}).to_json())
    node.mps_server(SERVER, nspid=7)


def busy_beside_lighter(
    node, busy_env: dict[str, str] | None = None, pipe_dir: str | None = PIPE
) -> list[ProcessRef]:
    """Job 1's client busy all the time, job 2's a fifth of it, neither with a cap of its own
    unless `busy_env` gives one."""
    node.mps_client(100, slurm_v2("1"), pipe_dir, busy_env)
    node.mps_client(101, slurm_v2("2"), pipe_dir)
    return [
        proc(SERVER, kind="mps_server"),
        proc(100, sm=1.0, kind="mps_client"),
        proc(101, sm=0.2, kind="mps_client"),
    ]


def sample(attr, procs, activity: float = 0.32):
    # SM activity a little above what 25 % caps allow (0.25 + 0.2 x 0.25): its window is not NVML's
    return by_job(attr.attribute(procs, {(0, None): activity}, {0: 1.0}, {0}))


def test_a_client_under_a_25_percent_daemon_busy_beside_a_lighter_one_gets_at_most_a_quarter(node):
    plugin_daemon(node)
    usages = sample(attributor(node), busy_beside_lighter(node))
    assert usages[(0, None, "1")].sm_utilization_ratio == pytest.approx(0.25)


def test_without_the_daemons_answer_the_same_client_is_split_by_time_above_its_cap(node):
    # why the daemon is asked: 0.32 x 1 / 1.2
    plugin_daemon(node)
    usages = sample(attributor(node, command=()), busy_beside_lighter(node))
    assert usages[(0, None, "1")].sm_utilization_ratio == pytest.approx(0.32 / 1.2)


def test_each_client_publishes_the_daemons_default_as_its_cap(node):
    plugin_daemon(node)
    usages = sample(attributor(node), busy_beside_lighter(node))
    assert [usages[(0, None, job)].mps_thread_ratio for job in ("1", "2")] == [0.25, 0.25]


def test_a_clients_own_percentage_tighter_than_the_daemons_wins(node):
    plugin_daemon(node)
    procs = busy_beside_lighter(node, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10"})
    assert sample(attributor(node), procs)[(0, None, "1")].mps_thread_ratio == pytest.approx(0.1)


def test_a_clients_own_percentage_looser_than_the_daemons_does_not_loosen_it(node):
    plugin_daemon(node)
    procs = busy_beside_lighter(node, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"})
    assert sample(attributor(node), procs)[(0, None, "1")].mps_thread_ratio == pytest.approx(0.25)


def test_a_client_known_to_run_at_100_percent_publishes_a_cap_of_one(node):
    plugin_daemon(node, pct=100.0)
    usages = sample(attributor(node), busy_beside_lighter(node))
    assert usages[(0, None, "1")].mps_thread_ratio == 1.0


def test_a_client_without_a_pipe_directory_asks_the_default_one(node):
    plugin_daemon(node, pipe_dir="/tmp/nvidia-mps")  # Slurm's daemon, started without one
    usages = sample(attributor(node), busy_beside_lighter(node, pipe_dir=None))
    assert usages[(0, None, "1")].mps_thread_ratio == pytest.approx(0.25)


def test_with_several_servers_each_client_gets_the_one_nvml_lists_on_its_gpu_by_nspid(node):
    # the daemon runs in a pod: it knows its servers as 7 and 8, the host as 50 and 51
    node.mps_daemon(PIPE, DaemonState(100.0, {7: 25.0, 8: 50.0}).to_json())
    node.mps_server(50, nspid=7)
    node.mps_server(51, nspid=8)
    node.mps_client(100, slurm_v2("1"), PIPE)
    node.mps_client(101, slurm_v2("2"), PIPE)
    procs = [
        proc(50, gpu=0, kind="mps_server"),
        proc(51, gpu=1, kind="mps_server"),
        proc(100, gpu=0, sm=0.5, kind="mps_client"),
        proc(101, gpu=1, sm=0.5, kind="mps_client"),
    ]
    usages = by_job(attributor(node).attribute(procs))
    assert usages[(0, None, "1")].mps_thread_ratio == 0.25
    assert usages[(1, None, "2")].mps_thread_ratio == 0.5


def test_with_several_servers_none_on_the_clients_gpu_the_daemons_default_applies(node):
    node.mps_daemon(PIPE, DaemonState(40.0, {7: 25.0, 8: 50.0}).to_json())
    node.mps_client(100, slurm_v2("1"), PIPE)
    [usage] = attributor(node).attribute([proc(100, sm=0.5, kind="mps_client")])
    assert usage.mps_thread_ratio == pytest.approx(0.4)


def test_a_missing_control_program_leaves_caps_unknown_with_one_warning_and_the_sample_unchanged(
    node, caplog
):
    plugin_daemon(node)
    node.mps_daemon("/other/pipe", DaemonState(50.0, {}).to_json())  # a second daemon: still one line
    procs = busy_beside_lighter(node)
    node.mps_client(102, slurm_v2("3"), "/other/pipe")
    procs.append(proc(102, sm=0.1, kind="mps_client"))
    unasked = sample(attributor(node, command=()), procs)
    missing = attributor(node, command=(str(node.root / "no-such-program"),))
    with caplog.at_level(logging.WARNING):
        samples = [sample(missing, procs) for _ in range(2)]
    assert samples == [unasked, unasked]
    lines = [r.getMessage() for r in caplog.records if "MPS control daemon" in r.getMessage()]
    assert len(lines) == 1 and "no-such-program" in lines[0], lines


def fallback(node, pipe_dir: str = PIPE) -> str:
    """`--mps-pipe-dir`: the daemon's pipe directory as the exporter sees it."""
    return str(node.fs_root / pipe_dir.lstrip("/"))


def test_a_client_whose_environment_cannot_be_read_gets_the_cap_of_the_mps_pipe_dir_daemon(node):
    plugin_daemon(node)
    procs = busy_beside_lighter(node)
    node.refuse_environ(100)
    attr = node.attributor(
        mps_control=MPS_CONTROL, mps_control_timeout_seconds=TIMEOUT, mps_pipe_dir=fallback(node)
    )
    assert sample(attr, procs)[(0, None, "1")].mps_thread_ratio == pytest.approx(0.25)


def test_a_client_whose_environment_cannot_be_read_has_no_cap_without_mps_pipe_dir(node):
    plugin_daemon(node)
    procs = busy_beside_lighter(node)
    node.refuse_environ(100)
    assert sample(attributor(node), procs)[(0, None, "1")].mps_thread_ratio is None


def test_a_readable_environment_without_a_pipe_directory_means_the_default_not_the_fallback(node):
    plugin_daemon(node, pct=25.0, pipe_dir="/tmp/nvidia-mps")  # the client's own default daemon
    node.mps_daemon(PIPE, DaemonState(50.0, {}).to_json())  # another one, --mps-pipe-dir's
    attr = node.attributor(
        mps_control=MPS_CONTROL, mps_control_timeout_seconds=TIMEOUT, mps_pipe_dir=fallback(node)
    )
    usages = sample(attr, busy_beside_lighter(node, pipe_dir=None))
    assert usages[(0, None, "1")].mps_thread_ratio == pytest.approx(0.25)


def test_a_client_without_a_procfs_entry_is_not_given_the_fallbacks_cap(node):
    plugin_daemon(node)
    attr = node.attributor(
        mps_control=MPS_CONTROL, mps_control_timeout_seconds=TIMEOUT, mps_pipe_dir=fallback(node)
    )
    usages = attr.attribute([proc(SERVER, kind="mps_server"), proc(999, sm=0.5, kind="mps_client")])
    assert [u.mps_thread_ratio for u in usages] == [None, None]
