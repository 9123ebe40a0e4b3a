"""The scenario engine turns a scenario, a seed and a clock into plausible, repeatable GPU states."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.scenariofile import load_scenario, parse_scenario
from gpulens.sim.state import NO_INSTANCE

T0 = 1_750_000_000.0


@pytest.fixture(scope="module")
def dgx():
    return load_scenario("dgx-h100")


def test_dgx_h100_has_eight_h100_with_mig_mps_exclusive_and_idle_gpus(dgx):
    node = build_node(dgx, clock=ManualClock(T0))
    states = [node.gpu_state(i) for i in range(8)]
    assert [i.model.key for i in node.identities] == ["H100-80GB"] * 8
    assert [s.mig_mode_current for s in states] == [1, 1, 0, 0, 0, 0, 0, 0]
    assert len(states[0].mig_instances) == 4 and len(states[1].mig_instances) == 2
    assert {p.profile.name for p in states[0].mig_instances} != {
        p.profile.name for p in states[1].mig_instances
    }
    assert [p.kind for p in states[2].processes] == ["mps_server"]
    assert len(states[2].mps_clients) == 3
    assert states[2].compute_mode == 3
    assert all(len(s.processes) == 1 for s in states[3:7])
    assert states[7].processes == () and states[7].utilization_gpu_percent == 0


def test_same_seed_and_times_give_identical_states(dgx):
    a_clock, b_clock = ManualClock(T0), ManualClock(T0)
    a, b = build_node(dgx, seed=7, clock=a_clock), build_node(dgx, seed=7, clock=b_clock)
    for step in (0.0, 3.3, 60.0, 3600.0):
        a_clock.advance(step)
        b_clock.advance(step)
        assert [a.gpu_state(i) for i in range(8)] == [b.gpu_state(i) for i in range(8)]


def test_a_different_seed_changes_the_noise(dgx):
    a = build_node(dgx, seed=1, clock=ManualClock(T0 + 100))
    b = build_node(dgx, seed=2, clock=ManualClock(T0 + 100))
    assert [a.gpu_state(i).power_mw for i in range(8)] != [b.gpu_state(i).power_mw for i in range(8)]


def test_mig_processes_carry_their_gpu_instance_and_memory_adds_up(dgx):
    state = build_node(dgx, clock=ManualClock(T0)).gpu_state(0)
    for inst in state.mig_instances:
        assert all(p.gpu_instance_id == inst.gpu_instance_id for p in inst.processes)
        assert inst.memory_used_bytes == inst.memory_reserved_bytes + sum(
            p.used_memory_bytes for p in inst.processes
        )
    assert state.memory_used_bytes == state.memory_reserved_bytes + sum(
        i.memory_used_bytes for i in state.mig_instances
    )
    assert state.remapped_rows is None  # not supported while MIG instances exist


def test_exclusive_gpu_memory_is_processes_plus_reserved(dgx):
    state = build_node(dgx, clock=ManualClock(T0)).gpu_state(3)
    (proc,) = state.processes
    assert proc.gpu_instance_id == NO_INSTANCE
    assert state.memory_used_bytes == state.memory_reserved_bytes + proc.used_memory_bytes


def test_states_do_not_depend_on_python_hash_randomization() -> None:
    script = (
        "from gpulens.sim.clock import ManualClock\n"
        "from gpulens.sim.engine import build_node\n"
        "from gpulens.sim.scenariofile import load_scenario\n"
        "import hashlib\n"
        f"clock = ManualClock({T0})\n"
        "node = build_node(load_scenario('faults'), seed=3, clock=clock)\n"
        "digest = hashlib.sha256()\n"
        "for step in (1, 20, 40, 75):\n"
        "    clock.advance(step)\n"
        "    digest.update(repr([node.gpu_state(i) for i in range(8)]).encode())\n"
        "    digest.update(repr(node.events_between(clock.now() - step, clock.now())).encode())\n"
        "print(digest.hexdigest())\n"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(digests) == 1


def test_processes_starting_with_the_node_are_there_at_once_on_any_start_time() -> None:
    scenario = parse_scenario(
        {
            "gpus": [{"model": "A30"}],
            "processes": [{"pid": 9, "gpu": 0, "workload": {"pattern": "constant", "memory": "1GiB"}}],
        },
        "t.yaml",
    )
    node = build_node(scenario, clock=ManualClock(1_700_000_000.123))  # mid-quantum
    assert [p.pid for p in node.gpu_state(0).processes] == [9]


def test_an_h200_reserves_what_the_real_one_does() -> None:
    """615.06 MiB: nvidia-smi's "Reserved 616 MiB" on a real H200 (driver 580.159.04)."""
    node = build_node(parse_scenario({"gpus": [{"model": "H200"}]}, "t.yaml"), seed=1)
    state = node.gpu_state(0)
    assert state.memory_reserved_bytes == state.memory_used_bytes == 644_939_776
