"""The plan's layout (its step 4, `plan.py`): each packed GPU put on a real GPU of the inventory,
with its node, jobs, MIG placements, MPS client settings and the interference risk of the jobs that
share it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from gpulens.analyzer import demand, fragmentation
from gpulens.analyzer.bins import KUBERNETES, UNCHANGED, GpuBin, Item, first_fit, is_resident
from gpulens.analyzer.kinds import SHARED, Kind
from gpulens.analyzer.profile import FleetGpu
from gpulens.analyzer.thresholds import Thresholds
from gpulens.analyzer.topology import Tier, Topology, best_set
from gpulens.catalog import model_for_nvml_name
from gpulens.migplacement import place_mig_layout


def assign_gpus(
    bins: list[GpuBin],
    fleet: list[FleetGpu],
    topology: Topology | None = None,
    mix: dict[int, float] | None = None,
    orchestrators: Mapping[str, str] | None = None,
) -> None:
    """Step 4a: every bin onto a real GPU of its model, the one its residents or else its largest
    job use when free; on Kubernetes a node's GPUs keep one sharing family where the fleet has room.
    Between otherwise equal free GPUs, the one whose node's fragmentation for the task `mix` grows
    least (FGD: a GPU of an already broken node before one of a node whole jobs could still use).

    A bin of jobs of one orchestrator (`GpuBin.orchestrator`) goes only to a node of that
    orchestrator (`orchestrators`: node -> orchestrator; a node absent from it is unknown, and
    among GPUs of one sharing family taken after those): a pod cannot run on a Slurm node, nor a
    Slurm job on a Kubernetes node. Without a GPU of such a node left the bin gets none
    (`hosts.place` then keeps its jobs where they run)."""
    free: dict[str, list[FleetGpu]] = {}
    by_uuid = {g.uuid: g for g in fleet}
    orchestrators = orchestrators or {}
    for card in fleet:
        free.setdefault(card.model, []).append(card)
    taken: set[str] = set()
    for gpu in bins:  # held and kept GPUs keep their own uuid
        if gpu.original_uuid:
            taken.add(gpu.original_uuid)
    mix = mix or {1: 1.0}
    left = Counter(g.node for g in fleet if g.uuid not in taken)  # node -> its GPUs no bin has yet
    cost = {n: fragmentation.cost_of_taking(f, mix) for n, f in left.items()}  # kept per pick
    node_family: dict[str, str] = {}  # Kubernetes node -> the one sharing family it gets
    ordered = sorted(bins, key=lambda b: -max((i.used_hours for i in b.items), default=0.0))
    for gpu in ordered:
        if gpu.original_uuid:
            gpu.node = by_uuid[gpu.original_uuid].node if gpu.original_uuid in by_uuid else ""
            continue
        family = gpu.mode if gpu.mode in SHARED else "whole"
        kubernetes = any(i.source == KUBERNETES for i in gpu.items)
        own_kind = gpu.orchestrator

        def other_kind(uuid: str, own_kind: str = own_kind) -> bool:
            """The GPU's node runs another orchestrator's jobs than this bin's."""
            node = orchestrators.get(by_uuid[uuid].node, "") if uuid in by_uuid else ""
            return bool(own_kind) and bool(node) and node != own_kind

        def unknown_kind(uuid: str, own_kind: str = own_kind) -> bool:
            """The GPU's node has no known orchestrator while this bin's jobs have one."""
            return bool(own_kind) and (uuid not in by_uuid or by_uuid[uuid].node not in orchestrators)

        def same_family(uuid: str, family: str = family, kubernetes: bool = kubernetes) -> bool:
            # the device plugin shares every full GPU of a node one way (its `devices` subsets
            # are ignored): MPS, time-sliced and whole GPUs go to separate Kubernetes nodes
            node = by_uuid[uuid].node if uuid in by_uuid else ""
            return not kubernetes or node_family.get(node, family) == family

        # the GPU its residents (jobs that already run this way) share now, else its largest job's
        ranked = sorted(gpu.items, key=lambda i: (not is_resident(i), -i.used_hours))
        wanted = [u for i in ranked for u in i.origin_uuids]
        pick = next(
            (
                u
                for u in wanted
                if u not in taken
                and by_uuid.get(u, FleetGpu("", "", "")).model == gpu.model
                and same_family(u)
                and not other_kind(u)
            ),
            None,
        )
        if pick is None:
            nodes = {by_uuid[u].node for u in wanted if u in by_uuid}
            pool = [g for g in free.get(gpu.model, []) if g.uuid not in taken and not other_kind(g.uuid)]
            # its jobs' own GPU before another where none is of its family (a Kubernetes node
            # the plugin shares one way): moving a whole job to another GPU of it gains nothing
            own = set(wanted)
            pool.sort(
                key=lambda g: (
                    not same_family(g.uuid),
                    unknown_kind(g.uuid),
                    g.uuid not in own,
                    g.node not in nodes,
                    cost[g.node],
                    g.node,
                    g.uuid,
                )
            )
            pick = pool[0].uuid if pool else None
        if pick is not None:
            taken.add(pick)
            gpu.original_uuid, gpu.node = pick, by_uuid[pick].node
            left[gpu.node] -= 1
            cost[gpu.node] = fragmentation.cost_of_taking(left[gpu.node], mix)
            if kubernetes:
                node_family.setdefault(gpu.node, family)
    if topology is not None and topology.nodes:
        _keep_local(bins, by_uuid, topology, node_family, orchestrators)


