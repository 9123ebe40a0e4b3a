"""Each fault kind changes `gpu_state` / `events_between` as a real driver would show it."""

from __future__ import annotations

from typing import Any

import pytest

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import ScenarioNode, build_node
from gpulens.sim.scenariofile import parse_scenario
from gpulens.sim.state import NO_INSTANCE

T0 = 1_750_000_000.0
XID, DBE, SBE, STORM, MIG_CHANGE, REMAP, REMAP_FAIL = 0x8, 0x2, 0x1, 0x200, 0x100, 0x400, 0x800


def node_with(
    *faults: dict[str, Any], mig: list[Any] | None = None, mps: bool = False, repeat: str | None = None
):
    gpu: dict[str, Any] = {"model": "H100-80GB"}
    processes: list[dict[str, Any]] = [
        {
            "pid": 77,
            "gpu": 0,
            "start": "-1h",
            "workload": {"pattern": "constant", "memory": "4GiB", "sm": 0.8},
        }
    ]
    if mig is not None:
        gpu["mig"] = mig
        processes = [
            {"pid": 77, "gpu": 0, "instance": 2, "workload": {"pattern": "constant", "memory": "4GiB"}},
            {"pid": 78, "gpu": 0, "instance": 9, "workload": {"pattern": "constant", "memory": "2GiB"}},
        ]
    if mps:
        gpu["mps"] = {"server_pid": 500, "restart_pid": 501}
        processes[0]["kind"] = "mps_client"
    timeline: dict[str, Any] = {"timeline": list(faults)}
    if repeat:
        timeline["repeat"] = repeat
    scenario = parse_scenario({"gpus": [gpu], "processes": processes, "faults": timeline}, "t.yaml")
    clock = ManualClock(T0)
    return build_node(scenario, clock=clock), clock


def at(node: ScenarioNode, clock: ManualClock, t: float):
    clock.set(T0 + t)
    return node.gpu_state(0)


def test_an_xid_is_an_event_at_its_time() -> None:
    node, _ = node_with({"at": "15s", "gpu": 0, "xid": 79})
    (event,) = node.events_between(T0, T0 + 60)
    assert (event.time, event.gpu_index, event.event_type, event.data) == (T0 + 15, 0, XID, 79)
    assert event.gpu_instance_id == event.compute_instance_id == NO_INSTANCE


def test_events_between_excludes_the_start_and_includes_the_end() -> None:
    node, _ = node_with({"at": "15s", "gpu": 0, "xid": 79})
    assert node.events_between(T0 + 15, T0 + 20) == []
    assert len(node.events_between(T0 + 10, T0 + 15)) == 1


def test_an_xid_on_a_mig_instance_carries_its_instance_ids() -> None:
    node, _ = node_with(
        {"at": 5, "gpu": 0, "instance": 9, "xid": 31}, mig=["3g.40gb", {"profile": "1g.10gb", "start": 2}]
    )
    (event,) = node.events_between(T0, T0 + 10)
    assert (event.data, event.gpu_instance_id, event.compute_instance_id) == (31, 9, 0)


def test_uncorrectable_ecc_counts_and_raises_dbe_and_xid_48() -> None:
    node, clock = node_with({"at": 20, "gpu": 0, "ecc": {"uncorrected": 2}})
    assert at(node, clock, 19).ecc_totals[(1, 0)] == 0
    state = at(node, clock, 21)
    assert state.ecc_totals[(1, 0)] == state.ecc_totals[(1, 1)] == 2
    assert state.memory_error_counters[(1, 0, 2)] == 2  # DRAM
    assert [(e.event_type, e.data) for e in node.events_between(T0, T0 + 30)] == [(DBE, 0), (XID, 48)]


