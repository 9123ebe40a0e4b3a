"""The plan after the tools' limits: what the device plugin will actually run, said by the plan itself.

The packer plans MPS per GPU, with a thread percentage per client. On Kubernetes the NVIDIA device
plugin cannot always run that (`pluginsharing.py`): a node that keeps whole or MIG GPUs, or
time-sliced ones, or a client planned above the plugin's equal split (of threads or memory) is
time-sliced; where it does run MPS, every client gets `100 // replicas` of the threads, not its
own share. `emit` writes the files that way, so the plan must say the same, or the report
promises caps that will not exist and a fleet that applied the files is proposed MPS again
next week (no fixed point).

`as_run` makes that one decision per Kubernetes node, before anything is written, and returns
the plan as it will run:

- a node time-sliced instead: its planned MPS GPUs become time-slicing GPUs in the layout (no
  `mps_clients`; `planned_sharing` and `adjustment` say what was planned and why), and each of
  their jobs is moved to time-slicing with the adjustment's message as its reason (`plan.moved`,
  which `changes.annotate` applies to jobs.json, the job tables and the changes per node);
- a node that runs MPS: each client's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` is the plugin's
  `100 // replicas`; a smaller planned share stays as the client's `sized_thread_percentage`
  (the job's `mps_sized_thread_percentage`): its sized demand, not its cap. This holds on a node
  the plan leaves as it runs too (replicas counted as emit counted them when it set the node up),
  so next week's plan and its dead band see the cap that runs; such a node is never time-sliced
  here, since the plan changes nothing on it.

Slurm nodes are left alone: Slurm's `--gres=mps:<n>` gives each job its own share. Data flows one
way: plan -> this step -> `annotate` / `emit`, and emit, asking the same `node_sharing`, finds
nothing left to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from gpulens.analyzer import frames
from gpulens.analyzer import hosts as fleet
from gpulens.analyzer.emit import FleetContext
from gpulens.analyzer.hosts import Adjustment, Family, Orchestrator, PlacedGpu
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.nodestate import Changes, Mode, changes
from gpulens.analyzer.plan import Plan, build_plan, finite_number, time_sliced_change
from gpulens.analyzer.planinput import time_sliced_fraction
from gpulens.analyzer.pluginsharing import (
    THREAD_PERCENTAGE,
    TO_TIME_SLICING,
    NodeSharing,
    PluginSharing,
    plugin_nodes,
)
from gpulens.analyzer.profile import FleetGpu
from gpulens.analyzer.thresholds import Thresholds
from gpulens.analyzer.topology import Topology

SIZED = "sized_thread_percentage"  # a client's planned share where the plugin gives it more
SIZED_COLUMN = "mps_sized_thread_percentage"  # the same, as the job's column


@dataclass(frozen=True)
class PlanAsRun:
    """The plan as the device plugin will run it, and the changes made to the plan for it (shown
    with emit's own adjustments)."""

    plan: Plan
    adjustments: tuple[Adjustment, ...]


# plans after the first: each one time-slices the jobs of the nodes the one before had to (a
# node's jobs are added once, so it ends; two suffice unless the new plan moves MPS elsewhere)
MAX_REPLANS = 3


def plan_as_run(
    recs: pd.DataFrame,
    th: Thresholds,
    context: FleetContext,
    fleet: list[FleetGpu] | None = None,
    topology: Topology | None = None,
) -> PlanAsRun:
    """The plan, packed knowing which Kubernetes nodes cannot run MPS, as it will run (`as_run`).

    Converting a node's planned MPS to time-slicing after the packing (`as_run`) would leave jobs
    on GPUs the time-slicing limits never judged (more replicas than `time_slicing.max_replicas`),
    and next week, measured time-sliced, the packer would find another layout: no fixed point. So
    where `as_run` time-slices a node, every job running on it now or planned onto it is packed
    again time-sliced instead of MPS (`build_plan`'s `time_sliced`), with the node's reason."""
    refused: dict[str, str] = {}
    run = as_run(build_plan(recs, th, fleet, topology), recs, context)
    for _ in range(MAX_REPLANS):
        more = {job: why for job, why in _refused(run, context).items() if job not in refused}
        if not more:
            break
        refused.update(more)
        run = as_run(build_plan(recs, th, fleet, topology, refused), recs, context)
    return run


def _refused(run: PlanAsRun, context: FleetContext) -> dict[str, str]:
    """job -> why MPS cannot run for it: the jobs on each node `as_run` time-sliced (running there
    now, or planned there)."""
    hosts = {a.where: a.message for a in run.adjustments if a.what in TO_TIME_SLICING}
    if not hosts:
        return {}
    slots = context.inventory.by_uuid()
    out: dict[str, str] = {}
    for adjustment in run.adjustments:
        if adjustment.where in hosts:
            out.update(dict.fromkeys(adjustment.jobs, hosts[adjustment.where]))
    for job, uuids in context.job_uuids.items():
        host = next((slots[u].host for u in uuids if u in slots and slots[u].host in hosts), None)
        if host is not None:
            out.setdefault(job, hosts[host])
    return out


def as_run(plan: Plan, recs: pd.DataFrame, context: FleetContext) -> PlanAsRun:
    """The plan with each Kubernetes node's MPS as the device plugin runs it (module docstring);
    `recs` gives the jobs' memory need (their GPU fraction in the mode they get) and, for jobs on
    GPUs the plan keeps as they run, their sized thread percentage."""
    placement = fleet.place(plan.layout, context.inventory, context.job_uuids, context.windows)
    delta = changes(placement, context.now, context.now_known)
    kubernetes = [
        h for h in context.inventory.hosts() if context.inventory.orchestrator(h) is Orchestrator.KUBERNETES
    ]
    nodes = plugin_nodes(placement, context.windows, delta, kubernetes)
    fractions = _memory_fractions(recs)
    sized = _thread_percentages(recs)
    entries: dict[int, dict[str, Any]] = {}  # id(layout entry) -> the entry as it will run
    moved = dict(plan.moved)
    made: list[Adjustment] = []
    on_host: dict[str, list[PlacedGpu]] = {}
    for gpu in placement.gpus:
        on_host.setdefault(gpu.host, []).append(gpu)
    for node in nodes:
        placed = on_host.get(node.host, [])
        mps = [g for g in placed if g.family is Family.MPS]
        changed = node.host in delta.hosts
        if node.sharing is PluginSharing.TIME_SLICING and mps:
            why = next((a for a in node.adjustments if a.what in TO_TIME_SLICING), None)
            if why is None or not changed:  # a node left as it runs keeps its mode
                continue
            made.append(why)
            for gpu in mps:
                entries[id(gpu.entry)] = _time_sliced(gpu, why, context.windows)
                for job in gpu.jobs:
                    moved[job] = time_sliced_change(moved.get(job), why.message, fractions.get(job))
        elif node.sharing is PluginSharing.MPS and node.thread_percentage is not None:
            share = node.thread_percentage
            raised: list[tuple[str, int]] = []  # (job, its planned share) where it differs
            for gpu in mps:
                entries[id(gpu.entry)] = _equal_share(gpu, share)
                raised += [
                    (str(c["job_id"]), int(c.get(THREAD_PERCENTAGE) or 0))
                    for c in gpu.entry.get("mps_clients", [])
                ]
            # GPUs the plan keeps as they run MPS now: their jobs run under the same share
            raised += [
                (job, sized[job])
                for gpu in placed
                if gpu.family is Family.UNCHANGED and _runs_mps(gpu, delta)
                for job in gpu.jobs
                if job in sized
            ]
            raised = [(job, pct) for job, pct in raised if pct != share]
            for job, pct in raised:
                moved[job] = _job_equal_share(moved.get(job), node, pct, fractions.get(job))
            if raised and changed:  # a node left as it runs: said on its jobs, not as a change
                made.append(
                    Adjustment(
                        "mps-equal-share",
                        node.host,
                        tuple(job for job, _ in raised),
                        f"the device plugin's MPS control daemon gives each of {node.replicas} clients on "
                        f"{node.host} {share} % of the threads (100 // replicas): the plan's own shares "
                        f"({', '.join(f'{job} {pct} %' for job, pct in raised)}) are those jobs' sized "
                        "demand, not caps",
                    )
                )
    if moved == plan.moved and not entries:
        return PlanAsRun(plan, tuple(made))
    layout = [entries.get(id(e), e) for e in plan.layout]
    return PlanAsRun(
        replace(plan, layout=layout, moved=moved, node_groups=_groups(plan.node_groups, layout)),
        tuple(made),
    )


def _runs_mps(gpu: PlacedGpu, delta: Changes) -> bool:
    now = delta.now.get(gpu.uuid)
    return now is not None and now.mode is Mode.MPS


def _thread_percentages(recs: pd.DataFrame) -> dict[str, int]:
    """job -> the thread percentage recommend (and the dead band) sized it at, where it has one."""
    if not {"job_id", "mps_active_thread_percentage"} <= set(recs.columns):
        return {}
    out: dict[str, int] = {}
    for row in frames.rows(recs[["job_id", "mps_active_thread_percentage"]]):
        pct = finite_number(row.mps_active_thread_percentage)
        if pct is not None and pct > 0:
            out[str(row.job_id)] = int(pct)
    return out


def _memory_fractions(recs: pd.DataFrame) -> dict[str, float]:
    """job -> its memory need as a fraction of the whole GPU it shares (a time-sliced job's GPU
    fraction; a job on a MIG slice now shares the whole GPU)."""
    columns = [c for c in ("job_id", "memory_need_bytes", "gpu_model", "device_memory_bytes") if c in recs]
    if not {"job_id", "memory_need_bytes"} <= set(columns):
        return {}
    out: dict[str, float] = {}
    for row in frames.rows(recs[columns]):
        fraction = time_sliced_fraction(row)
        if fraction is not None:
            out[str(row.job_id)] = fraction
    return out


def _time_sliced(
    gpu: PlacedGpu, why: Adjustment, windows: Mapping[str, tuple[float, float]]
) -> dict[str, Any]:
    """A planned MPS GPU's layout entry as the time-sliced GPU it will be."""
    entry = {k: v for k, v in gpu.entry.items() if k != "mps_clients"}
    entry.update(
        sharing=Kind.TIME_SLICING.value,
        replicas=fleet.concurrent_jobs(gpu.entry, windows),
        planned_sharing=Kind.MPS.value,
        adjustment=why.what,
    )
    return entry


def _equal_share(gpu: PlacedGpu, share: int) -> dict[str, Any]:
    """A planned MPS GPU's layout entry with each client at the plugin's share; a different planned
    share kept as the client's sized demand."""
    clients = []
    for client in gpu.entry.get("mps_clients", []):
        planned = int(client.get(THREAD_PERCENTAGE) or 0)
        clients.append({**client, THREAD_PERCENTAGE: share, **({SIZED: planned} if planned != share else {})})
    return {**gpu.entry, "mps_clients": clients}


def _noted(before: Mapping[str, Any] | None, note: str) -> str:
    earlier = str((before or {}).get("note") or "")
    return f"{earlier}; {note}" if earlier else note


def _job_equal_share(
    before: Mapping[str, Any] | None, node: NodeSharing, planned: int, memory: float | None
) -> dict[str, Any]:
    """A job's plan entry (`plan.moved`) on a node whose MPS clients all get the plugin's share."""
    share = node.thread_percentage or planned
    change = dict(before or {})  # a job the plan keeps as it runs stays kept
    change.update(
        recommendation=Kind.MPS.value,
        mps_active_thread_percentage=share,
        note=_noted(
            before,
            f"the device plugin gives each of {node.replicas} MPS clients on {node.host} {share} % of the "
            f"threads; {planned} % is its sized demand",
        ),
    )
    change[SIZED_COLUMN] = planned
    if memory is not None:
        change["gpu_fraction"] = max(memory, share / 100)  # as recommend sizes an MPS job
    return change


def _groups(groups: Mapping[str, dict[str, Any]], layout: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Node groups whose every GPU the step time-sliced say so."""
    sharing = {str(e.get("gpu")): e.get("sharing") for e in layout}
    out = {}
    for name, group in groups.items():
        kinds = {sharing.get(str(g)) for g in group.get("gpus", [])}
        if group.get("sharing") == Kind.MPS and kinds == {Kind.TIME_SLICING.value}:
            group = {**group, "sharing": Kind.TIME_SLICING.value}
        out[name] = group
    return out