def _keep_local(
    bins: list[GpuBin],
    by_uuid: dict[str, FleetGpu],
    topology: Topology,
    node_family: dict[str, str],
    orchestrators: Mapping[str, str],
) -> None:
    """Step 4b: a multi-GPU job the plan moves gets the most local GPUs it can (best worst link:
    one NVLink domain, else one PCIe switch, else one NUMA node), among the GPUs it was given and
    those no bin uses, of its model (on Kubernetes, on nodes that keep whole GPUs; never on a node
    of another orchestrator than its own). A job that stays where it runs is left alone: moving it
    is the topology finding's advice, not the plan's."""
    used = {b.original_uuid for b in bins if b.original_uuid}
    groups: dict[str, list[GpuBin]] = {}
    for gpu in bins:
        for item in gpu.items:
            if item.gpus > 1 and gpu.mode != UNCHANGED:
                groups.setdefault(item.job_id, []).append(gpu)
    for job, members in groups.items():
        item = next(i for i in members[0].items if i.job_id == job)
        placed = [b.original_uuid for b in members]
        if len(members) != item.gpus or not all(placed) or set(placed) <= set(item.origin_uuids):
            continue
        if any(len(b.items) != 1 for b in members):  # a GPU it shares over time with another job
            continue
        kubernetes = item.source == KUBERNETES
        own_kind = next((b.orchestrator for b in members if b.orchestrator), "")
        best: tuple[tuple[Tier, int, int, str], tuple[str, ...]] | None = None
        for topo in topology.nodes:
            pool = [
                u
                for u in topo.index
                if u in by_uuid
                and by_uuid[u].model == members[0].model
                and (u not in used or u in placed)
                and (not kubernetes or node_family.get(by_uuid[u].node, "whole") == "whole")
                and (not own_kind or orchestrators.get(by_uuid[u].node, own_kind) == own_kind)
            ]

            def cost(
                chosen: tuple[str, ...], placed: list[str] = placed, item: Item = item
            ) -> tuple[int, int]:
                return (-len(set(chosen) & set(item.origin_uuids)), -len(set(chosen) & set(placed)))

            chosen = best_set(topo, pool, item.gpus, cost)
            if chosen is not None:
                key = (topo.worst(chosen)[0], *cost(chosen), topo.node)
                if best is None or key < best[0]:
                    best = (key, chosen)
        now = topology.of(placed)
        tier_now = now.worst(placed)[0] if now is not None else Tier.UNKNOWN
        if best is None or best[0][0] >= tier_now:
            continue
        target = set(best[1])
        stay = [b for b in members if b.original_uuid in target]
        leave = [b for b in members if b.original_uuid not in target]
        fresh = sorted(target - {b.original_uuid for b in stay})
        for gpu, uuid in zip(leave, fresh, strict=True):
            used.discard(gpu.original_uuid)
            used.add(uuid)
            gpu.original_uuid, gpu.node = uuid, by_uuid[uuid].node


def mig_layouts(bins: list[GpuBin]) -> None:
    for gpu in bins:
        if gpu.mode != Kind.MIG:
            continue
        model = model_for_nvml_name(gpu.model)
        assert model is not None
        placements = place_mig_layout(model, first_fit(i.mig_profile for i in gpu.items))
        gpu.mig_layout = [
            {"profile": p.profile.name, "start": p.start, "job_id": i.job_id}
            for p, i in zip(placements, gpu.items, strict=True)
        ]


def node_groups_of(bins: list[GpuBin], th: Thresholds) -> dict[str, dict[str, Any]]:
    """Group GPUs into nodes per (model, sharing family): device-plugin sharing is per node."""
    per_node = th.plan.gpus_per_node
    families: dict[tuple[str, str], list[GpuBin]] = {}
    for gpu in bins:
        family = gpu.mode if gpu.mode in SHARED else "whole"
        families.setdefault((gpu.model, family), []).append(gpu)
    groups: dict[str, dict[str, Any]] = {}
    for (model, family), members in sorted(families.items()):
        for n, start in enumerate(range(0, len(members), per_node), start=1):
            name = f"{model.lower()}-{family}-{n}"
            chunk = members[start : start + per_node]
            for index, gpu in enumerate(chunk):
                gpu.node_group = name
                gpu.name = f"{name}/gpu{index}"
            groups[name] = {"model": model, "sharing": family, "gpus": [g.name for g in chunk]}
    return groups


