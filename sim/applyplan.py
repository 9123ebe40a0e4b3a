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
  of their own, the GPU's control daemon gives each client 100 / replicas (its pipe directory the
  plugin's), and a node whose selected config time-slices gets plain GPUs instead;
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
"""

from __future__ import annotations

import copy
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import yaml

from gpulens.analyzer.pluginsharing import PluginSharing
from gpulens.analyzer.workload import pod_owner
from gpulens.atomicfile import WriteFailed, create_text, is_temp, replace_directory, write_text
from gpulens.catalog import CatalogError, GpuModel
from gpulens.migplacement import place_mig_layout
from gpulens.safeload import InputError, load_json_file, load_yaml_file
from gpulens.sim.defaults import (
    default_gpu_instance_id,
    default_uid,
    make_container_id,
    make_uuid,
    stable_hex,
)
from gpulens.sim.nodesharing import (
    DEVICE_PLUGIN_PIPE_DIR,
    NodeSharingError,
    SelectedConfig,
    read_node_sharing,
)
from gpulens.sim.scenario import (
    PINNED_MEM_LIMIT,
    PIPE_DIRECTORY,
    THREAD_PERCENTAGE,
    KubernetesJob,
    MappingJob,
    ProcessSpec,
    Scenario,
    ScenarioError,
    SlurmJob,
    instance_profiles,
)
from gpulens.sim.scenariofile import BUILTIN_DIR, load_scenario, parse_scenario

MIB = 1024**2
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' alphabet of generated name parts
_GENERATED = re.compile(rf"[{_SAFE}]{{5,10}}")
_WHOLE_MODES = ("exclusive", "time-slicing", "downsize-model")
_MODES = ("mig", "mps", "unchanged", *_WHOLE_MODES)


class ApplyPlanError(ValueError):
    """A report or scenario that cannot be applied; the message is one line naming file and field."""


@dataclass(frozen=True)
class Slot:
    """Where the plan runs a job: a GPU of the node, in a mode, with its slice or MPS settings."""

    gpu: int
    mode: str  # "mig", "mps" or "whole"
    mig: tuple[str, int] | None = None  # (profile, start)
    sm_cap: float | None = None  # MPS thread percentage / 100
    memory_limit: int | None = None  # MPS pinned device memory limit, bytes


@dataclass(frozen=True)
class GpuTarget:
    """What the plan makes of one GPU: its mode and, on MIG, its slices (profile, start)."""

    mode: str  # "mig", "mps", "whole", "unchanged" or "freed"
    mig: tuple[tuple[str, int], ...] = ()
    clear_mig: bool = False  # freed: mig-parted disables MIG on it


@dataclass(frozen=True)
class ReportPlan:
    """The parts of a report directory apply-plan reads, for one node."""

    gpus: dict[int, GpuTarget]
    jobs: dict[str, Slot]  # job id -> where the plan runs it (a multi-GPU job: its first GPU)
    reclaimed: frozenset[str]  # jobs whose GPU is given back: they stop
    # a multi-GPU job -> its GPUs in the plan, whole or unchanged (one rank per GPU), lowest index first
    multi: dict[str, tuple[Slot, ...]] = field(default_factory=dict)
    # the device-plugin config the report selects for the node (None: it keeps the one it runs)
    sharing: SelectedConfig | None = None
    # jobs the layout places on other nodes' GPUs -> those nodes (a job moved across nodes)
    elsewhere: dict[str, frozenset[str]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# reading the report


def load_report_json(path: Path) -> Any:
    """A report's JSON file, or a one-line ApplyPlanError naming it (also `history_apply`'s)."""
    try:
        return load_json_file(path, str(path))
    except FileNotFoundError:
        raise ApplyPlanError(
            f"{path}: expected a report file (gpulens report --out DIR), found none"
        ) from None
    except (OSError, InputError, ValueError) as e:
        raise ApplyPlanError(f"{path}: expected valid JSON, found {str(e).splitlines()[0]}") from None


def report_field(where: str, entry: Any, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    """`entry[key]` when it is of `kind` (never a bool), else a one-line error naming where."""
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get(key), kind)
        or isinstance(entry.get(key), bool)
    ):
        found = entry.get(key) if isinstance(entry, dict) else entry
        raise ApplyPlanError(f"{where}.{key}: expected {what}, found {found!r}")
    return entry[key]


def read_report(report: Path, scenario: Scenario) -> ReportPlan:
    """The plan of `report` for `scenario`'s node, checked against its jobs.json (and mig-parted.yaml)."""
    plan_path, jobs_path = report / "plan.json", report / "jobs.json"
    plan, jobs_doc = load_report_json(plan_path), load_report_json(jobs_path)
    by_uuid = {g.uuid: g.index for g in scenario.gpus}
    layout = report_field(str(plan_path), plan, "layout", list, "a list of GPUs")
    freed = report_field(str(plan_path), plan, "freed", list, "a list of freed GPUs")
    rows = report_field(str(jobs_path), jobs_doc, "jobs", list, "a list of jobs")
    gpus: dict[int, GpuTarget] = {}
    jobs: dict[str, Slot] = {}
    multi: dict[str, list[Slot]] = {}
    mps_settings: dict[str, tuple[float | None, int | None]] = {}
    elsewhere: dict[str, set[str]] = {}
    for i, entry in enumerate(layout):
        where = f"{plan_path}: layout[{i}]"
        found = _node_gpu(where, entry, scenario, by_uuid)
        if found is None:
            for name in report_field(where, entry, "jobs", list, "a list of job ids"):
                if not isinstance(name, str):
                    raise ApplyPlanError(f"{where}.jobs: expected job ids, found {name!r}")
                elsewhere.setdefault(name, set()).add(entry["node"])
            continue
        uuid, index = found
        mode = report_field(where, entry, "sharing", str, "a sharing mode")
        if mode not in _MODES:
            raise ApplyPlanError(f"{where}.sharing: expected one of {', '.join(_MODES)}, found {mode!r}")
        names = report_field(where, entry, "jobs", list, "a list of job ids")
        slices: dict[str, tuple[str, int]] = {}
        if mode == "mig":
            for k, s in enumerate(report_field(where, entry, "mig_layout", list, "a list of MIG slices")):
                w = f"{where}.mig_layout[{k}]"
                slices[report_field(w, s, "job_id", str, "a job id")] = (
                    report_field(w, s, "profile", str, "a MIG profile"),
                    report_field(w, s, "start", int, "a start slice"),
                )
        if mode == "mps":
            for k, cl in enumerate(report_field(where, entry, "mps_clients", list, "a list of MPS clients")):
                w = f"{where}.mps_clients[{k}]"
                pct = cl.get(THREAD_PERCENTAGE) if isinstance(cl, dict) else None
                limit = cl.get(PINNED_MEM_LIMIT) if isinstance(cl, dict) else None
                if pct is not None and (
                    isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 < pct <= 100
                ):
                    raise ApplyPlanError(
                        f"{w}.{THREAD_PERCENTAGE}: expected a percentage above 0, at most 100, found {pct!r}"
                    )
                if limit is not None and (
                    isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0
                ):
                    raise ApplyPlanError(
                        f"{w}.{PINNED_MEM_LIMIT}: expected a number of bytes above 0, found {limit!r}"
                    )
                mps_settings[report_field(w, cl, "job_id", str, "a job id")] = (
                    None if pct is None else pct / 100,
                    limit,
                )
        if index in gpus:
            raise ApplyPlanError(f"{where}.uuid: expected each GPU once in the layout, found {uuid} again")
        gpus[index] = GpuTarget(
            "whole" if mode in _WHOLE_MODES else mode,
            tuple(sorted(slices.values(), key=lambda s: s[1])),
        )
        for name in names:
            if not isinstance(name, str):
                raise ApplyPlanError(f"{where}.jobs: expected job ids, found {name!r}")
            if name in jobs:
                if mode == "unchanged" and jobs[name].mode == "unchanged":
                    # a job on several GPUs the plan keeps: each rank stays on its GPU as it is
                    multi.setdefault(name, [jobs[name]]).append(Slot(index, "unchanged"))
                    continue
                if mode not in _WHOLE_MODES or jobs[name].mode != "whole":
                    raise ApplyPlanError(
                        f"{where}.jobs: expected a job on several GPUs to have each whole, "
                        f"found {name!r} again on a {mode} GPU"
                    )
                multi.setdefault(name, [jobs[name]]).append(Slot(index, "whole"))
                continue
            if mode == "mig" and name not in slices:
                raise ApplyPlanError(f"{where}.mig_layout: expected a slice for job {name!r}, found none")
            cap, limit = mps_settings.get(name, (None, None))
            target = gpus[index].mode
            jobs[name] = Slot(index, target, slices.get(name), cap, limit)
    try:
        sharing = read_node_sharing(report / "config", scenario.hostname)
    except NodeSharingError as e:
        raise ApplyPlanError(str(e)) from None
    if sharing is not None and sharing.sharing is not PluginSharing.MPS:
        # the config the node gets time-slices it (emit.py's adjustments): the plugin runs no MPS
        # there, so a GPU the plan wanted on MPS is a plain GPU its jobs share by time
        gpus = {i: GpuTarget("whole") if t.mode == "mps" else t for i, t in gpus.items()}
        jobs = {n: Slot(s.gpu, "whole") if s.mode == "mps" else s for n, s in jobs.items()}
    cleared = _mig_cleared(report / "config" / "mig-parted.yaml", scenario, gpus)
    for i, entry in enumerate(freed):
        where = f"{plan_path}: freed[{i}]"
        found = _node_gpu(where, entry, scenario, by_uuid)
        if found is None:
            continue
        uuid, index = found
        if index in gpus:
            raise ApplyPlanError(f"{where}.uuid: expected a GPU the layout does not use, found {uuid}")
        gpus[index] = GpuTarget("freed", clear_mig=index in cleared)
    if not gpus:
        # a node the plan empties (every job moved to other nodes) has its GPUs all in `freed`
        raise ApplyPlanError(
            f"{plan_path}: layout: expected GPUs of node {scenario.hostname} (in use or freed), found none"
        )
    reclaimed = _check_jobs(str(jobs_path), rows, jobs, scenario)
    spread = {name: tuple(sorted(slots, key=lambda s: s.gpu)) for name, slots in multi.items()}
    others = {name: frozenset(nodes) for name, nodes in elsewhere.items()}
    return ReportPlan(gpus, jobs, reclaimed, spread, sharing, others)


