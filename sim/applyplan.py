"""`gpulens sim apply-plan`: the scenario as it runs after an SRE applied a report's plan.

Week over week needs a week 2 in which the plan was applied the way each tool applies it: the plan
(`plan.json`: per GPU its mode, jobs, MIG slices and MPS client settings, and the GPUs it frees)
is read against the week-1 scenario's YAML, and the result is the same YAML with

- each GPU the plan reconfigures in its new mode: an MPS server (the job's processes become
  `mps_client`s with the planned `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and
  `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` in their environment), a MIG layout re-sliced as the plan
  places it (checked against the report's `config/mig-parted.yaml` when it has one), or a plain
  GPU (time-slicing, whole);
- on Kubernetes, MPS as the device plugin runs it (`nodesharing.py`, from the report's
  `config/device-plugin-configmap.yaml` and `node-labels.sh`): the pods get no thread percentage
  or pinned memory limit of their own, the GPU's control daemon gives each client 100 / replicas
  percent of the threads and total / replicas of the memory in whole MiB (`mps.pinned_memory_limit`;
  its pipe directory the plugin's), and a node whose selected config time-slices gets plain GPUs
  instead;
- freed GPUs empty (their MIG layout cleared where mig-parted.yaml disables MIG on them);
- every moved job rolled out: on Kubernetes a Deployment's pod gets a new ReplicaSet hash and
  suffix, a Job's pod a new suffix, a StatefulSet's (or a bare) pod keeps its name, and every
  such pod a new UID and container; a Slurm job a new job id with the same user, account and
  name (the tasks of one array a new array id together, each its task index), as a resubmission;
  its processes new pids, started at week 2's start (relative time 0), the same workload;
- jobs the plan leaves where they run, and their GPUs, exactly as they were (the same YAML): the
  jobs of a GPU it keeps `unchanged`, and MPS clients it keeps on a GPU whose clients do not
  change (the emitted configs leave that GPU alone, so their caps are not re-set).

Moving a job never changes what it asks for (its workload): only what the GPU lets it have. For
tests, `grow` scales one job's SM demand in week 2, so a moved job can be made to bind its cap.

A fleet (several nodes' scenarios, simulated together) is applied at once, one output file a node:
a job the plan moves to another node (a pod rolled onto it, a Slurm job requeued there) leaves its
node's scenario and is added to the other's as a move within a node would be (`Crossing`); Slurm
ids are handed out fleet-wide. One node's scenario alone refuses a plan that moves a job across.

The report's plan is read and checked in `reportplan.py` (`read_report`); the command's files, one
node's scenario or a fleet's, are read, applied and written in `applyfiles.py`.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulens.analyzer.workload import pod_owner
from gpulens.catalog import CatalogError, GpuModel
from gpulens.migplacement import place_mig_layout
from gpulens.sim.defaults import (
    default_gpu_instance_id,
    default_uid,
    make_container_id,
    make_uuid,
    stable_hex,
)
from gpulens.sim.nodesharing import DEVICE_PLUGIN_PIPE_DIR, daemon_pinned_limit
from gpulens.sim.reportplan import ApplyPlanError, GpuTarget, ReportPlan, Slot
from gpulens.sim.scenario import (
    PINNED_MEM_LIMIT,
    PIPE_DIRECTORY,
    THREAD_PERCENTAGE,
    KubernetesJob,
    MappingJob,
    ProcessSpec,
    Scenario,
    SlurmJob,
    instance_profiles,
)

MIB = 1024**2
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' alphabet of generated name parts
_GENERATED = re.compile(rf"[{_SAFE}]{{5,10}}")


def job_key(spec: ProcessSpec) -> str | None:
    """The job id the exporter gives a process's job (Kubernetes namespace/pod, Slurm or mapping id)."""
    job = spec.job
    if isinstance(job, KubernetesJob):
        return f"{job.namespace}/{job.pod}"
    if isinstance(job, SlurmJob | MappingJob):
        return job.job_id
    return None


def _current(scenario: Scenario, spec: ProcessSpec) -> Slot:
    gpu = scenario.gpus[spec.gpu]
    if gpu.mig is not None:
        inst = next(i for i in gpu.mig if i.gpu_instance_id == spec.instance)
        return Slot(spec.gpu, "mig", (inst.profile.name, inst.start))
    if gpu.mps is not None:
        return Slot(spec.gpu, "mps", None, spec.sm_cap, spec.memory_limit_bytes)
    return Slot(spec.gpu, "whole")