def test_a_corrected_ecc_storm_ramps_up_over_its_duration() -> None:
    node, clock = node_with({"at": 10, "gpu": 0, "ecc_storm": {"corrected": 1000}, "for": "20s"})
    assert at(node, clock, 20).ecc_totals[(0, 0)] == 500
    assert at(node, clock, 40).ecc_totals[(0, 0)] == 1000
    assert [e.event_type for e in node.events_between(T0, T0 + 40)] == [STORM]


def test_a_pending_row_remap_clears_when_the_gpu_comes_back_from_lost() -> None:
    node, clock = node_with({"at": 10, "gpu": 0, "row_remap": "pending"}, {"at": 20, "gpu": 0, "lost": "10s"})
    assert at(node, clock, 5).remapped_rows == (0, 0, False, False)
    assert at(node, clock, 15).remapped_rows == (0, 1, True, False)
    assert at(node, clock, 25).lost
    assert at(node, clock, 31).remapped_rows == (0, 1, False, False)
    assert [(e.event_type, e.data) for e in node.events_between(T0, T0 + 40)] == [(REMAP, 0), (XID, 63)]


def test_a_failed_row_remap_stays_failed() -> None:
    node, clock = node_with({"at": 10, "gpu": 0, "row_remap": {"state": "failed"}})
    assert at(node, clock, 1000).remapped_rows == (0, 0, False, True)
    assert [(e.event_type, e.data) for e in node.events_between(T0, T0 + 40)] == [(REMAP_FAIL, 0), (XID, 64)]


def test_remapped_rows_are_not_supported_while_mig_instances_exist() -> None:
    node, clock = node_with(mig=["3g.40gb", {"profile": "1g.10gb", "start": 2}])
    assert at(node, clock, 1).remapped_rows is None


def test_a_lost_gpu_recovers_after_its_duration() -> None:
    node, clock = node_with({"at": 10, "gpu": 0, "lost": "30s"})
    assert [at(node, clock, t).lost for t in (9, 10, 39, 40)] == [False, True, True, False]


def test_thermal_throttling_sets_reasons_drops_clocks_and_heats_up() -> None:
    node, clock = node_with({"at": 100, "gpu": 0, "throttle": ["hw_thermal", "sw_thermal"], "for": "30s"})
    before, during, after = at(node, clock, 99), at(node, clock, 110), at(node, clock, 131)
    assert during.clock_event_reasons & 0x60 == 0x60 and before.clock_event_reasons & 0x60 == 0
    assert during.sm_clock_mhz < 0.7 * before.sm_clock_mhz
    assert during.temperature_c >= 87 > before.temperature_c
    assert after.clock_event_reasons & 0x60 == 0


def test_a_power_brake_is_a_hw_slowdown_that_cuts_power() -> None:
    node, clock = node_with({"at": 100, "gpu": 0, "throttle": "hw_power_brake", "for": "30s"})
    before, during = at(node, clock, 99), at(node, clock, 110)
    assert during.clock_event_reasons & 0x88 == 0x88
    assert during.power_mw < 0.5 * before.power_mw
    assert during.sm_clock_mhz <= 0.25 * before.sm_clock_mhz + 15


def test_a_hang_reports_the_time_left() -> None:
    node, clock = node_with({"at": 40, "gpu": 0, "hang": "10s"})
    assert [at(node, clock, t).hang_seconds for t in (39, 40, 46, 50)] == [0.0, 10.0, pytest.approx(4.0), 0.0]


def test_nvml_init_fails_until_the_window_ends() -> None:
    node, clock = node_with({"at": 0, "init_error": "driver_not_loaded", "for": "5s"})
    assert node.init_error() == 9
    clock.set(T0 + 5)
    assert node.init_error() is None


