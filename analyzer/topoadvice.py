"""The topology finding: a multi-GPU job whose GPUs talk through a slower link than its node offers.

A job is flagged when the worst link among its GPU pairs is in a worse tier (`topology.Tier`)
than the best that as many GPUs of its model on its node reach (so an 8-GPU job on a two-switch
PCIe box, or any job on an all-NVLink DGX, never is). The penalty comes from the reference's
figures (thresholds `topology.*`); the alternative is the most local set of GPUs on the same node
that are free in the plan, its own, or held by one single-GPU whole-GPU job that can take a GPU
left free (named in the advice).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulens.analyzer.bins import UNCHANGED
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.plan import Plan
from gpulens.analyzer.thresholds import Thresholds
from gpulens.analyzer.topology import LOCAL, WORDS, Link, NodeTopology, Tier, Topology, best_set


@dataclass(frozen=True)
class Advice:
    """What the finding says about one job."""

    link: Link  # its worst pair's link
    tier: Tier
    best: Tier  # the best tier its node offers that many GPUs of its model
    alternative: tuple[int, ...]  # GPU indexes of the more local set; () when none is free
    loss_gpu_hours: float  # the rank figure: its GPU-hours x topology.misaligned_loss
    text: str


@dataclass(frozen=True)
class Occupancy:
    """Who holds each GPU after the plan (`Plan.layout`), and each GPU's model."""

    jobs: Mapping[str, tuple[str, ...]]  # uuid -> jobs
    single_whole: frozenset[str]  # jobs on exactly one GPU of their own, not shared
    models: Mapping[str, str]  # uuid -> model, used and freed GPUs alike


def occupancy(plan: Plan, running: Mapping[str, str] | None = None) -> Occupancy:
    """From the plan's layout; `running` (job -> how it shares now) tells which job alone on a GPU
    the plan keeps as it is (`unchanged`) runs there whole, so it can make room like a moved one."""
    running = running or {}
    jobs: dict[str, tuple[str, ...]] = {}
    models: dict[str, str] = {}
    gpus_of: dict[str, int] = {}
    alone: set[str] = set()
    for entry in plan.layout:
        uuid = str(entry.get("uuid", ""))
        members = tuple(str(j) for j in entry["jobs"])
        for job in members:
            gpus_of[job] = gpus_of.get(job, 0) + 1
        if uuid:
            jobs[uuid] = members
            models[uuid] = str(entry.get("model", ""))
        sharing = entry.get("sharing")
        if len(members) == 1 and (
            sharing == Kind.EXCLUSIVE or (sharing == UNCHANGED and running.get(members[0]) == Kind.EXCLUSIVE)
        ):
            alone.add(members[0])
    for gpu in plan.freed:
        models.setdefault(str(gpu.get("uuid", "")), str(gpu.get("model", "")))
    return Occupancy(jobs, frozenset(j for j in alone if gpus_of.get(j) == 1), models)


def _penalty(tier: Tier, best: Tier, th: Thresholds) -> str:
    t = th.topology
    if best == Tier.NVLINK:
        less = 1 - t.pcie_allreduce_gbps / t.nvlink_allreduce_gbps if t.nvlink_allreduce_gbps else 0.0
        return (
            f"its all-reduce runs at ~{t.pcie_allreduce_gbps:g} GB/s over PCIe instead of "
            f"~{t.nvlink_allreduce_gbps:g} GB/s over NVLink ({less:.0%} less bandwidth; "
            "topology.pcie_allreduce_gbps, topology.nvlink_allreduce_gbps)"
        )
    where = "NUMA nodes" if tier == Tier.SYSTEM else "PCIe host bridges"
    return (
        f"placement across {where} is reported to cost 30-50 % of a job's communication bandwidth "
        f"(~{t.pcie_allreduce_gbps:g} GB/s all-reduce under one switch at best)"
    )


def advise(row: Any, topology: Topology, occupied: Occupancy, th: Thresholds) -> Advice | None:
    """The finding for one job (a profile row after the plan), or None."""
    uuids = [u for u in str(row.uuids or "").split(",") if u]
    job = str(row.job_id)
    topo = topology.of(uuids) if len(uuids) > 1 else None
    if topo is None:
        return None
    tier, link = topo.worst(uuids)
    model = occupied.models.get(uuids[0], "")
    same = [u for u in topo.index if occupied.models.get(u) == model]
    ideal = best_set(topo, same, len(uuids))
    best = topo.worst(ideal)[0] if ideal is not None else Tier.UNKNOWN
    if link is None or tier <= best:
        return None
    alternative, moves = _alternative(topo, uuids, job, same, occupied, tier)
    allocated = float(row.gpu_hours_allocated) if not math.isnan(float(row.gpu_hours_allocated)) else 0.0
    loss = allocated * th.topology.misaligned_loss
    if alternative:
        where = f"move it to GPUs {topo.names(alternative)} {LOCAL[topo.worst(alternative)[0]]}"
        where += "".join(f" (job {j} moves from GPU {a} to GPU {b})" for j, a, b in moves)
    else:
        where = f"no set of its own and free GPUs on {topo.node or 'its node'} is more local now"
    text = (
        f"topology: its {len(uuids)} GPUs ({topo.names(uuids)}) reach each other through {WORDS[tier]} "
        f"(worst link: {link.value}) where {len(uuids)} GPUs of its node can be {LOCAL[best]}; "
        f"{_penalty(tier, best, th)}; ~{loss:.1f} of its {allocated:.1f} GPU-hours at stake "
        f"(topology.misaligned_loss {th.topology.misaligned_loss:.0%}); {where}"
    )
    alt = tuple(sorted(topo.index[u] for u in alternative))
    return Advice(link, tier, best, alt, round(loss, 3), text)


def _alternative(
    topo: NodeTopology, own: Sequence[str], job: str, same: Sequence[str], occupied: Occupancy, tier: Tier
) -> tuple[tuple[str, ...], list[tuple[str, int, int]]]:
    """The most local set strictly better than `tier`, and the single-GPU jobs it displaces
    (job, from index, to index) onto GPUs it leaves free; ((), []) when there is none."""
    free = [u for u in same if not occupied.jobs.get(u) or set(occupied.jobs[u]) <= {job}]
    movable = {
        u: occupied.jobs[u][0]
        for u in same
        if len(occupied.jobs.get(u, ())) == 1
        and occupied.jobs[u][0] in occupied.single_whole
        and occupied.jobs[u][0] != job
    }

    def feasible(chosen: tuple[str, ...]) -> bool:  # every displaced job finds a GPU left free
        return sum(u in movable for u in chosen) <= sum(u not in chosen for u in free)

    def cost(chosen: tuple[str, ...]) -> tuple[int, int]:  # fewest jobs displaced, then most GPUs kept
        return (sum(u in movable for u in chosen), -len(set(chosen) & set(own)))

    chosen = best_set(topo, [*free, *movable], len(own), cost, feasible)
    if chosen is None or not feasible(chosen) or topo.worst(chosen)[0] >= tier:
        return (), []
    # free GPUs first, then the ones this job leaves, lowest index first
    room = sorted((u for u in free if u not in chosen), key=lambda u: (u in own, topo.index[u]))
    shifted = sorted((u for u in chosen if u in movable), key=lambda u: topo.index[u])
    moves = [(movable[u], topo.index[u], topo.index[r]) for u, r in zip(shifted, room, strict=False)]
    return chosen, moves