def _stays(scenario: Scenario, spec: ProcessSpec, slot: Slot) -> bool:
    """Whether the plan leaves the process where and as it runs now. A GPU the plan keeps as it is
    (`unchanged`: its jobs could not all be sized, or its model could not be packed) keeps its
    jobs in their slices and MPS settings, which the plan does not repeat."""
    if slot.mode == "unchanged":
        if slot.gpu != spec.gpu:
            raise ApplyPlanError(
                f"plan.json: layout: expected GPU {slot.gpu}, which the plan keeps unchanged, to hold "
                f"only the jobs that run on it now, found {job_key(spec)} from GPU {spec.gpu}"
            )
        return True
    now = _current(scenario, spec)
    if slot.mode == "mps" and now.mode == "mps":
        # a client staying on an MPS GPU whose clients the plan keeps (else the GPU is changed):
        # the emitted configs leave it alone, so its caps stay what it was started with
        return now.gpu == slot.gpu
    return now == slot


def _gpu_changes(scenario: Scenario, plan: ReportPlan) -> set[int]:
    """GPUs whose configuration the plan changes (every job on them is restarted)."""
    changed = set()
    for index, target in plan.gpus.items():
        gpu = scenario.gpus[index]
        now = "mig" if gpu.mig is not None else "mps" if gpu.mps is not None else "whole"
        if target.mode == "unchanged":
            continue
        if target.mode == "freed":
            if gpu.mps is not None or (gpu.mig is not None and target.clear_mig):
                changed.add(index)
        elif target.mode != now or (
            now == "mig" and sorted((i.profile.name, i.start) for i in gpu.mig or ()) != sorted(target.mig)
        ):
            changed.add(index)
        elif now == "mps" and _jobs_on(scenario, index) != {
            j for j, s in plan.jobs.items() if s.gpu == index
        }:
            changed.add(index)  # other clients: the server's clients restart with the plan's caps
    return changed


def _jobs_on(scenario: Scenario, index: int) -> set[str]:
    return {key for p in scenario.processes if p.gpu == index and (key := job_key(p)) is not None}


def _renamed_pod(pod: str) -> str:
    """The pod's name after a rollout: generated parts (ReplicaSet hash, pod suffix) regenerated,
    a StatefulSet's or bare pod's name kept."""
    owner = pod_owner(pod)
    if owner == pod:
        return pod
    parts = pod[len(owner) + 1 :].split("-")
    fresh = []
    for n, part in enumerate(parts):
        if _GENERATED.fullmatch(part):
            digits = stable_hex("rollout", pod, n, digits=2 * len(part) + 8)
            new = "".join(_SAFE[int(digits[2 * k : 2 * k + 2], 16) % len(_SAFE)] for k in range(len(part)))
            if new == part:
                new = (
                    new[1:] + new[0]
                    if len(set(new)) > 1
                    else _SAFE[(_SAFE.index(new[0]) + 1) % len(_SAFE)] + new[1:]
                )
            part = new
        fresh.append(part)
    return "-".join([owner, *fresh])


class SlurmIds:
    """The job ids resubmitted Slurm jobs take: after the highest id of the scenarios given (one
    controller numbers the jobs of every node of a fleet), an array's moved tasks one new array id."""

    def __init__(self, scenarios: Iterable[Scenario]) -> None:
        ids = [
            int(p.job.job_id.split("_")[0])
            for scenario in scenarios
            for p in scenario.processes
            if isinstance(p.job, SlurmJob)
        ]
        self.next = max(ids, default=1000) + 1
        self.renamed: dict[str, str] = {}  # job id (an array's: the array's) -> its new one

    def resubmitted(self, job_id: str) -> str:
        array, sep, task = job_id.partition("_")
        if array not in self.renamed:
            self.renamed[array] = str(self.next)
            self.next += 1
        return self.renamed[array] + sep + task