def percentile_name(quantile: float) -> str:
    """0.95 -> "p95", 0.99 -> "p99", 1.0 -> "max" (as `sizing_percentile` names them)."""
    return "max" if quantile >= 1.0 else f"p{quantile * 100:g}"


def interference(gpu: GpuBin, th: Thresholds) -> dict[str, float | str]:
    """How the co-located jobs of a shared GPU load it together, and a level.

    Always the largest sum over time of their p95 SM demand and p95 DRAM activity (`*_p95_sum`).
    Where every job has its series (`demand`), what decides: the co-located sum per bin at the
    sizing percentile `1 - compute.max_bind_fraction` (`sm_sum_high`, `dram_sum_high`, named by
    `percentile`) and the largest share of a job's bins where it exceeds the GPU's limit
    (`sm_over_share`: over `mps.max_load` or `time_slicing.max_interference`; `dram_over_share`:
    over `plan.max_dram_load`). On a time-sliced GPU whose jobs all have a duty-cycle series, the
    same for their summed busy time (`busy_sum_high`, `busy_over_share`: over
    `time_slicing.max_interference`; kernels take turns there). The level is "high" when a sum goes
    past its limit more often than `compute.max_bind_fraction` allows (or, by percentiles, when the
    p95 sums exceed 1)."""
    sm_p95, dram_p95 = gpu.max_sum("p95"), gpu.max_sum("dram")
    out: dict[str, float | str] = {"sm_p95_sum": round(sm_p95, 3), "dram_p95_sum": round(dram_p95, 3)}
    sm_series = [i.sm_series for i in gpu.items]
    dram_series = [i.dram_series for i in gpu.items if i.dram_series is not None or i.dram]
    if not gpu.items or any(s is None for s in sm_series) or any(s is None for s in dram_series):
        worst = max(sm_p95, dram_p95)
        out["basis"] = "sum of p95s"
        out["risk"] = "high" if worst > 1.0 else "medium" if worst > 0.7 else "low"
        return out
    quantile = 1.0 - th.compute.max_bind_fraction
    sm_limit = th.mps.max_load if gpu.mode == Kind.MPS else th.time_slicing.max_interference
    sm = demand.colocated([s for s in sm_series if s is not None], sm_limit, quantile)
    dram = demand.colocated([s for s in dram_series if s is not None], th.plan.max_dram_load, quantile)
    over_shares, highs = [sm.over_share, dram.over_share], [sm.high, dram.high]
    out.update(
        basis="co-located series",
        percentile=percentile_name(quantile),
        sm_sum_high=round(sm.high, 3),
        sm_over_share=round(sm.over_share, 4),
        dram_sum_high=round(dram.high, 3),
        dram_over_share=round(dram.over_share, 4),
    )
    busy_series = [i.busy_series for i in gpu.items]
    if gpu.mode == Kind.TIME_SLICING and all(s is not None for s in busy_series):
        busy = demand.colocated(
            [s for s in busy_series if s is not None], th.time_slicing.max_interference, quantile
        )
        out.update(busy_sum_high=round(busy.high, 3), busy_over_share=round(busy.over_share, 4))
        over_shares.append(busy.over_share)
    over = max(over_shares) > th.compute.max_bind_fraction + 1e-12
    out["risk"] = "high" if over else "medium" if max(highs) > 0.7 else "low"
    return out


def gpu_entry(gpu: GpuBin, window_hours: float, th: Thresholds) -> dict[str, Any]:
    used_hours = sum(i.used_hours / max(i.gpus, 1) for i in gpu.items)
    entry: dict[str, Any] = {
        "gpu": gpu.name,
        "model": gpu.model,
        "node_group": gpu.node_group,
        "node": gpu.node,
        "sharing": gpu.mode,
        "jobs": [i.job_id for i in gpu.items],
        "projected_utilization": round(used_hours / window_hours, 4),
        "memory_committed_bytes": int(gpu.max_sum("memory")) if gpu.mode in SHARED else None,
    }
    if gpu.mode in SHARED:
        entry["interference"] = interference(gpu, th)
    if gpu.mode == Kind.MIG:
        entry["mig_layout"] = gpu.mig_layout
    if gpu.mode == Kind.MPS:
        entry["mps_clients"] = [
            {
                "job_id": i.job_id,
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": i.thread_pct,
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": i.memory_limit,
            }
            for i in gpu.items
        ]
    if gpu.mode == Kind.TIME_SLICING:
        entry["replicas"] = gpu.concurrency()
    if gpu.original_uuid:
        entry["uuid"] = gpu.original_uuid
    return entry
