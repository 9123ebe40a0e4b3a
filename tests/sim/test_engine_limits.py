"""What a GPU lets a process have: an MPS client's thread cap and a memory limit (OOM, restart)."""

from __future__ import annotations

from typing import Any

import pytest

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.restarts import backoff
from gpulens.sim.scenario import RESTART_PID_BASE, ScenarioError
from gpulens.sim.scenariofile import parse_scenario

T0 = 1_750_000_000.0


def _mps(client: dict[str, Any]) -> dict[str, Any]:
    base = {"pid": 200, "gpu": 0, "kind": "mps_client", "workload": {"pattern": "constant", "memory": "4GiB"}}
    return {"gpus": [{"model": "A100-80GB", "mps": {"server_pid": 100}}], "processes": [{**base, **client}]}


def _node(data: dict[str, Any], tmp_path=None):
    clock = ManualClock(T0)
    node = build_node(parse_scenario(data, "t.yaml"), clock=clock, procfs_root=tmp_path)
    return node, clock


def _client_sm(data: dict[str, Any], at: float = 600.0) -> tuple[float, int]:
    node, clock = _node(data)
    clock.set(T0 + at)
    state = node.gpu_state(0)
    return state.activity.sm, state.mps_clients[0].sm_util_percent


def test_an_mps_client_whose_demand_exceeds_its_thread_cap_runs_at_the_cap():
    workload = {"pattern": "constant", "memory": "4GiB", "sm": 0.5, "busy": 0.55}
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20"}
    sm, busy = _client_sm(_mps({"environ": env, "workload": workload}))
    assert sm == pytest.approx(0.2)
    assert busy == 100  # the same work at a fifth of the SMs keeps kernels running all the time


def test_an_mps_client_whose_kernels_fit_its_cap_runs_as_without_one():
    # kernels half the time on a fifth of the SMs: never wider than the 50 % cap
    workload = {"pattern": "constant", "memory": "4GiB", "sm": 0.1, "busy": 0.5}
    capped = _client_sm(_mps({"environ": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}, "workload": workload}))
    assert capped == _client_sm(_mps({"workload": workload}))


def test_an_mps_client_with_kernels_wider_than_its_cap_does_the_same_work_for_longer():
    # kernels 15 % of the time on two thirds of the SMs; a 50 % cap makes them narrower and longer
    workload = {"pattern": "constant", "memory": "4GiB", "sm": 0.1, "busy": 0.15}
    sm, busy = _client_sm(
        _mps({"environ": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}, "workload": workload})
    )
    free_sm, free_busy = _client_sm(_mps({"workload": workload}))
    assert sm == pytest.approx(free_sm, abs=0.01) and busy > free_busy
    assert sm <= busy / 100 * 0.5 + 0.01  # never wider than the cap while it runs


def test_a_thread_percentage_outside_mps_is_ignored_as_cuda_ignores_it():
    data = {
        "gpus": [{"model": "A100-80GB"}],
        "processes": [
            {
                "pid": 200,
                "gpu": 0,
                "environ": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10"},
                "workload": {"pattern": "constant", "memory": "4GiB", "sm": 0.5},
            }
        ],
    }
    node, clock = _node(data)
    clock.set(T0 + 600)
    assert node.gpu_state(0).activity.sm > 0.4


def _leaky(limit: str, over: str = "1h") -> dict[str, Any]:
    workload = {"pattern": "growing", "memory": "10GiB", "memory_start": "2GiB", "over": over}
    return {
        "gpus": [{"model": "A100-80GB"}],
        "processes": [
            {
                "pid": 300,
                "gpu": 0,
                "memory_limit": limit,
                "job": {"kubernetes": {"namespace": "ml", "pod": "leaky-0"}},
                "workload": workload,
            }
        ],
    }


def _procs(node, clock, at: float) -> list[tuple[int, float, int]]:
    clock.set(T0 + at)
    return [(p.pid, p.start_time - T0, p.used_memory_bytes) for p in node.gpu_state(0).processes]