class _Applier:
    """Rewrites the scenario's YAML: one instance per apply, holding the pids and ids handed out."""

    def __init__(
        self, data: dict[str, Any], scenario: Scenario, plan: ReportPlan, slurm: SlurmIds | None = None
    ) -> None:
        self.data, self.scenario, self.plan = data, scenario, plan
        pids = [p.pid for p in scenario.processes]
        pids += [pid for g in scenario.gpus if g.mps for pid in (g.mps.server_pid, g.mps.restart_pid)]
        self.next_pid = max(pids, default=1000) + 1
        self.slurm = slurm or SlurmIds([scenario])

    def pid(self) -> int:
        self.next_pid += 1
        return self.next_pid - 1

    def job(self, raw: dict[str, Any], spec: ProcessSpec) -> dict[str, Any]:
        job = spec.job
        if isinstance(job, KubernetesJob):
            pod = _renamed_pod(job.pod)
            k = dict(raw["kubernetes"])
            k.update(
                pod=pod,
                uid=make_uuid("pod", job.namespace, pod, "rollout", job.pod_uid),
                container_id=make_container_id(job.namespace, pod, f"{job.container} {job.container_id}"),
            )
            return {"kubernetes": k}
        if isinstance(job, SlurmJob):
            s = dict(raw["slurm"])  # user, account and name as before: the same job resubmitted
            s["id"] = self.slurm.resubmitted(job.job_id)
            return {"slurm": s}
        return copy.deepcopy(raw)


def _container_sms(scenario: Scenario, gpu: int, instance: int | None) -> int:
    """The SMs of a process's container: its MIG instance's, else the whole GPU's."""
    g = scenario.gpus[gpu]
    if instance is None:
        return g.model.sm_count
    profile = instance_profiles(g, scenario.faults).get(instance)
    return g.model.sm_count if profile is None else profile.sm_count


def _slot_sms(scenario: Scenario, slot: Slot) -> int:
    model = scenario.gpus[slot.gpu].model
    return model.mig_profile(slot.mig[0]).sm_count if slot.mode == "mig" and slot.mig else model.sm_count


def _compute(scenario: Scenario, gpu: int, sms: int) -> float:
    """What `sms` SMs of `gpu` do per second: SMs x the model's max SM clock, the clock the engine
    runs a loaded GPU at (and the analyzer's `capability`, by which it downsizes a job to a smaller
    model). Within one model it is the SMs; an A100 job moved to an L4 (58 SMs at 2040 MHz vs 108
    at 1410) needs 1.29 x its share, not the 1.86 the SMs alone say."""
    return float(sms * scenario.gpus[gpu].model.max_sm_clock_mhz)


def _grown(
    raw: dict[str, Any], spec: ProcessSpec, factor: float, job: str, rescale: float = 1.0
) -> dict[str, Any]:
    """The workload with its SM demand scaled by `factor` (`--grow`: the busy time or duty it
    implies grows with it) and put on its new container's scale (`rescale`: the compute it had
    over the compute it now has, `_compute`; the same work is the same SM cycles, a larger share
    of a slice or of a smaller, slower model, a smaller one of a whole GPU; its kernels run as long
    as before). A demand over a whole slice is held to it."""
    w = copy.deepcopy(raw)
    sm = spec.workload.sm * factor
    if sm > 1:
        raise ApplyPlanError(f"--grow {job}={factor:g}: expected an SM demand of at most 1, found {sm:g}")
    sm = min(1.0, sm * rescale)
    w["sm"] = round(sm, 6)
    for key in ("tensor", "occupancy"):  # given as shares of the container's SMs, like sm
        value = getattr(spec.workload, key)
        if value is not None:
            w[key] = round(min(sm, value * factor * rescale), 6)
    for key, value in (("busy", spec.workload.busy), ("duty", spec.workload.duty)):
        if value is not None:
            w[key] = round(min(1.0, max(value * factor, sm)), 6)
    return w


@dataclass(frozen=True)
class Arrival:
    """A process of a job the plan moves onto this node from another node's scenario."""

    raw: dict[str, Any]  # its entry in that scenario's YAML
    spec: ProcessSpec
    source: Scenario  # the node it runs on now


@dataclass(frozen=True)
class Crossing:
    """What a fleet's other nodes mean for one node's apply: the jobs the plan moves onto it from
    them, and its jobs the plan moves to them (they leave its scenario)."""

    arrivals: tuple[Arrival, ...] = ()
    departures: frozenset[str] = frozenset()