def _node_gpu(
    where: str, entry: Any, scenario: Scenario, by_uuid: Mapping[str, int]
) -> tuple[str, int] | None:
    """(UUID, index) of a plan entry's GPU when it is on the scenario's node, else None."""
    if report_field(where, entry, "node", str, "a node name") != scenario.hostname:
        return None
    uuid = report_field(where, entry, "uuid", str, "a GPU UUID")
    if uuid not in by_uuid:
        raise ApplyPlanError(f"{where}.uuid: expected a GPU of {scenario.hostname}, found {uuid!r}")
    return uuid, by_uuid[uuid]


def _check_jobs(where: str, rows: list[Any], jobs: dict[str, Slot], scenario: Scenario) -> frozenset[str]:
    """jobs.json agrees with the layout on where each placed job goes; returns the reclaimed jobs."""
    uuids = {g.index: g.uuid for g in scenario.gpus}
    reclaimed = set()
    for i, row in enumerate(rows):
        w = f"{where}: jobs[{i}]"
        job_id = report_field(w, row, "job_id", str, "a job id")
        if row.get("action") == "reclaim" and job_id not in jobs:
            reclaimed.add(job_id)
        proposed = row.get("proposed_gpu")
        if job_id in jobs and proposed and proposed != uuids[jobs[job_id].gpu]:
            raise ApplyPlanError(
                f"{w}.proposed_gpu: expected {uuids[jobs[job_id].gpu]} (where plan.json places {job_id}), "
                f"found {proposed!r}"
            )
    return frozenset(reclaimed)


