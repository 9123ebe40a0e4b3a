"""Every built-in scenario loads, builds and shows what its description promises."""

from __future__ import annotations

import statistics

import pytest

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.scenario import KubernetesJob, SlurmJob
from gpulens.sim.scenariofile import list_builtin, load_scenario

T0 = 1_750_000_000.0
GIB = 1024**3


def test_the_builtin_scenarios_are_listed() -> None:
    assert {"dgx-h100", "k8s-a100-mixed", "seed-case", "faults", "large"} <= set(list_builtin())


@pytest.mark.parametrize("name", list_builtin())
def test_each_builtin_scenario_loads_and_builds(name: str) -> None:
    scenario = load_scenario(name)
    node = build_node(scenario, clock=ManualClock(T0))
    states = [node.gpu_state(i) for i in range(len(node.identities))]
    assert scenario.name == name and scenario.description
    for state in states:
        assert 0 < state.memory_used_bytes <= state.memory_total_bytes
        assert state.power_mw > 0 and state.energy_mj > 0


def test_seed_case_is_four_small_training_jobs_on_a100_40gb() -> None:
    clock = ManualClock(T0)
    node = build_node(load_scenario("seed-case"), clock=clock)
    assert [i.model.key for i in node.identities] == ["A100-SXM4-40GB"] * 4
    sm: list[float] = []
    for _ in range(120):
        clock.advance(5)
        sm.extend(node.activity_between(i, None, clock.now() - 5, clock.now()).sm for i in range(4))
    for i in range(4):
        (proc,) = node.gpu_state(i).processes
        assert proc.used_memory_bytes is not None and 9 * GIB <= proc.used_memory_bytes <= 11 * GIB
    assert 0.18 <= statistics.mean(sm) <= 0.32
    assert {p.job.job_id for p in node.scenario.processes if isinstance(p.job, SlurmJob)} == {
        "880101",
        "880102",
        "880103",
        "880104",
    }


def test_k8s_node_has_time_sliced_mig_and_exclusive_pods() -> None:
    scenario = load_scenario("k8s-a100-mixed")
    node = build_node(scenario, clock=ManualClock(T0))
    assert all(isinstance(p.job, KubernetesJob) for p in scenario.processes)
    assert len(node.gpu_state(0).processes) == 3  # time-sliced
    mig = node.gpu_state(1)
    assert len(mig.mig_instances) == 5 and sum(len(i.processes) for i in mig.mig_instances) == 4
    assert len(node.gpu_state(2).processes) == 1


def test_large_has_56_mig_instances_and_200_processes() -> None:
    node = build_node(load_scenario("large"), clock=ManualClock(T0))
    states = [node.gpu_state(i) for i in range(8)]
    assert sum(len(s.mig_instances) for s in states) == 56
    assert sum(len(s.processes) for s in states) == 200


def test_faults_gives_xid_79_early_and_xid_13_elsewhere() -> None:
    node = build_node(load_scenario("faults"), clock=ManualClock(T0))
    xids = [(e.gpu_index, e.data) for e in node.events_between(T0, T0 + 120) if e.event_type == 0x8]
    first_79 = next(e for e in node.events_between(T0, T0 + 120) if e.data == 79)
    assert 10 <= first_79.time - T0 <= 20
    assert (3, 13) in xids and first_79.gpu_index != 3