def apply_plan(
    data: dict[str, Any],
    scenario: Scenario,
    plan: ReportPlan,
    grow: Mapping[str, float] | None = None,
    crossing: Crossing | None = None,
    slurm: SlurmIds | None = None,
) -> dict[str, Any]:
    """The scenario's YAML data after the plan (module docstring); `data` is not modified. Without
    `crossing` (one node) a plan that moves a job across nodes is refused."""
    grow = dict(grow or {})
    crossing = crossing or Crossing()
    changed = _gpu_changes(scenario, plan)
    raw_procs = data.get("processes") or []
    known = {job_key(p) for p in scenario.processes}
    arriving = {job_key(a.spec) for a in crossing.arrivals}
    for name in (*plan.jobs, *grow):
        if name not in known | arriving:
            hint = " (a job moved here from another node needs that node's scenario given too)"
            raise ApplyPlanError(
                f"{name!r}: expected a job of scenario {scenario.name}, found none"
                + (hint if name in plan.jobs else "")
            )
    slots = _process_slots(scenario.processes, plan)
    moved: set[str] = set()
    for i, spec in enumerate(scenario.processes):
        key = job_key(spec)
        slot = slots.get(i)
        if slot is None or key is None:
            continue
        if slot.gpu in changed or not _stays(scenario, spec, slot) or key in grow:
            moved.add(key)  # a multi-GPU job moves whole: every rank restarts
    applier = _Applier(data, scenario, plan, slurm)
    daemon = plugin_daemon(scenario, plan, [a.spec for a in crossing.arrivals])
    out = {k: copy.deepcopy(v) for k, v in data.items() if k not in ("gpus", "processes", "faults")}
    out["name"] = f"{scenario.name}-applied"
    out["gpus"] = _gpus(data["gpus"], scenario, plan, changed, applier, daemon)
    processes = []
    for i, (raw, spec) in enumerate(zip(raw_procs, scenario.processes, strict=True)):
        key = job_key(spec)
        if key in plan.reclaimed or key in crossing.departures:
            continue
        if key is not None and key not in plan.jobs and key in plan.elsewhere:
            raise ApplyPlanError(
                f"plan.json: layout: {key} moves from {scenario.hostname} ({scenario.source}) to "
                f"{', '.join(sorted(plan.elsewhere[key]))}: expected that node's scenario given too "
                f"(gpulens sim apply-plan A.yaml B.yaml ... --out DIR), found none"
            )
        if key not in moved:
            if spec.gpu in changed or (plan.gpus.get(spec.gpu, GpuTarget("unchanged")).mode == "freed"):
                raise ApplyPlanError(
                    f"{scenario.source}: processes[{i}]: expected a job the plan places, as GPU {spec.gpu} "
                    f"changes or is freed, found {key or 'a process without a job'}"
                )
            processes.append(copy.deepcopy(raw))
            continue
        processes.append(_moved(raw, spec, slots[i], scenario, applier, grow.get(key), daemon is None))
    processes += _arrived(crossing.arrivals, scenario, plan, applier, grow, daemon is None)
    out["processes"] = processes
    faults = _kept_faults(data.get("faults"), scenario, changed)
    if faults is not None:
        out["faults"] = faults
    return out


def _arrived(
    arrivals: Sequence[Arrival],
    scenario: Scenario,
    plan: ReportPlan,
    applier: _Applier,
    grow: Mapping[str, float],
    own_caps: bool,
) -> list[dict[str, Any]]:
    """The entries of the processes the plan moves onto `scenario`'s node from other nodes: rolled
    out as a move within a node is (`_moved`), the same user (uid) as where they ran."""
    users = applier.data.get("users") or {}
    slots = _process_slots([a.spec for a in arrivals], plan)
    out = []
    for k, arrival in enumerate(arrivals):
        key, spec, slot = job_key(arrival.spec) or "", arrival.spec, slots[k]
        if slot.mode == "unchanged":
            raise ApplyPlanError(
                f"plan.json: layout: expected GPU {slot.gpu} of {scenario.hostname}, which the plan "
                f"keeps unchanged, to hold only the jobs that run on it now, found {key} from "
                f"{arrival.source.hostname}"
            )
        entry = _moved(arrival.raw, spec, slot, scenario, applier, grow.get(key), own_caps, arrival.source)
        if "uid" not in entry and users.get(spec.user, default_uid(spec.user)) != spec.uid:
            entry["uid"] = spec.uid
        out.append(entry)
    return out


@dataclass(frozen=True)
class PluginDaemon:
    """The device plugin's MPS control daemon on a Kubernetes node after the plan: the defaults it
    sets for every client (k8s-device-plugin cmd/mps-control-daemon/mps/daemon.go), which a pod's
    own variables could only lower and the plugin gives pods none of."""

    thread_percentage: int  # 100 // replicas
    replicas: int | None = None  # None: the node keeps the config it runs now
    running_limit: int | None = None  # that config's pinned limit, bytes (None: none)

    def pinned_limit(self, model: GpuModel) -> int | None:
        """Each client's default pinned device memory limit on a GPU of `model`, bytes: total /
        replicas in whole MiB, as the daemon sets it (`<N>M`); where the node keeps its config, the
        limit it runs with."""
        if self.replicas is None:
            return self.running_limit
        return daemon_pinned_limit(model.memory_bytes, self.replicas)