def _mig_cleared(path: Path, scenario: Scenario, gpus: Mapping[int, GpuTarget]) -> set[int]:
    """GPU indices the node's mig-parted config disables MIG on; checks its MIG devices match the
    plan's slices. No file (a plan that changes no MIG layout): nothing to check."""
    if not path.is_file():
        return set()
    try:
        doc = load_yaml_file(path, str(path))
    except (OSError, InputError, yaml.YAMLError) as e:
        raise ApplyPlanError(f"{path}: expected valid YAML, found {str(e).splitlines()[0]}") from None
    configs = doc.get("mig-configs") if isinstance(doc, dict) else None
    entries = configs.get(f"gpulens-{scenario.hostname}") if isinstance(configs, dict) else None
    if entries is None:
        return set()
    where = f"{path}: mig-configs.gpulens-{scenario.hostname}"
    if not isinstance(entries, list):
        raise ApplyPlanError(f"{where}: expected a list of device entries, found {entries!r}")
    cleared: set[int] = set()
    for k, entry in enumerate(entries):
        devices = entry.get("devices") if isinstance(entry, dict) else None
        if devices == "all":
            devices = [g.index for g in scenario.gpus]
        if not isinstance(devices, list) or not all(isinstance(d, int) for d in devices):
            raise ApplyPlanError(
                f"{where}[{k}].devices: expected a list of GPU indices or all, found {devices!r}"
            )
        enabled = entry.get("mig-enabled") is True
        wanted = Counter({str(p): int(n) for p, n in (entry.get("mig-devices") or {}).items()})
        for d in devices:
            target = gpus.get(d)
            if not enabled:
                cleared.add(d)
                if target is not None and target.mode == "mig":
                    raise ApplyPlanError(
                        f"{where}[{k}]: expected MIG on GPU {d} as plan.json places it, found it disabled"
                    )
            elif target is not None and target.mode == "mig" and Counter(p for p, _ in target.mig) != wanted:
                have = dict(Counter(p for p, _ in target.mig))
                raise ApplyPlanError(
                    f"{where}[{k}].mig-devices: expected {have} on GPU {d} as plan.json slices it, "
                    f"found {dict(wanted)}"
                )
    return cleared