def test_mig_instances_come_and_go_with_their_processes() -> None:
    node, clock = node_with(
        {"at": 10, "gpu": 0, "mig_create": {"profile": "1g.10gb", "start": 3}},
        {"at": 20, "gpu": 0, "mig_destroy": 9},
        mig=["3g.40gb", {"profile": "1g.10gb", "start": 2}],
    )
    assert [i.gpu_instance_id for i in at(node, clock, 5).mig_instances] == [2, 9]
    created = at(node, clock, 15)
    assert [(i.slot, i.gpu_instance_id) for i in created.mig_instances] == [(0, 2), (1, 9), (2, 10)]
    after = at(node, clock, 25)
    assert [(i.slot, i.gpu_instance_id) for i in after.mig_instances] == [(0, 2), (2, 10)]  # slot 1 empty
    assert 78 not in {p.pid for p in after.processes}
    assert [e.event_type for e in node.events_between(T0, T0 + 30)] == [MIG_CHANGE, MIG_CHANGE]


def test_an_mps_restart_drops_server_and_clients_then_the_server_has_a_new_pid() -> None:
    node, clock = node_with({"at": 10, "gpu": 0, "mps_restart": "5s"}, mps=True)
    assert [p.pid for p in at(node, clock, 9).processes] == [500]
    down = at(node, clock, 12)
    assert down.processes == () and down.mps_clients == ()
    up = at(node, clock, 16)
    assert [p.pid for p in up.processes] == [501] and [c.pid for c in up.mps_clients] == [77]
    assert up.processes[0].start_time == T0 + 15


def test_pcie_replays_and_nvlink_errors_are_counted_per_link() -> None:
    node, clock = node_with(
        {"at": 5, "gpu": 0, "pcie_replay": 12},
        {"at": 6, "gpu": 0, "nvlink_error": {"link": 2, "counter": "crc_data", "count": 3}},
    )
    state = at(node, clock, 10)
    assert state.pcie_replay_count == 12
    assert state.nvlinks[2].errors == {3: 3} and state.nvlinks[1].errors == {}


def test_a_repeating_timeline_repeats_events_and_keeps_counting() -> None:
    node, clock = node_with(
        {"at": 10, "gpu": 0, "xid": 13}, {"at": 20, "gpu": 0, "ecc": {"corrected": 5}}, repeat="1m"
    )
    assert [e.time - T0 for e in node.events_between(T0, T0 + 150) if e.event_type == XID] == [10, 70, 130]
    assert at(node, clock, 145).ecc_totals[(0, 0)] == 15


def test_a_gpu_back_from_lost_restarts_its_volatile_ecc_counts() -> None:
    node, clock = node_with(
        {"at": 10, "gpu": 0, "ecc": {"corrected": 4, "location": "sram"}}, {"at": 20, "gpu": 0, "lost": "10s"}
    )
    before = at(node, clock, 15)
    assert (before.ecc_totals[(0, 0)], before.ecc_totals[(0, 1)]) == (4, 4)
    after = at(node, clock, 31)
    assert (after.ecc_totals[(0, 0)], after.ecc_totals[(0, 1)]) == (0, 4)
    assert (after.memory_error_counters[(0, 0, 7)], after.memory_error_counters[(0, 1, 7)]) == (0, 4)


def test_ecc_in_any_location_has_its_own_counter() -> None:
    node, clock = node_with({"at": 10, "gpu": 0, "ecc": {"uncorrected": 1, "location": "cbu"}})
    assert at(node, clock, 11).memory_error_counters[(1, 0, 6)] == 1


def test_mps_clients_wait_for_their_server() -> None:
    scenario = parse_scenario(
        {
            "gpus": [{"model": "H100-80GB", "mps": {"server_pid": 500, "start": "10s"}}],
            "processes": [
                {
                    "pid": 77,
                    "gpu": 0,
                    "kind": "mps_client",
                    "start": "-1h",
                    "workload": {"pattern": "constant", "memory": "4GiB"},
                }
            ],
        },
        "t.yaml",
    )
    clock = ManualClock(T0)
    node = build_node(scenario, clock=clock)
    early = at(node, clock, 5)
    assert early.processes == () and early.mps_clients == ()
    late = at(node, clock, 15)
    assert [p.pid for p in late.processes] == [500] and late.mps_clients[0].start_time == T0 + 10
