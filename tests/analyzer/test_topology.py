"""The analyzer reads the GPU topology: the split-placement finding and topology-local plans."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer.bins import GpuBin, Item
from gpulens.analyzer.pipeline import analyze_history
from gpulens.analyzer.planlayout import assign_gpus
from gpulens.analyzer.profile import FleetGpu
from gpulens.analyzer.sources import files
from gpulens.analyzer.topoadvice import Occupancy, advise
from gpulens.analyzer.topology import Tier, Topology, best_set, from_rows
from gpulens.cli import main
from gpulens.sim.history import simulate
from tests.support.procs import (
    PROMETHEUS_ENGINES,
    backfill_openmetrics,
    prometheus,
    use_prometheus,
)

STEP = 300.0
START = 1_767_225_600.0  # aligned to the step


@pytest.fixture(scope="module")
def pcie_split(tmp_path_factory):
    out = tmp_path_factory.mktemp("pcie-split") / "h"
    simulate("pcie-split", 6 * 3600, out, step_s=STEP, start=START)
    return out


def _jobs(analysis) -> dict[str, dict[str, Any]]:
    return {str(j["job_id"]): j for j in analysis.job_records()}


def test_pcie_split_job_is_flagged_with_its_penalty_and_a_local_alternative(pcie_split, th):
    jobs = _jobs(analyze_history(files.load(str(pcie_split)), th))
    split = jobs["7001"]
    assert split["action"] == "fix"
    assert split["topology_link"] == "system"
    assert split["topology_local_gpus"] == [4, 5, 6, 7]
    assert "30-50 %" in split["finding"] and "topology.misaligned_loss" in split["finding"]
    assert "move it to GPUs 4-7 under one PCIe switch (job 7003 moves from GPU 6 to GPU" in split["finding"]
    assert split["gpu_hours_recovered"] == pytest.approx(split["gpu_hours_allocated"] * 0.30, rel=1e-3)


def test_pcie_split_local_job_is_not_flagged(pcie_split, th):
    jobs = _jobs(analyze_history(files.load(str(pcie_split)), th))
    assert jobs["7002"]["topology_link"] is None
    assert "topology" not in (jobs["7002"]["finding"] or "")


def test_the_split_job_ranks_among_the_actions(pcie_split, th):
    analysis = analyze_history(files.load(str(pcie_split)), th)
    assert [a["job_id"] for a in analysis.top_actions()][:1] == ["7001"]


def _node(links: dict[tuple[int, int], str], n: int, node: str = "n1") -> list[dict[str, Any]]:
    return [
        {
            "instance": node,
            "gpu": str(a),
            "uuid": f"{node}-GPU-{a}",
            "peer": str(b),
            "peer_uuid": f"{node}-GPU-{b}",
            "link": links[(min(a, b), max(a, b))],
        }
        for a in range(n)
        for b in range(n)
        if a != b
    ]


def test_an_all_nvlink_node_never_flags_a_multi_gpu_job(th):
    topology = from_rows(_node(dict.fromkeys(itertools.combinations(range(8), 2), "nvlink"), 8))
    uuids = [f"n1-GPU-{i}" for i in range(8)]
    occupied = Occupancy({}, frozenset(), dict.fromkeys(uuids, "H100-80GB"))
    for size in range(2, 9):
        for chosen in itertools.combinations(uuids, size):
            row = SimpleNamespace(uuids=",".join(chosen), job_id="j", gpu_hours_allocated=10.0)
            assert advise(row, topology, occupied, th) is None


def test_history_without_topology_gives_no_finding_and_no_constraint():
    assert Topology().of(["GPU-1", "GPU-2"]) is None
    assert from_rows([{"uuid": "a", "peer_uuid": "b", "link": "warp-drive"}]).nodes == ()


# --- the plan keeps the multi-GPU jobs it moves topology-local --------------------------------


def _links(switches: list[int], numa: list[int]) -> dict[tuple[int, int], str]:
    out = {}
    for a, b in itertools.combinations(range(len(switches)), 2):
        if switches[a] == switches[b]:
            out[(a, b)] = "pcie_switch"
        elif numa[a] == numa[b]:
            out[(a, b)] = "pcie_host_bridge"
        else:
            out[(a, b)] = "system"
    return out


@st.composite
def fleets(draw):
    n = draw(st.integers(4, 8))
    switches = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    numa = [s // 2 for s in switches]  # two switches per NUMA node
    busy = draw(st.sets(st.integers(0, n - 1), max_size=n - 2))
    size = draw(st.integers(2, n - len(busy)))
    return n, switches, numa, sorted(busy), size


@settings(max_examples=150, deadline=None)
@given(fleets())
def test_a_moved_multi_gpu_job_is_never_split_across_switches_when_a_local_set_exists(fleet):
    n, switches, numa, busy, size = fleet
    topology = from_rows(_node(_links(switches, numa), n))
    gpus = [FleetGpu(f"n1-GPU-{i}", "L40S-48GB", "n1") for i in range(n)]
    # single-GPU jobs that stay on their GPUs, and a multi-GPU job that must move (its GPUs now
    # are of another model, e.g. a downsize)
    bins = [GpuBin(f"b{i}", "L40S-48GB", "exclusive", [_item(f"s{i}", 1, (f"n1-GPU-{i}",))]) for i in busy]
    job = _item("multi", size, tuple(f"other-GPU-{i}" for i in range(size)))
    bins += [GpuBin(f"m{k}", "L40S-48GB", "exclusive", [job]) for k in range(size)]
    assign_gpus(bins, gpus, topology)
    given_to = [b.original_uuid for b in bins if b.items[0] is job]
    assert len(set(given_to)) == size and all(given_to)
    node = topology.nodes[0]
    # no set of its GPUs and the GPUs the plan leaves free is more local than the one it gets
    others = {b.original_uuid for b in bins if b.items[0] is not job}
    free = [g.uuid for g in gpus if g.uuid not in others]
    best = node.worst(best_set(node, free, size) or ())[0]
    assert node.worst(given_to)[0] == best
    if best <= Tier.PCIE:  # a set under one switch exists: the job is never split across switches
        assert len({switches[node.index[u]] for u in given_to}) == 1


def _item(job: str, gpus: int, origin: tuple[str, ...]) -> Item:
    return Item(
        job_id=job,
        kind="exclusive",
        model="L40S-48GB",
        start=0.0,
        end=3600.0,
        gpus=gpus,
        memory=1.0,
        sm=0.9,
        load=0.9,
        used_hours=float(gpus),
        origin_model="L40S-48GB",
        origin_mode="exclusive",
        origin_uuids=origin,
    )


# --- the PromQL path reads the same topology --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
def test_prometheus_path_gives_the_same_topology_findings(pcie_split, tmp_path, capsys, engine, monkeypatch):
    use_prometheus(engine, monkeypatch)
    backfill_openmetrics(pcie_split / "metrics.om", tmp_path / "db")
    end = START + 6 * 3600
    args = ["--window", "7h", "--end", str(end), "--format", "json"]  # the whole history on both paths
    with prometheus(tmp_path, [], storage=tmp_path / "db", extra_args=["--query.lookback-delta=30s"]) as api:
        assert main(["recommend", "--prometheus", api.base_url, "--step", "300s", *args]) == 0
        via_prom = json.loads(capsys.readouterr().out)
    assert main(["recommend", "--history", str(pcie_split), *args]) == 0
    via_files = json.loads(capsys.readouterr().out)
    pick = ("job_id", "action", "topology_link", "topology_local_gpus", "finding")
    assert [[j[k] for k in pick] for j in via_prom["jobs"]] == [
        [j[k] for k in pick] for j in via_files["jobs"]
    ]
    assert any(j["topology_link"] == "system" for j in via_prom["jobs"])