# ---------------------------------------------------------------------------------------------
# applying it


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


def _grown(
    raw: dict[str, Any], spec: ProcessSpec, factor: float, job: str, rescale: float = 1.0
) -> dict[str, Any]:
    """The workload with its SM demand scaled by `factor` (`--grow`: the busy time or duty it
    implies grows with it) and put on its new container's scale (`rescale`: the SMs it had over
    the SMs it now has; the same work is the same SMs, a larger share of a slice, a smaller one
    of a whole GPU; its kernels run as long as before). A demand over a whole slice is held to it."""
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
    daemon = daemon_percentage(scenario, plan, [a.spec for a in crossing.arrivals])
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


def daemon_percentage(
    scenario: Scenario, plan: ReportPlan, arriving: Sequence[ProcessSpec] = ()
) -> int | None:
    """The thread share the device plugin's MPS control daemon gives every client on a Kubernetes
    node after the plan (`nodesharing.py`); None on other nodes, whose clients are given the plan's
    own percentage (Slurm's gres/mps share, or the job's environment). `arriving`: processes the
    plan moves onto the node from other nodes (pods make a node a Kubernetes one too)."""
    if not any(isinstance(p.job, KubernetesJob) for p in (*scenario.processes, *arriving)):
        return None
    if plan.sharing is not None:
        return plan.sharing.thread_percentage
    running = [g.mps.active_thread_percentage for g in scenario.gpus if g.mps is not None]
    return int(min(running)) if running else 100  # the node keeps its config (MPS's own default: 100)


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
    percentage in its environment (not on a device-plugin node, where the control daemon's share
    holds)."""
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
        if slot.memory_limit is not None:
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
    rescale = _container_sms(source or scenario, spec.gpu, spec.instance) / _slot_sms(scenario, slot)
    if factor is not None or rescale != 1:
        entry["workload"] = _grown(raw["workload"], spec, factor or 1.0, job_key(spec) or "", rescale)
    return entry


def _gpus(
    raw_gpus: list[Any],
    scenario: Scenario,
    plan: ReportPlan,
    changed: set[int],
    applier: _Applier,
    daemon: int | None = None,
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
    daemon: int | None = None,
) -> None:
    """A GPU entry in the plan's mode; `daemon`: the device plugin's thread share for its MPS
    server's clients (None: not a device-plugin node)."""
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
                "active_thread_percentage": daemon,
                "pipe_dir": DEVICE_PLUGIN_PIPE_DIR,
            }
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


