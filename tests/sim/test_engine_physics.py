"""Gauges are plausible together, and counters are monotonic and agree with the gauges."""

from __future__ import annotations

import itertools
import statistics

import pytest

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.scenariofile import load_scenario, parse_scenario
from gpulens.sim.state import ProcessState

T0 = 1_750_000_000.0


@pytest.fixture(scope="module")
def dgx():
    return load_scenario("dgx-h100")


def walk(node, clock, seconds: float, step: float):
    """States of every GPU every `step` seconds for `seconds`."""
    out = []
    for _ in range(int(seconds / step)):
        clock.advance(step)
        out.append([node.gpu_state(i) for i in range(len(node.identities))])
    return out


def test_utilization_is_at_least_sm_activity_and_power_stays_in_range(dgx) -> None:
    clock = ManualClock(T0)
    node = build_node(dgx, clock=clock)
    for states in walk(node, clock, 600, 7.3):
        for state in states:
            model = node.identities[state.index].model
            if state.mig_mode_current != 1:
                assert state.utilization_gpu_percent >= round(state.activity.sm * 100) - 1
            assert model.idle_power_watts * 1000 <= state.power_mw <= state.power_limit_mw
            assert state.activity.tensor <= state.activity.sm + 1e-9


def test_counters_are_monotonic(dgx) -> None:
    clock = ManualClock(T0)
    node = build_node(dgx, clock=clock)
    history = walk(node, clock, 300, 1.7)
    for before, after in itertools.pairwise(history):
        for a, b in zip(before, after, strict=True):
            assert b.energy_mj >= a.energy_mj
            assert b.pcie_rx_bytes_total >= a.pcie_rx_bytes_total
            assert b.pcie_tx_bytes_total >= a.pcie_tx_bytes_total
            assert all(
                lb.tx_kib_total >= la.tx_kib_total for la, lb in zip(a.nvlinks, b.nvlinks, strict=True)
            )


def test_energy_rate_matches_the_average_power_gauge(dgx) -> None:
    clock = ManualClock(T0)
    node = build_node(dgx, clock=clock)
    history = walk(node, clock, 1800, 5.0)
    for i in (3, 5, 7):
        energy_rate_w = (
            (history[-1][i].energy_mj - history[0][i].energy_mj) / 1000 / (5.0 * (len(history) - 1))
        )
        average_w = statistics.mean(states[i].power_mw for states in history) / 1000
        assert energy_rate_w == pytest.approx(average_w, rel=0.05)


def test_counters_do_not_depend_on_how_often_they_are_read(dgx) -> None:
    often_clock, once_clock = ManualClock(T0), ManualClock(T0)
    often, once = build_node(dgx, clock=often_clock), build_node(dgx, clock=once_clock)
    walk(often, often_clock, 900, 3.1)
    once_clock.set(often_clock.now())
    for i in range(8):
        a, b = often.gpu_state(i), once.gpu_state(i)
        assert (a.energy_mj, a.pcie_rx_bytes_total, a.nvlinks) == (
            b.energy_mj,
            b.pcie_rx_bytes_total,
            b.nvlinks,
        )


def test_busy_gpus_run_hotter_and_at_higher_clocks_than_idle_ones(dgx) -> None:
    clock = ManualClock(T0)
    node = build_node(dgx, clock=clock)
    clock.advance(600)
    busy, idle = node.gpu_state(5), node.gpu_state(7)
    assert busy.temperature_c > idle.temperature_c + 10
    assert busy.power_mw > 3 * idle.power_mw
    assert busy.sm_clock_mhz == node.identities[5].model.max_sm_clock_mhz
    assert idle.sm_clock_mhz < busy.sm_clock_mhz / 4
    assert idle.clock_event_reasons == 0x1  # GpuIdle
    assert busy.clock_event_reasons & 0x1 == 0


def test_a_lowered_power_limit_caps_power_and_sets_the_power_cap_reason() -> None:
    scenario = parse_scenario(
        {
            "gpus": [{"model": "H100-80GB", "overrides": {"power_limit_watts": 300}}],
            "processes": [
                {
                    "pid": 9,
                    "gpu": 0,
                    "workload": {"pattern": "constant", "memory": "1GiB", "sm": 1.0, "tensor": 1.0},
                }
            ],
        },
        "t.yaml",
    )
    state = build_node(scenario, clock=ManualClock(T0)).gpu_state(0)
    assert state.power_mw == 300_000 and state.power_limit_mw == 300_000
    assert state.default_power_limit_mw == 700_000
    assert state.clock_event_reasons & 0x4


def _used(process: ProcessState) -> int:
    assert process.used_memory_bytes is not None, f"pid {process.pid}: no memory figure"
    return process.used_memory_bytes


def test_mps_clients_share_memory_accounting_with_the_server(dgx) -> None:
    state = build_node(dgx, clock=ManualClock(T0)).gpu_state(2)
    (server,) = state.processes
    assert server.kind == "mps_server" and _used(server) < 64 * 1024**2
    assert state.memory_used_bytes == state.memory_reserved_bytes + _used(server) + sum(
        _used(c) for c in state.mps_clients
    )
    assert state.utilization_gpu_percent >= round(state.activity.sm * 100) - 1


def test_mig_gpu_activity_is_the_sm_weighted_sum_of_its_instances(dgx) -> None:
    state = build_node(dgx, clock=ManualClock(T0 + 100)).gpu_state(0)
    weighted = sum(i.activity.sm * i.profile.sm_count / 132 for i in state.mig_instances)  # H100: 132 SMs
    assert state.activity.sm == pytest.approx(weighted)


def test_activity_between_averages_over_the_interval(dgx) -> None:
    clock = ManualClock(T0 + 1000)
    node = build_node(dgx, clock=clock)
    long = node.activity_between(3, None, T0 + 1000, T0 + 1060)
    assert long.sm == pytest.approx(0.78, abs=0.05)  # the training job's mean SM activity
    inst = node.activity_between(0, 2, T0 + 1000, T0 + 1060)
    assert inst.sm == pytest.approx(0.62, abs=0.06)
    assert node.activity_between(0, 14, T0 + 1000, T0 + 1060).sm == 0.0  # no such instance


def test_a_long_run_keeps_a_bounded_window_of_counter_steps(dgx) -> None:
    clock = ManualClock(T0)
    node = build_node(dgx, clock=clock)
    early = build_node(dgx, clock=ManualClock(T0))._integrals(3, 1234.5)
    clock.advance(86400)
    before = node.gpu_state(3).energy_mj
    clock.advance(5)
    assert node.gpu_state(3).energy_mj > before
    # white-box: the kept steps and an old time's integral are internal (the clock never goes back)
    assert len(node._counters[3].rates) <= 128  # a day would be 8640 ten-second steps
    assert node._integrals(3, 1234.5) == early  # an old time is integrated again, identically
