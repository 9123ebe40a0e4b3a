"""What the NVIDIA device plugin runs on one Kubernetes node after the plan: its sharing and replicas.

The plugin applies one sharing strategy to every full GPU of a node (its `devices` subsets are
ignored), refuses MPS beside MIG devices, and its MPS control daemon gives every client
`100 // replicas` percent of the threads: a client can only tighten that, and the plan does not
ask pods to (analyzer/validate/device_plugin.py, /work/shared/reference/rightsizing.md section 4).
So a node's planned MPS is what runs only where all its shared GPUs are MPS, it keeps no whole or
MIG GPU, and no client is planned above the equal split of threads or memory (the daemon pins
each client to total / replicas of memory, and a client can only lower that); anything else is
time-sliced.

This decision is made once, here: the plan step that makes the plan say what will run
(`planasrun.py`) and `emit`, which writes the node's config, both ask `node_sharing`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpulens.analyzer import hosts as fleet
from gpulens.analyzer.hosts import Adjustment, Family, Orchestrator, PlacedGpu, Placement
from gpulens.analyzer.nodestate import Changes, Mode
from gpulens.analyzer.validate import device_plugin as dp
from gpulens.catalog import MIB, model_for_nvml_name

DEFAULT_CONFIG = "gpulens-exclusive"
THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PINNED_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"

# the adjustments by which a node's planned MPS becomes time-slicing
TO_TIME_SLICING = frozenset(
    {"mps-beside-whole", "mps-beside-time-slicing", "mps-equal-split", "mps-memory-split"}
)


class PluginSharing(StrEnum):
    """The device plugin's sharing strategy for a node (its config's `sharing`, or none)."""

    EXCLUSIVE = "exclusive"
    MPS = "mps"
    TIME_SLICING = "time-slicing"


@dataclass(frozen=True)
class NodeSharing:
    """One node's device-plugin setting after the plan, and what had to change for it."""

    host: str
    sharing: PluginSharing
    replicas: int  # 1 when exclusive
    mig: bool  # MIG GPUs on the node after the plan (`migStrategy: mixed`)
    adjustments: tuple[Adjustment, ...] = ()

    @property
    def key(self) -> str:
        """The ConfigMap key of its config (nodes with the same setting share one)."""
        if self.sharing is PluginSharing.EXCLUSIVE:
            return "gpulens-mig-mixed" if self.mig else DEFAULT_CONFIG
        return f"gpulens-{self.sharing.value}-{self.replicas}" + ("-mig" if self.mig else "")

    def config(self) -> dict[str, Any]:
        """The device plugin's config (api/config/v1) for this setting."""
        flags = {"migStrategy": "mixed" if self.mig else "none"}
        if self.sharing is PluginSharing.EXCLUSIVE:
            return {"version": "v1", "flags": flags}
        block = {
            "failRequestsGreaterThanOne": True,
            "resources": [{"name": dp.FULL_GPU_RESOURCE, "replicas": self.replicas}],
        }
        strategy = "mps" if self.sharing is PluginSharing.MPS else "timeSlicing"
        return {"version": "v1", "flags": flags, "sharing": {strategy: block}}

    @property
    def thread_percentage(self) -> int | None:
        """The thread share the plugin's MPS control daemon gives each client (None: no MPS)."""
        return 100 // self.replicas if self.sharing is PluginSharing.MPS else None


def is_mig(gpu: PlacedGpu) -> bool:
    """Whether a placed GPU is planned as MIG with slices."""
    return gpu.entry.get("sharing") == "mig" and bool(gpu.entry.get("mig_layout"))


def family_after(gpu: PlacedGpu, delta: Changes, windows: Mapping[str, tuple[float, float]]) -> Family:
    """The sharing family a placed GPU has after the plan: a GPU left as it is keeps its own."""
    if gpu.family is not Family.UNCHANGED:
        return gpu.family
    now = delta.now.get(gpu.uuid)
    if now is not None:
        return now.family
    return Family.TIME_SLICING if fleet.concurrent_jobs(gpu.entry, windows) > 1 else Family.WHOLE


def mig_after(gpu: PlacedGpu, delta: Changes) -> bool:
    """Whether a placed GPU is in MIG mode after the plan."""
    if gpu.family is Family.UNCHANGED:
        now = delta.now.get(gpu.uuid)
        return now is not None and now.mode is Mode.MIG
    return is_mig(gpu)


def _clients(gpus: list[PlacedGpu]) -> list[tuple[str, int, int]]:
    """(job, planned thread percentage, planned pinned limit) of every MPS client on `gpus`."""
    return [
        (str(c["job_id"]), int(c.get(THREAD_PERCENTAGE) or 0), int(c.get(PINNED_MEM_LIMIT) or 0))
        for g in gpus
        for c in g.entry.get("mps_clients", [])
    ]


