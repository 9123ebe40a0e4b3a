"""Room for new requests and FGD's fragmentation measure (analyzer/fragmentation.py), and the
plan's use of both: the layout's tie-breaker between equal GPUs, the counts in plan.json."""

from __future__ import annotations

from typing import Any

import pytest

from gpulens.analyzer import fragmentation
from gpulens.analyzer.bins import GpuBin, Item
from gpulens.analyzer.plan import build_plan
from gpulens.analyzer.planlayout import assign_gpus
from gpulens.analyzer.profile import FleetGpu, profiles_from_samples
from gpulens.analyzer.recommend import recommend
from gpulens.analyzer.topology import from_rows
from tests.analyzer import synth
from tests.analyzer.synth import SynthJob, flat, steady

GIB = 1024**3
HALF_AND_EIGHT = {1: 0.5, 8: 0.5}  # half the jobs take one GPU, half take eight


def _gpus(node: str, n: int) -> list[str]:
    return [f"GPU-{node}-{i}" for i in range(n)]


def test_a_request_needs_all_its_gpus_free_on_one_node():
    room = fragmentation.placeable({"a": _gpus("a", 4), "b": _gpus("b", 4)})
    assert room == {1: 8, 2: 4, 4: 2, 8: 0}


def test_free_gpus_too_few_for_a_request_size_are_fragmented_for_it():
    assert fragmentation.fragmentation(3, HALF_AND_EIGHT) == pytest.approx(1.5)  # useless to 8-GPU jobs
    assert fragmentation.fragmentation(8, HALF_AND_EIGHT) == 0.0
    assert fragmentation.fragmentation(0, HALF_AND_EIGHT) == 0.0


def test_taking_a_gpu_of_a_broken_node_costs_less_than_breaking_a_whole_one():
    assert (
        fragmentation.cost_of_taking(1, HALF_AND_EIGHT) < 0 < fragmentation.cost_of_taking(8, HALF_AND_EIGHT)
    )


def test_the_task_mix_is_the_share_of_jobs_per_request_size():
    assert fragmentation.task_mix([1, 1, 3, 8, 16]) == {1: 0.4, 2: 0.0, 4: 0.2, 8: 0.4}
    assert fragmentation.task_mix([]) == {1: 1.0}


def _pcie_box(node: str) -> list[dict[str, Any]]:
    """Eight GPUs, two NUMA nodes of four under one switch each (a PCIe server)."""
    rows = []
    for a in range(8):
        for b in range(8):
            if a != b:
                link = "pcie_switch" if a // 4 == b // 4 else "system"
                rows.append(
                    {"instance": node, "gpu": str(a), "uuid": f"GPU-{node}-{a}", "peer": str(b)}
                    | {"peer_uuid": f"GPU-{node}-{b}", "link": link}
                )
    return rows


def test_where_topology_is_known_a_request_gets_gpus_as_local_as_the_node_offers():
    topology = from_rows(_pcie_box("p"))
    split = {"p": ["GPU-p-0", "GPU-p-1", "GPU-p-4", "GPU-p-5"]}  # two free under each switch
    assert fragmentation.placeable(split, topology)[4] == 0  # across the NUMA nodes: not counted
    assert fragmentation.placeable(split)[4] == 1  # without topology: four GPUs of one node
    assert fragmentation.placeable(split, topology)[2] == 2
    whole = {"p": _gpus("p", 8)}
    assert fragmentation.placeable(whole, topology) == {1: 8, 2: 4, 4: 2, 8: 1}  # 8: its best set


def test_between_equal_gpus_the_layout_takes_one_of_a_broken_node():
    fleet = [FleetGpu(u, "H100-80GB", "a-empty") for u in _gpus("a", 8)]
    fleet.append(FleetGpu("GPU-z-0", "H100-80GB", "z-broken"))  # the last free GPU of its node
    gpu = GpuBin(name="H100-80GB#1", model="H100-80GB", mode="exclusive")
    gpu.items.append(Item("new", "exclusive", "H100-80GB", 0.0, 1.0, 1, GIB, 0.5, 0.5, 1.0))
    assign_gpus([gpu], fleet, None, HALF_AND_EIGHT)
    assert gpu.node == "z-broken"  # the empty node keeps room for an 8-GPU job


def test_the_plan_counts_the_requests_its_free_gpus_hold_now_and_after(th):
    jobs = [  # one after the other on two GPUs of one node: the plan frees one
        SynthJob("early", "GPU-a", steady(30, 0.9, 0.01), flat(30, 20 * GIB)),
        SynthJob("late", "GPU-b", steady(30, 0.9, 0.01), flat(30, 20 * GIB), first_step=40),
    ]
    recs = recommend(profiles_from_samples(synth.frame(jobs), synth.STEP, th), th)
    plan = build_plan(recs, th)
    assert plan.room == [
        {"gpus": 1, "now": 0, "after": 1},
        {"gpus": 2, "now": 0, "after": 0},
        {"gpus": 4, "now": 0, "after": 0},
        {"gpus": 8, "now": 0, "after": 0},
    ]
    assert plan.fragmented_gpus == {"now": 0.0, "after": 0.0}  # every job takes one GPU
