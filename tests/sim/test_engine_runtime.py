"""A running node can be changed from a test: faults, processes and MIG instances appear at once."""

from __future__ import annotations

import pytest

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.scenario import ScenarioError
from gpulens.sim.scenariofile import load_scenario

T0 = 1_750_000_000.0


@pytest.fixture
def node_and_clock():
    clock = ManualClock(T0)
    return build_node(load_scenario("dgx-h100"), clock=clock), clock


def test_inject_xid_delivers_an_event_now(node_and_clock) -> None:
    node, clock = node_and_clock
    clock.advance(10)
    node.inject_xid(3, 79)
    node.inject_xid(0, 13, gpu_instance_id=9)
    events = node.events_between(T0, clock.now())
    assert [(e.gpu_index, e.data, e.gpu_instance_id) for e in events] == [(3, 79, 0xFFFFFFFF), (0, 13, 9)]
    assert all(e.time == T0 + 10 for e in events)


def test_set_lost_forces_and_clears_a_lost_gpu(node_and_clock) -> None:
    node, clock = node_and_clock
    node.set_lost(4, True)
    assert node.gpu_state(4).lost and not node.gpu_state(3).lost
    clock.advance(1)
    node.set_lost(4, False)
    assert not node.gpu_state(4).lost


def test_set_hang_blocks_calls_for_a_while(node_and_clock) -> None:
    node, clock = node_and_clock
    node.set_hang(5, 10)
    assert node.gpu_state(5).hang_seconds == 10
    clock.advance(10)
    assert node.gpu_state(5).hang_seconds == 0


def test_inject_ecc_and_throttle(node_and_clock) -> None:
    node, clock = node_and_clock
    node.inject_ecc(6, corrected=3)
    node.set_throttle(6, 0x40, seconds=5)
    state = node.gpu_state(6)
    assert state.ecc_totals[(0, 0)] == 3 and state.clock_event_reasons & 0x40
    clock.advance(6)
    assert not node.gpu_state(6).clock_event_reasons & 0x40


def test_set_init_error(node_and_clock) -> None:
    node, clock = node_and_clock
    node.set_init_error(18, seconds=3)
    assert node.init_error() == 18
    clock.advance(3)
    assert node.init_error() is None


def test_a_process_added_at_runtime_appears_and_can_be_removed(node_and_clock, tmp_path) -> None:
    node, clock = node_and_clock
    assert node.gpu_state(7).processes == ()
    node.add_process(
        {
            "pid": 777,
            "gpu": 7,
            "job": {"slurm": {"id": 6000, "user": "zoe"}},
            "workload": {"pattern": "constant", "memory": "5GiB"},
        }
    )
    (proc,) = node.gpu_state(7).processes
    assert proc.pid == 777 and proc.start_time == T0
    clock.advance(5)
    node.remove_process(777)
    assert node.gpu_state(7).processes == ()


def test_add_process_validates_like_a_scenario_file(node_and_clock) -> None:
    node, _ = node_and_clock
    with pytest.raises(
        ScenarioError, match=r"^add_process: process.gpu: expected a GPU index from 0 to 7, found 9$"
    ):
        node.add_process({"pid": 5, "gpu": 9, "workload": {"pattern": "constant", "memory": "1GiB"}})
    with pytest.raises(ScenarioError, match="a pid not running now"):
        node.add_process({"pid": 213101, "gpu": 7, "workload": {"pattern": "constant", "memory": "1GiB"}})


def test_mig_instances_appear_without_restart_and_take_processes(node_and_clock) -> None:
    node, clock = node_and_clock
    before = {i.gpu_instance_id for i in node.gpu_state(1).mig_instances}
    assert before == {1, 2}
    node.destroy_mig_instance(1, 2)
    clock.advance(1)
    gi = node.create_mig_instance(1, "2g.20gb", start=4)
    assert gi == 5
    node.add_process(
        {"pid": 999, "gpu": 1, "instance": 5, "workload": {"pattern": "training", "memory": "10GiB"}}
    )
    state = node.gpu_state(1)
    inst = next(i for i in state.mig_instances if i.gpu_instance_id == 5)
    assert [p.pid for p in inst.processes] == [999] and inst.uuid.startswith("MIG-")
    assert [e.event_type for e in node.events_between(T0 - 1, clock.now())] == [0x100, 0x100]


def test_an_impossible_mig_instance_is_refused(node_and_clock) -> None:
    node, _ = node_and_clock
    with pytest.raises(ValueError, match="compute slices"):
        node.create_mig_instance(1, "1g.10gb")