def plugin_daemon(
    scenario: Scenario, plan: ReportPlan, arriving: Sequence[ProcessSpec] = ()
) -> PluginDaemon | None:
    """The device plugin's MPS control daemon on a Kubernetes node after the plan (`nodesharing.py`);
    None on other nodes, whose clients are given the plan's own percentage and pinned limit (Slurm's
    gres/mps share, or the job's environment). `arriving`: processes the plan moves onto the node
    from other nodes (pods make a node a Kubernetes one too)."""
    if not any(isinstance(p.job, KubernetesJob) for p in (*scenario.processes, *arriving)):
        return None
    if plan.sharing is not None:
        return PluginDaemon(plan.sharing.thread_percentage, plan.sharing.replicas)
    # the node keeps its config: its daemon's settings as its servers run them (MPS's own default,
    # where none runs: 100 %, no pinned limit)
    running = [g.mps for g in scenario.gpus if g.mps is not None]
    limits = [m.pinned_memory_limit for m in running if m.pinned_memory_limit is not None]
    return PluginDaemon(
        int(min(m.active_thread_percentage for m in running)) if running else 100,
        running_limit=min(limits) if limits else None,
    )


def _process_slots(processes: Sequence[ProcessSpec], plan: ReportPlan) -> dict[int, Slot]:
    """Index in `processes` (of one node) -> where the plan runs it. A multi-GPU job's ranks keep
    their order: the rank on its k-th lowest GPU now goes to the k-th lowest GPU the plan gives it."""
    gpus_of: dict[str, list[int]] = {}
    for spec in processes:
        key = job_key(spec)
        if key in plan.multi and spec.gpu not in gpus_of.setdefault(key, []):
            gpus_of[key].append(spec.gpu)
    out: dict[int, Slot] = {}
    for i, spec in enumerate(processes):
        key = job_key(spec)
        if key is None or key not in plan.jobs:
            continue
        if key not in plan.multi:
            out[i] = plan.jobs[key]
            continue
        now, target = sorted(gpus_of[key]), plan.multi[key]
        if len(now) != len(target):
            raise ApplyPlanError(
                f"plan.json: layout: expected job {key!r} on as many GPUs as it runs on now ({len(now)}), "
                f"found {len(target)}"
            )
        out[i] = target[now.index(spec.gpu)]
    return out


def _moved(
    raw: dict[str, Any],
    spec: ProcessSpec,
    slot: Slot,
    scenario: Scenario,
    applier: _Applier,
    factor: float | None,
    own_caps: bool = True,
    source: Scenario | None = None,
) -> dict[str, Any]:
    """A process of a job the plan moves, restarted where it goes (on `scenario`'s node; `source`:
    the node it runs on now, when another); `own_caps`: an MPS client is given the plan's thread
    percentage and pinned memory limit in its environment (not on a device-plugin node, where the
    control daemon's share and limit hold: the plugin sets no variable in a pod)."""
    entry: dict[str, Any] = {"pid": applier.pid(), "gpu": slot.gpu}
    skip = ("pid", "gpu", "instance", "kind", "start", "end")
    entry.update((k, copy.deepcopy(v)) for k, v in raw.items() if k not in skip)
    if slot.mode == "mig":
        assert slot.mig is not None
        profile = scenario.gpus[slot.gpu].model.mig_profile(slot.mig[0])
        entry["instance"] = default_gpu_instance_id(scenario.gpus[slot.gpu].model, profile, slot.mig[1])
    environ = {
        k: v
        for k, v in (raw.get("environ") or {}).items()
        if k not in (THREAD_PERCENTAGE, PINNED_MEM_LIMIT, PIPE_DIRECTORY)  # what the new GPU's MPS sets
    }
    if slot.mode == "mps":
        entry["kind"] = "mps_client"
        if slot.sm_cap is not None and own_caps:
            environ[THREAD_PERCENTAGE] = f"{slot.sm_cap * 100:g}"
        if slot.memory_limit is not None and own_caps:
            environ[PINNED_MEM_LIMIT] = f"0={slot.memory_limit // MIB}M"
    elif spec.kind == "graphics":
        entry["kind"] = "graphics"
    if environ:
        entry["environ"] = environ
    else:
        entry.pop("environ", None)
    start = max(0.0, spec.start)
    entry["start"] = f"{start:g}s"
    if not math.isinf(spec.end):
        entry["end"] = f"{spec.end + start - spec.start:g}s"
    if spec.job is not None:
        entry["job"] = applier.job(raw["job"], spec)
    was = source or scenario
    rescale = _compute(was, spec.gpu, _container_sms(was, spec.gpu, spec.instance)) / _compute(
        scenario, slot.gpu, _slot_sms(scenario, slot)
    )
    if factor is not None or rescale != 1:
        entry["workload"] = _grown(raw["workload"], spec, factor or 1.0, job_key(spec) or "", rescale)
    return entry