def test_a_process_past_its_memory_limit_fails_and_restarts_with_a_new_pid(tmp_path):
    node, clock = _node(_leaky("6GiB"), tmp_path)  # 2 -> 10 GiB over 1 h: passes 6 GiB at 30 min
    assert [pid for pid, _, _ in _procs(node, clock, 1790)] == [300]
    assert _procs(node, clock, 1805) == []  # failed: the kubelet waits 10 s
    ((pid, start, memory),) = _procs(node, clock, 1815)
    assert pid == RESTART_PID_BASE and start == pytest.approx(1810.0)
    assert memory < 3 * 1024**3  # a new process: its memory climbs again from the start
    assert "leaky-0" in (tmp_path / str(pid) / "environ").read_text()  # the same pod


def test_a_restarted_container_gets_a_new_container_id(tmp_path):
    node, clock = _node(_leaky("6GiB"), tmp_path)
    clock.set(T0 + 10)
    node.gpu_state(0)
    before = (tmp_path / "300" / "cgroup").read_text()
    clock.set(T0 + 1815)
    node.gpu_state(0)
    after = (tmp_path / str(RESTART_PID_BASE) / "cgroup").read_text()
    assert before != after and before.split("cri-containerd-")[0] == after.split("cri-containerd-")[0]


def test_short_runs_back_off_as_the_kubelet_does():
    assert [backoff(n, 60.0) for n in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]
    assert backoff(5, 600.0) == 10  # a run of 10 minutes resets the back-off


def test_restarts_follow_the_back_off():
    node, clock = _node(_leaky("6GiB", over="2m"))  # passes 6 GiB just after 60 s: runs of ~60 s
    starts = [60 + 10, 70 + 60 + 20, 150 + 60 + 40]
    for n, start in enumerate(starts):
        ((pid, begun, _),) = _procs(node, clock, start + 1)
        assert pid == RESTART_PID_BASE + n and begun == pytest.approx(start, abs=0.01)


def test_a_pinned_memory_limit_restarts_an_mps_client():
    workload = {"pattern": "growing", "memory": "10GiB", "memory_start": "2GiB", "over": "1h"}
    data = _mps({"environ": {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6G"}, "workload": workload})
    node, clock = _node(data)
    clock.set(T0 + 1815)
    assert [c.pid for c in node.gpu_state(0).mps_clients] == [RESTART_PID_BASE]


def test_the_daemons_pinned_memory_limit_restarts_an_mps_client_without_one_of_its_own():
    # the device plugin's daemon on an A100-80GB with four replicas: 20480 MiB a client
    workload = {"pattern": "growing", "memory": "30GiB", "memory_start": "10GiB", "over": "1h"}
    data = _mps({"workload": workload})  # 10 -> 30 GiB over 1 h: passes 20 GiB at 30 min
    data["gpus"][0]["mps"].update(active_thread_percentage=25, pinned_memory_limit="20480MiB")
    node, clock = _node(data)
    clock.set(T0 + 1790)
    assert [c.pid for c in node.gpu_state(0).mps_clients] == [200]
    clock.set(T0 + 1815)
    assert [c.pid for c in node.gpu_state(0).mps_clients] == [RESTART_PID_BASE]


@pytest.mark.parametrize(
    ("client", "message"),
    [
        (
            {"environ": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "150"}},
            "t.yaml: processes[0].environ.CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: "
            "expected a percentage above 0, at most 100, found '150'",
        ),
        (
            {"environ": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "lots"}},
            "t.yaml: processes[0].environ.CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: "
            "expected a percentage above 0, at most 100, found 'lots'",
        ),
        (
            {"environ": {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "20G"}},
            "t.yaml: processes[0].environ.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: expected device limits like "
            "'0=20G' or '0=20480M,1=8G' (device 0: the process's GPU), found '20G'",
        ),
        (
            {"memory_limit": 0},
            "t.yaml: processes[0].memory_limit: expected a size above 0, found 0",
        ),
        (
            {"memory_limit": "1GiB", "pid": RESTART_PID_BASE + 5},
            f"t.yaml: processes[0].pid: expected a pid below {RESTART_PID_BASE} "
            f"(restarted processes take the pids above), found {RESTART_PID_BASE + 5}",
        ),
    ],
)
def test_bad_limits_get_one_line_errors(client, message):
    with pytest.raises(ScenarioError) as error:
        parse_scenario(_mps(client), "t.yaml")
    assert str(error.value) == message


def test_pinned_limits_name_devices_in_binary_units():
    data = _mps({"environ": {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=2G,0=512M"}})
    assert parse_scenario(data, "t.yaml").processes[0].memory_limit_bytes == 512 * 1024**2
