"""Whatever a scenario file contains, loading it either works (and the node runs) or fails with one
ScenarioError line: never a traceback."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.scenario import ScenarioError
from gpulens.sim.scenariofile import parse_scenario

# a small scenario that uses every section and fault kind
BASE: dict[str, Any] = {
    "name": "fuzz",
    "seed": 1,
    "node": {"hostname": "n1", "kubernetes": {"driver": "systemd"}},
    "users": {"al": 1001},
    "gpus": [
        {"model": "H100-80GB", "mig": [{"profile": "3g.40gb", "start": 4}, "1g.10gb"]},
        {"model": "A100-80GB", "mps": {"server_pid": 90, "memory": "32MiB"}, "overrides": {"ecc": True}},
        {
            "model": "A30",
            "count": 1,
            "overrides": {"power_limit_watts": 150, "remapped_rows": {"correctable": 1}},
        },
    ],
    "processes": [
        {
            "pid": 10,
            "gpu": 0,
            "instance": 2,
            "job": {"slurm": {"id": 7, "user": "al"}},
            "workload": {"pattern": "training", "memory": "10GiB", "sm": 0.5, "duty": 0.7, "step": "2s"},
        },
        {
            "pid": 11,
            "gpu": 1,
            "kind": "mps_client",
            "job": {"kubernetes": {"namespace": "a", "pod": "b"}},
            "environ": {"A": "1"},
            "workload": {"pattern": "inference", "memory": "2GiB", "rate": 0.3},
        },
        {
            "pid": 12,
            "gpu": 2,
            "start": "-1h",
            "end": "1h",
            "job": {"mapping": {"id": "j1"}},
            "workload": {"pattern": "growing", "memory": "4GiB", "memory_start": "1GiB", "over": "10m"},
        },
        {
            "pid": 13,
            "gpu": 0,
            "instance": 7,
            "workload": {"pattern": "notebook", "memory": "1GiB", "active": 0.5},
        },
    ],
    "faults": {
        "repeat": "2m",
        "timeline": [
            {"at": "1s", "init_error": "unknown", "for": "1s"},
            {"at": "5s", "gpu": 0, "instance": 7, "xid": 31},
            {"at": "6s", "gpu": 1, "ecc": {"corrected": 2, "uncorrected": 1}},
            {"at": "7s", "gpu": 1, "ecc_storm": {"corrected": 100}, "for": "10s"},
            {"at": "8s", "gpu": 2, "row_remap": "pending"},
            {"at": "9s", "gpu": 2, "lost": "5s"},
            {"at": "10s", "gpu": 1, "throttle": ["hw_thermal"], "for": "5s"},
            {"at": "11s", "gpu": 2, "hang": "1s"},
            {"at": "12s", "gpu": 0, "mig_create": {"profile": "1g.10gb", "start": 1}},
            {"at": "20s", "gpu": 0, "mig_destroy": 8},
            {"at": "13s", "gpu": 1, "mps_restart": "2s"},
            {"at": "14s", "gpu": 1, "pcie_replay": 2},
            {"at": "15s", "gpu": 1, "nvlink_error": {"link": 1}},
        ],
    },
}

JUNK = [
    None,
    True,
    -1,
    0,
    3,
    2**64,
    0.5,
    1.5,
    float("nan"),
    float("inf"),
    1e308,
    "",
    "x",
    "10s",
    "-5m",
    "forever",
    "3GiB",
    "1g.10gb",
    "50%",
    [],
    [1],
    {},
    {"at": 1},
]


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += paths(value, (*prefix, i))
    return out


ALL_PATHS = paths(BASE)[1:]


def replace_at(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    data = copy.deepcopy(data)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


def load_and_run(data: Any) -> None:
    try:
        scenario = parse_scenario(data, "fuzz.yaml")
    except ScenarioError as error:
        message = str(error)
        assert message.startswith("fuzz.yaml: ") and "\n" not in message, message
        return
    clock = ManualClock(1_750_000_000.0)
    node = build_node(scenario, clock=clock)
    for step in (0.0, 9.5, 61.0):
        clock.advance(step)
        for i in range(len(node.identities)):
            node.gpu_state(i)
            node.activity_between(i, None, clock.now() - 5, clock.now())
        node.events_between(clock.now() - 61, clock.now())
        node.init_error()


def test_the_fuzz_base_is_valid() -> None:
    scenario = parse_scenario(BASE, "fuzz.yaml")
    assert len(scenario.faults) == 13 and len(scenario.processes) == 4


@pytest.mark.parametrize("path", ALL_PATHS, ids=lambda p: ".".join(map(str, p)))
def test_any_one_bad_value_is_a_one_line_error(path: tuple[Any, ...]) -> None:
    for value in JUNK:
        load_and_run(replace_at(BASE, path, value))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.sampled_from(ALL_PATHS), st.sampled_from(JUNK)), min_size=2, max_size=4))
def test_several_bad_values_are_a_one_line_error(edits: list[tuple[tuple[Any, ...], Any]]) -> None:
    data: Any = BASE
    for path, value in edits:
        try:
            data = replace_at(data, path, value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed this path
    load_and_run(data)