def node_sharing(
    host: str, placed: list[PlacedGpu], windows: Mapping[str, tuple[float, float]], delta: Changes
) -> NodeSharing:
    """The device plugin's setting for `host`, whose placed GPUs are `placed`, after the plan (a
    GPU left as it is keeps its mode).

    Nothing shared -> exclusive (`migStrategy: mixed` with MIG GPUs); only MPS GPUs -> MPS with
    replicas = most clients on one GPU (at most the plugin's MPS client limit), unless a client
    is planned above the equal split of threads or memory; anything else shared -> time-slicing.
    Each time a planned MPS GPU becomes time-sliced an `Adjustment` names why; so does a node
    whose whole GPUs can only stay whole while nothing else is scheduled on them (`shared-node`).
    """
    mig = any(mig_after(g, delta) for g in placed)
    families = {id(g): family_after(g, delta, windows) for g in placed}
    shared = [g for g in placed if families[id(g)] in (Family.MPS, Family.TIME_SLICING)]
    if not shared:
        return NodeSharing(host, PluginSharing.EXCLUSIVE, 1, mig)
    replicas = max(max(2, fleet.concurrent_jobs(g.entry, windows)) for g in shared)
    mps = [g for g in shared if families[id(g)] is Family.MPS]
    whole = [g for g in placed if families[id(g)] is Family.WHOLE]
    mps_jobs = tuple(j for g in mps for j in g.jobs)
    adjustments: list[Adjustment] = []
    sharing = PluginSharing.TIME_SLICING
    if mps and whole:
        adjustments.append(
            Adjustment(
                "mps-beside-whole",
                host,
                mps_jobs,
                f"{host} also runs whole GPUs{' and MIG' if mig else ''}, and the device plugin's "
                "MPS shares every GPU of a node (and not beside MIG): its shared GPUs are "
                "time-sliced instead",
            )
        )
    elif mps and len(mps) < len(shared):
        adjustments.append(
            Adjustment(
                "mps-beside-time-slicing",
                host,
                mps_jobs,
                f"{host} also has time-sliced GPUs, and the device plugin shares every GPU of a node "
                "one way: its MPS GPUs are time-sliced too",
            )
        )
    elif mps:
        model = model_for_nvml_name(mps[0].model)
        replicas = min(replicas, dp.mps_max_clients(model.cuda_compute_capability if model else None))
        clients = _clients(mps)
        over = tuple(j for j, pct, _ in clients if pct > 100 // replicas)
        # the control daemon pins every client to total / replicas by default, and a client can
        # only lower its own limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT): one that needs more fails
        # to allocate, so the node cannot run that MPS
        per_replica = model.memory_bytes // replicas // MIB * MIB if model is not None else 0  # whole MiB
        short = tuple(j for j, _, limit in clients if model is not None and limit > per_replica)
        if over:
            adjustments.append(
                Adjustment(
                    "mps-equal-split",
                    host,
                    over,
                    f"the device plugin gives each of {replicas} MPS clients {100 // replicas} % of the "
                    f"threads, below the plan's share for {', '.join(over)}: {host} is time-sliced "
                    "instead (no thread caps; under Slurm the per-job MPS shares stay)",
                )
            )
        elif short:
            largest = max(limit for _, _, limit in clients)
            adjustments.append(
                Adjustment(
                    "mps-memory-split",
                    host,
                    short,
                    f"the device plugin's MPS control daemon pins each of {replicas} clients to "
                    f"{per_replica // MIB} MiB of memory (total / replicas), below what the plan gives "
                    f"{', '.join(short)} (up to {largest // MIB} MiB), and a client can only lower its "
                    f"own limit: {host} is time-sliced instead (no memory limits)",
                )
            )
        else:
            sharing = PluginSharing.MPS
    if whole:
        jobs = tuple(j for g in whole for j in g.jobs)
        adjustments.append(
            Adjustment(
                "shared-node",
                host,
                jobs,
                f"the device plugin shares every GPU of a node: on {host}, "
                f"{', '.join(jobs) or 'the whole GPUs'} keep a GPU to themselves only while nothing "
                "else is scheduled on it (a node of their own, or a taint, makes that certain)",
            )
        )
    return NodeSharing(host, sharing, replicas, mig, tuple(adjustments))


def plugin_nodes(
    placement: Placement,
    windows: Mapping[str, tuple[float, float]],
    delta: Changes,
    hosts: Iterable[str] | None = None,
) -> list[NodeSharing]:
    """The setting of every node the plan changes that the device plugin serves (not Slurm's);
    `hosts`: of these nodes instead (changed or not), Slurm's still left out."""
    wanted = delta.hosts if hosts is None else frozenset(hosts)
    placed: dict[str, list[PlacedGpu]] = {}  # grouped once: a fleet has thousands of nodes
    for gpu in placement.gpus:
        placed.setdefault(gpu.host, []).append(gpu)
    return [
        node_sharing(host, sorted(placed.get(host, []), key=lambda g: g.index), windows, delta)
        for host in placement.inventory.hosts()
        if placement.inventory.orchestrator(host) is not Orchestrator.SLURM and host in wanted
    ]