def _gpus(
    raw_gpus: list[Any],
    scenario: Scenario,
    plan: ReportPlan,
    changed: set[int],
    applier: _Applier,
    daemon: PluginDaemon | None = None,
) -> list[Any]:
    """The `gpus` entries: unchanged entries as written; an entry with a changed GPU split into one
    entry per GPU (indices, so UUIDs, stay), each changed one in its new mode."""
    out: list[Any] = []
    index = 0
    for raw in raw_gpus:
        count = int(raw.get("count", 1))
        indices = range(index, index + count)
        index += count
        if not changed.intersection(indices):
            out.append(copy.deepcopy(raw))
            continue
        for i in indices:
            entry = {k: copy.deepcopy(v) for k, v in raw.items() if k != "count"}
            if i in changed:
                _reconfigure(
                    entry,
                    scenario.gpus[i].model,
                    plan.gpus[i],
                    applier,
                    scenario.gpus[i].mps is not None,
                    daemon,
                )
            out.append(entry)
    return out


def _reconfigure(
    entry: dict[str, Any],
    model: GpuModel,
    target: GpuTarget,
    applier: _Applier,
    had_mps: bool,
    daemon: PluginDaemon | None = None,
) -> None:
    """A GPU entry in the plan's mode; `daemon`: the device plugin's control daemon, whose thread
    share and pinned memory limit its MPS server's clients get (None: not a device-plugin node)."""
    overrides = entry.get("overrides") or {}
    if target.mode == "mig":
        try:
            place_mig_layout(model, list(target.mig))
        except CatalogError as e:
            raise ApplyPlanError(f"plan.json: the MIG layout {list(target.mig)}: {e}") from None
        entry.pop("mps", None)
        entry["mig"] = [{"profile": p, "start": s} for p, s in target.mig]
    elif target.mode == "mps":
        entry.pop("mig", None)
        if not had_mps:
            server = applier.pid()
            entry["mps"] = {"server_pid": server, "restart_pid": applier.pid()}
        if daemon is not None:  # the plugin's control daemon, its pipe directory given to the pods
            entry["mps"] = {
                **entry["mps"],
                "active_thread_percentage": daemon.thread_percentage,
                "pipe_dir": DEVICE_PLUGIN_PIPE_DIR,
            }
            limit = daemon.pinned_limit(model)
            if limit is None:
                entry["mps"].pop("pinned_memory_limit", None)
            else:
                entry["mps"]["pinned_memory_limit"] = f"{limit // MIB}MiB"
        if overrides.get("compute_mode") not in (None, "exclusive_process"):
            overrides["compute_mode"] = "exclusive_process"
    else:  # whole GPU, or freed
        entry.pop("mps", None)
        if target.mode != "freed" or target.clear_mig:
            entry.pop("mig", None)
        if had_mps and overrides.get("compute_mode") == "exclusive_process":
            overrides["compute_mode"] = "default"


_GPU_LAYOUT_FAULTS = ("mig_create", "mig_destroy", "mps_restart")


def _kept_faults(raw: Any, scenario: Scenario, changed: set[int]) -> Any:
    """The fault timeline less the entries tied to a reconfigured GPU's MIG layout or MPS server."""
    if not isinstance(raw, dict):
        return copy.deepcopy(raw)
    timeline = [
        copy.deepcopy(f)
        for f in raw.get("timeline") or []
        if not (
            isinstance(f, dict)
            and f.get("gpu") in changed
            and (any(k in f for k in _GPU_LAYOUT_FAULTS) or "instance" in f)
        )
    ]
    return {**copy.deepcopy(raw), "timeline": timeline}