# ---------------------------------------------------------------------------------------------
# the command


def parse_grow(values: list[str]) -> dict[str, float]:
    """`--grow JOB=FACTOR` values."""
    out: dict[str, float] = {}
    for value in values:
        job, sep, factor = value.rpartition("=")
        try:
            number = float(factor)
        except ValueError:
            number = math.nan
        if not sep or not job or not (number > 0 and math.isfinite(number)):
            raise ApplyPlanError(f"--grow: expected JOB=FACTOR with a factor above 0, found {value!r}")
        out[job] = number
    return out


def render(data: dict[str, Any], scenario_source: str, report: str) -> str:
    """The applied scenario as YAML, with a header saying where it came from."""
    header = (
        f"# Generated by gpulens sim apply-plan from {scenario_source} and the plan in {report}:\n"
        "# the node as it runs after the plan was applied (docs/simulator.md, 'Applying a plan').\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)


def _load(scenario_path: str) -> tuple[Scenario, dict[str, Any]]:
    """A scenario (a file or a built-in name) and its YAML data."""
    try:
        scenario = load_scenario(scenario_path)
        path = Path(scenario_path)
        if not path.is_file():
            path = BUILTIN_DIR / f"{scenario_path}.yaml"
        data = load_yaml_file(path, scenario.source)
    except ScenarioError as e:
        raise ApplyPlanError(str(e)) from None
    return scenario, data


def _checked(applied: dict[str, Any], source: str, report: str | Path, out: Path) -> tuple[str, Scenario]:
    """The applied scenario's text and what it reads back as (it must validate)."""
    text = render(applied, source, str(report))
    try:
        return text, parse_scenario(yaml.safe_load(text), str(out), name=out.stem)
    except ScenarioError as e:
        raise ApplyPlanError(f"the applied scenario does not validate: {e}") from None


@overload
def apply_plan_files(
    scenario_path: str, report: str | Path, out: str | Path, grow: Mapping[str, float] | None = None
) -> Scenario: ...


@overload
def apply_plan_files(
    scenario_path: list[str] | tuple[str, ...],
    report: str | Path,
    out: str | Path,
    grow: Mapping[str, float] | None = None,
) -> list[Scenario]: ...


def apply_plan_files(
    scenario_path: str | list[str] | tuple[str, ...],
    report: str | Path,
    out: str | Path,
    grow: Mapping[str, float] | None = None,
) -> Scenario | list[Scenario]:
    """Read a scenario and a report directory, write the applied scenario to `out`; returns it.
    Given a list of scenarios (a fleet, one a node), `out` is a directory with one file a node
    (`fleet_file_name`), jobs the plan moves across nodes move between them; returns the applied
    scenarios in the order given."""
    if not isinstance(scenario_path, str):
        return _apply_fleet(list(scenario_path), report, Path(out), grow)
    scenario, data = _load(scenario_path)
    plan = read_report(Path(report), scenario)
    text, result = _checked(apply_plan(data, scenario, plan, grow), scenario.source, report, Path(out))
    try:
        write_text(out, text)
    except OSError as e:
        raise ApplyPlanError(f"{out}: expected a writable file, found {e.strerror or e}") from None
    return result


def fleet_file_name(scenario_path: str) -> str:
    """The file a node's applied scenario gets in the fleet form's directory: its scenario's name."""
    return f"{Path(scenario_path).stem}.yaml"


def _apply_fleet(
    paths: list[str], report: str | Path, out: Path, grow: Mapping[str, float] | None
) -> list[Scenario]:
    if not paths:
        raise ApplyPlanError("SCENARIO: expected at least one scenario, found none")
    nodes = [_load(p) for p in paths]
    hosts: dict[str, str] = {}
    names: dict[str, str] = {}
    for (scenario, _), path in zip(nodes, paths, strict=True):
        if scenario.hostname in hosts:
            raise ApplyPlanError(
                f"{scenario.source}: node.hostname: expected one scenario a node, found "
                f"{scenario.hostname} again (also {hosts[scenario.hostname]})"
            )
        hosts[scenario.hostname] = scenario.source
        name = fleet_file_name(path)
        if name in names:
            raise ApplyPlanError(
                f"{scenario.source}: expected scenarios with different file names (--out gets one file "
                f"a node, named after it), found {name} again (also {names[name]})"
            )
        names[name] = scenario.source
    plans = [read_report(Path(report), scenario) for scenario, _ in nodes]
    crossings = _crossings(nodes, plans)
    grow = dict(grow or {})
    jobs = {job_key(p) for scenario, _ in nodes for p in scenario.processes}
    for job in grow:
        if job not in jobs:
            raise ApplyPlanError(f"--grow {job}: expected a job of the scenarios given, found none")
    slurm = SlurmIds(scenario for scenario, _ in nodes)
    texts: dict[str, str] = {}
    results = []
    for (scenario, data), plan, crossing, name in zip(nodes, plans, crossings, names, strict=True):
        here = {job_key(p) for p in scenario.processes} - crossing.departures
        here |= {job_key(a.spec) for a in crossing.arrivals}
        applied = apply_plan(
            data, scenario, plan, {j: f for j, f in grow.items() if j in here}, crossing, slurm
        )
        movers = sorted({a.source.source for a in crossing.arrivals})
        source = scenario.source + (
            f" (with the jobs the plan moves here from {', '.join(movers)})" if movers else ""
        )
        texts[name], result = _checked(applied, source, report, out / name)
        results.append(result)
    try:
        with replace_directory(out, _not_applied_scenarios) as tmp:
            for name, text in texts.items():
                with create_text(tmp / name) as handle:
                    handle.write(text)
    except WriteFailed as e:
        raise ApplyPlanError(str(e)) from None
    except OSError as e:
        raise ApplyPlanError(f"{out}: expected a writable directory, found {e.strerror or e}") from None
    return results


def _not_applied_scenarios(existing: Path) -> str | None:
    """Why the fleet form must not replace `existing` (it is swapped whole): it holds anything but
    scenario files (`--out ~`)."""
    try:
        others = sorted(p.name for p in existing.iterdir() if not is_temp(p) and p.suffix != ".yaml")
    except OSError as e:
        return e.strerror or str(e)
    if not others:
        return None
    return (
        f"holds {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}; expected a directory of scenarios"
    )


def _crossings(nodes: Sequence[tuple[Scenario, Any]], plans: Sequence[ReportPlan]) -> list[Crossing]:
    """Per node (in order): the jobs the plan moves onto it from the other nodes given, and its jobs
    it moves to them. A job moved to a node not given is left to `apply_plan`'s error."""
    now: dict[str, set[str]] = {}
    for scenario, _ in nodes:
        for p in scenario.processes:
            if (key := job_key(p)) is not None:
                now.setdefault(key, set()).add(scenario.hostname)
    hosts = {scenario.hostname for scenario, _ in nodes}
    placed: dict[str, set[str]] = {}
    for (scenario, _), plan in zip(nodes, plans, strict=True):
        for key in plan.jobs:
            placed.setdefault(key, set()).add(scenario.hostname)
        for key, others in plan.elsewhere.items():
            placed.setdefault(key, set()).update(others)
    moves: dict[str, tuple[str, str]] = {}  # job -> (from, to)
    for key, on in now.items():
        to = placed.get(key)
        if not to or to == on:
            continue
        if len(on) > 1 or len(to) > 1:
            raise ApplyPlanError(
                f"plan.json: layout: expected a job the plan moves across nodes to run on one node, "
                f"found {key} on {', '.join(sorted(on))} now and on {', '.join(sorted(to))} in the plan"
            )
        (source,), (target,) = on, to
        if target in hosts:
            moves[key] = (source, target)
    out = []
    for scenario, _ in nodes:
        arrivals = tuple(
            Arrival(raw, spec, other)
            for other, other_data in nodes
            for raw, spec in zip(other_data.get("processes") or [], other.processes, strict=True)
            if moves.get(job_key(spec) or "") == (other.hostname, scenario.hostname)
        )
        departures = frozenset(k for k, (source, _) in moves.items() if source == scenario.hostname)
        out.append(Crossing(arrivals, departures))
    return out
