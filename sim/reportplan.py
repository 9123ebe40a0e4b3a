"""What `gpulens sim apply-plan` reads of a report: the plan for one node, checked.

`read_report` reads a report directory (`gpulens report --out DIR`) against a node's scenario:
`plan.json` (per GPU its mode, jobs, MIG slices and MPS client settings, and the GPUs it frees),
`jobs.json` (which must agree on where each placed job goes), `config/mig-parted.yaml` (which must
slice each MIG GPU as the plan does, and says which freed GPUs lose their MIG layout) and the
device plugin's `config/` files (`nodesharing.py`: a node the plugin time-slices runs no MPS). The
result is a `ReportPlan`; every problem is a one-line `ApplyPlanError` naming the file and field.
`history_apply.py` reads its reports with the same helpers (`load_report_json`, `report_field`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpulens.analyzer.pluginsharing import PluginSharing
from gpulens.safeload import InputError, load_json_file, load_yaml_file
from gpulens.sim.nodesharing import NodeSharingError, SelectedConfig, read_node_sharing
from gpulens.sim.scenario import PINNED_MEM_LIMIT, THREAD_PERCENTAGE, Scenario

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
