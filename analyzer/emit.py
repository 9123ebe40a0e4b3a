"""Configuration that realises a plan on the real hosts: mig-parted, the NVIDIA device plugin, Slurm.

`hosts.place` first puts every planned GPU on a GPU of the inventory, and `nodestate.changes`
compares each with what it runs now. Files are changes, never whole-fleet targets: a host where
the plan changes no GPU gets no line in any file, a plan that changes nothing emits no file (and
says so), and a GPU left as it is keeps its mode, MIG instances and advertised resources in the
files of a host that does change. Then, per changed host:

- `mig-parted.yaml`: one config per host that has or had MIG GPUs (`gpulens-<host>`), one entry
  per geometry with the model's PCI `device-filter` and the GPU indices; `all-disabled` too.
- `device-plugin-configmap.yaml`: a ConfigMap for the device plugin's config-manager, one key per
  distinct config (one config each), and `node-labels.sh` labelling every Kubernetes node with
  the key it uses (`nvidia.com/device-plugin.config`) and its MIG config (`nvidia.com/mig.config`).
- `gres.conf` and `slurm-nodes.conf` for Slurm hosts: real `NodeName`s, one `File` per GPU,
  `mps` counts of 100 on MPS GPUs, `shard` counts on time-sliced ones, and each job's `--gres`.

What a tool cannot express is changed, never emitted invalid, and each change is an `Adjustment`:
a lone sharer becomes a whole GPU; MPS clients planned above the device plugin's equal split
(`100 // replicas` percent of the threads, total / replicas of the memory, each) make that node
time-sliced (`pluginsharing.node_sharing`, the decision the analysis makes the plan itself say
first: `planasrun.py`); Slurm MPS shares on one
GPU that sum past 100 make that GPU a shard GPU. Every file is then checked by `gpulens.analyzer.validate`
and `emit` raises `InvalidConfig` rather than return a file a validator rejects.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, SupportsInt, cast

import yaml

from gpulens.analyzer import applyplan
from gpulens.analyzer import hosts as fleet
from gpulens.analyzer.hosts import Adjustment, Family, Inventory, Orchestrator, PlacedGpu, Placement
from gpulens.analyzer.nodestate import Changes, GpuChange, GpuNow, changes, gpus_now
from gpulens.analyzer.plan import Plan
from gpulens.analyzer.pluginsharing import DEFAULT_CONFIG, family_after, is_mig, mig_after, plugin_nodes
from gpulens.analyzer.validate import InvalidConfig, Problem, mig_parted, slurm
from gpulens.analyzer.validate import device_plugin as dp
from gpulens.catalog import MIB, GpuModel, model_for_nvml_name

CONFIGMAP_NAME = "gpulens-device-plugin-configs"
CONFIGMAP_NAMESPACE = "nvidia-device-plugin"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"

MIG_FILE = "mig-parted.yaml"
CONFIGMAP_FILE = "device-plugin-configmap.yaml"
LABELS_FILE = "node-labels.sh"
GRES_FILE = "gres.conf"
SLURM_NODES_FILE = "slurm-nodes.conf"


@dataclass(frozen=True)
class ApplyStep:
    """How to apply one emitted file: the command and what it does."""

    file: str
    command: str
    purpose: str


@dataclass
class Emitted:
    """Generated files (name -> text), how to apply them, what had to change, and notes."""

    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    adjustments: list[Adjustment] = field(default_factory=list)
    apply: list[ApplyStep] = field(default_factory=list)
    placement: Placement | None = None
    changes: list[GpuChange] = field(default_factory=list)  # per GPU: before -> after, jobs
    now: Mapping[str, GpuNow] = field(default_factory=dict)  # uuid -> what it runs now


@dataclass(frozen=True)
class FleetContext:
    """What emit needs besides the plan: the inventory and each job's GPUs and window."""

    inventory: Inventory
    job_uuids: Mapping[str, tuple[str, ...]]
    windows: Mapping[str, tuple[float, float]]
    mig_now: frozenset[str] = frozenset()  # UUIDs of GPUs in MIG mode now
    now: Mapping[str, GpuNow] = field(default_factory=dict)  # uuid -> what it runs now
    now_known: bool = False  # the rows said how each job runs now (their `sharing`)
    pods: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # job -> (namespace, pod)


def context_from_rows(
    jobs: Iterable[Mapping[str, object]], gpus: Iterable[Mapping[str, object]] = ()
) -> FleetContext:
    """A context from profile-table rows (job_id, uuids, instance, gpu_model, job_source, start,
    end) and optional `gpu_info` rows (uuid, model, instance, gpu)."""
    rows = list(jobs)
    inventory = fleet.inventory_from_rows(gpus, rows)
    uuids = {str(r["job_id"]): tuple(u for u in str(r.get("uuids") or "").split(",") if u) for r in rows}
    windows = {
        str(r["job_id"]): (float(r["start"]), float(r["end"]))  # type: ignore[arg-type]
        for r in rows
        if r.get("start") is not None and r.get("end") is not None
    }
    mig_now = frozenset(u for r in rows if r.get("sharing") == "mig" for u in uuids[str(r["job_id"])])
    known = any(r.get("sharing") for r in rows)
    pods = {
        str(r["job_id"]): (str(r["job_namespace"]), str(r["job_pod"]))
        for r in rows
        if r.get("job_source") == "kubernetes" and r.get("job_namespace") and r.get("job_pod")
    }
    return FleetContext(inventory, uuids, windows, mig_now, gpus_now(rows) if known else {}, known, pods)


def context_from_fleet(fleet: Iterable[object], jobs: Iterable[Mapping[str, object]] = ()) -> FleetContext:
    """A context from inventory objects (`uuid`, `model`, `node` or `instance`, and `index` or
    `gpu` when known, e.g. the plan's FleetGpu) and profile-table rows."""
    gpus = [
        {
            "uuid": getattr(g, "uuid", ""),
            "model": getattr(g, "model", ""),
            "instance": getattr(g, "node", None) or getattr(g, "instance", ""),
            "gpu": getattr(g, "index", None)
            if getattr(g, "index", None) is not None
            else getattr(g, "gpu", None),
        }
        for g in fleet
    ]
    return context_from_rows(jobs, gpus)


def context_from_plan(plan: Plan) -> FleetContext:
    """The context a plan alone gives (its layout's `node`/`uuid` and its freed GPUs): indices are
    then assumed, so pass a real context where the inventory is at hand."""
    gpus = [
        {"uuid": e.get("uuid", ""), "model": e.get("model", ""), "instance": e.get("node", "")}
        for e in [*plan.layout, *getattr(plan, "freed", [])]
        if e.get("uuid")
    ]
    return context_from_rows([], gpus)


def config_name(prefix: str, host: str) -> str:
    """`prefix-host` as a valid label value (<= 63 characters, letters, digits, '-', '_', '.')."""
    text = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{prefix}-{host}").strip("-_.")
    if len(text) > 63:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        text = text[:54].rstrip("-_.") + "-" + digest
    return text


def slurm_type(model: str) -> str:
    """A Slurm GRES type for a model: its NVML name as Slurm's NVML auto-detection spells types
    (lower case, spaces as '_': `nvidia_h100_80gb_hbm3`), so the same type works with and
    without `AutoDetect=nvml` (an auto-detected type must contain the configured one)."""
    known = _model(model)
    name = known.nvml_name if known else model
    return re.sub(r"[^a-z0-9_.-]", "_", name.lower().replace(" ", "_")).strip("_") or "gpu"


def _model(name: str) -> GpuModel | None:
    return model_for_nvml_name(name)


# ---------------------------------------------------------------- mig-parted


def _mig_counts(gpu: PlacedGpu) -> dict[str, int]:
    return dict(sorted(Counter(s["profile"] for s in gpu.entry.get("mig_layout", [])).items()))


def mig_parted_spec(
    placement: Placement, mig_now: set[str], delta: Changes
) -> tuple[dict[str, Any], dict[str, str]]:
    """The spec, and host -> config name for changed hosts whose changed GPUs have or had MIG.

    A host's config lists only the GPUs the plan changes: a GPU left as it is is in no entry, so
    mig-parted leaves its MIG mode and instances alone; a MIG GPU the plan empties is cleared
    (`mig-enabled: false`), as Slurm's and the device plugin's files then describe it.
    """
    configs: dict[str, list[dict[str, Any]]] = {"all-disabled": [{"devices": "all", "mig-enabled": False}]}
    names: dict[str, str] = {}
    for host in placement.inventory.hosts():
        placed = [g for g in placement.on(host) if delta.changed(g.uuid)]
        freed = delta.freed_mig(host, placement)
        if not freed and not any(is_mig(g) or g.uuid in mig_now for g in placed):
            continue
        geometries: dict[tuple[str, tuple[tuple[str, int], ...]], list[int]] = {}
        whole: list[int] = [s.index for s in freed]
        for gpu in placed:
            if is_mig(gpu):
                geometries.setdefault((gpu.model, tuple(_mig_counts(gpu).items())), []).append(gpu.index)
            elif gpu.uuid in mig_now or not delta.known:  # unknown: say it is no MIG GPU
                whole.append(gpu.index)
        entries: list[dict[str, Any]] = []
        for (model_name, counts), indices in sorted(geometries.items(), key=lambda kv: kv[1]):
            entry: dict[str, Any] = {}
            model = _model(model_name)
            if model is not None:
                entry["device-filter"] = [f"0x{model.pci_device_id:08X}"]
            entry.update({"devices": sorted(indices), "mig-enabled": True, "mig-devices": dict(counts)})
            entries.append(entry)
        if whole:
            entries.append({"devices": sorted(whole), "mig-enabled": False})
        name = config_name("gpulens", host)
        configs[name] = entries
        names[host] = name
    return {"version": "v1", "mig-configs": configs}, names


# ---------------------------------------------------------------- device plugin


def device_plugin_configs(
    placement: Placement, windows: Mapping[str, tuple[float, float]], delta: Changes
) -> tuple[dict[str, dict[str, Any]], dict[str, str], list[Adjustment]]:
    """ConfigMap data (key -> config), host -> key and adjustments for changed Kubernetes hosts.

    Each node's setting is `pluginsharing.node_sharing`'s, the one the plan step
    (`planasrun.py`) already made the plan say: nothing shared -> exclusive (`migStrategy: mixed`
    when it has MIG GPUs); only MPS GPUs -> MPS with replicas = most clients on one GPU, unless a
    client is planned above the equal split of threads or memory; anything else shared -> time-slicing.
    """
    data: dict[str, dict[str, Any]] = {DEFAULT_CONFIG: {"version": "v1", "flags": {"migStrategy": "none"}}}
    chosen: dict[str, str] = {}
    adjustments: list[Adjustment] = []
    for node in plugin_nodes(placement, windows, delta):
        data.setdefault(node.key, node.config())
        chosen[node.host] = node.key
        adjustments += node.adjustments
    return data, chosen, adjustments


def configmap_text(data: Mapping[str, dict[str, Any]]) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP_NAME, "namespace": CONFIGMAP_NAMESPACE},
        "data": {key: yaml.safe_dump(config, sort_keys=False) for key, config in sorted(data.items())},
    }
    header = (
        "# gpulens: NVIDIA device-plugin configs, one per key; each node selects one with the label\n"
        f"# {dp.CONFIG_LABEL} (see {LABELS_FILE}).\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False)


def labels_text(chosen: Mapping[str, str], mig_names: Mapping[str, str]) -> str:
    lines = ["#!/bin/sh", "# gpulens: select each node's device-plugin config and MIG layout", "set -e"]
    for host in sorted(chosen):
        labels = [f"{dp.CONFIG_LABEL}={chosen[host]}"]
        if host in mig_names:
            labels.append(f"{MIG_CONFIG_LABEL}={mig_names[host]}")
        lines.append(f"kubectl label node {host} {' '.join(labels)} --overwrite")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- Slurm


def _mps_pct(client: Mapping[str, object]) -> int:
    return int(cast("SupportsInt | str", client.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") or 0))


def _mig_instances_after(gpu: PlacedGpu, delta: Changes) -> dict[str, int]:
    """Profile -> instances a GPU has after the plan, as slurmd will find them ({} when not MIG,
    or MIG with instances the data does not show)."""
    if not mig_after(gpu, delta):
        return {}
    if gpu.family is Family.UNCHANGED:
        now = delta.now.get(gpu.uuid)
        return dict(now.mig_profiles) if now is not None else {}
    return _mig_counts(gpu)


def slurm_files(
    placement: Placement, windows: Mapping[str, tuple[float, float]], delta: Changes
) -> tuple[str, str, list[Adjustment]] | None:
    """gres.conf and slurm.conf node lines for changed Slurm hosts (None when there are none).

    A changed node's lines describe all its GPUs, as gres.conf does: those left as they are
    with the MIG instances, MPS or shard counts they have now (no `--gres` hints: their jobs
    request what they already do)."""
    hosts = [
        h
        for h in placement.inventory.hosts()
        if placement.inventory.orchestrator(h) is not Orchestrator.KUBERNETES and h in delta.hosts
    ]
    if not hosts:
        return None
    adjustments: list[Adjustment] = []
    gres = [
        "# gpulens: gres.conf for the consolidation plan (review before use).",
        "# slurm.conf needs SelectType=select/cons_tres and GresTypes=gpu,mps,shard; merge the Gres=",
        f"# of {SLURM_NODES_FILE} into each node's NodeName line. Lines starting '# job' are the",
        "# --gres each job should request.",
    ]
    nodes = [
        "# gpulens: add these Gres= to the NodeName lines of slurm.conf (GresTypes=gpu,mps,shard)",
    ]
    for host in hosts:
        placed = placement.on(host)
        slots = placement.inventory.on(host)
        instances = {g.index: _mig_instances_after(g, delta) for g in placed}
        has_mig = any(instances.values())
        gres.append("")
        gres.append(f"# {host}: {len(slots)} GPU(s)")
        types: Counter[str] = Counter()
        if has_mig:
            gres.append(f"NodeName={host} AutoDetect=nvml")
        for slot in slots:
            mig = instances.get(slot.index)
            if mig:
                for profile, count in mig.items():
                    types[profile] += count
            else:
                types[slurm_type(slot.model)] += 1
                if not has_mig:
                    gres.append(
                        f"NodeName={host} Name=gpu Type={slurm_type(slot.model)} File=/dev/nvidia{slot.index}"
                    )
        mps_total = shard_total = 0
        hints: list[str] = []
        for gpu in placed:
            device = f"/dev/nvidia{gpu.index}"
            if gpu.family is Family.UNCHANGED:  # as it runs now: its jobs keep their requests
                family = family_after(gpu, delta, windows)
                if family is Family.MPS:
                    gres.append(f"NodeName={host} Name=mps Count={slurm.MPS_COUNT_PER_GPU} File={device}")
                    mps_total += slurm.MPS_COUNT_PER_GPU
                elif family is Family.TIME_SLICING:
                    count = max(2, len(gpu.jobs))
                    gres.append(f"NodeName={host} Name=shard Count={count} File={device}")
                    shard_total += count
                continue
            clients = gpu.entry.get("mps_clients", []) if gpu.family is Family.MPS else []
            if clients and sum(_mps_pct(c) for c in clients) > slurm.MPS_COUNT_PER_GPU:
                total = sum(_mps_pct(c) for c in clients)
                adjustments.append(
                    Adjustment(
                        "slurm-mps-over-100",
                        f"{host}/gpu{gpu.index}",
                        tuple(gpu.jobs),
                        f"MPS shares on {host} {device} sum to {total} %, past the 100 Slurm can allocate on "
                        "one GPU: these jobs share it as shards instead (no thread caps)",
                    )
                )
                clients = []
                shared_as = Family.TIME_SLICING
            else:
                shared_as = gpu.family
            if shared_as is Family.MPS and clients:
                gres.append(f"NodeName={host} Name=mps Count={slurm.MPS_COUNT_PER_GPU} File={device}")
                mps_total += slurm.MPS_COUNT_PER_GPU
                for c in clients:
                    limit = int(c.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") or 0)
                    memory = f"  (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={limit // MIB}M)" if limit else ""
                    hints.append(f"# job {c['job_id']} on {host} {device}: --gres=mps:{_mps_pct(c)}{memory}")
            elif shared_as is Family.TIME_SLICING and gpu.jobs:
                count = max(2, len(gpu.jobs))  # a shard per job: Count caps allocations at once
                gres.append(f"NodeName={host} Name=shard Count={count} File={device}")
                shard_total += count
                hints += [f"# job {j} on {host} {device}: --gres=shard:1" for j in gpu.jobs]
            elif is_mig(gpu):
                hints += [
                    f"# job {s['job_id']} on {host} {device}: --gres=gpu:{s['profile']}:1"
                    for s in gpu.entry.get("mig_layout", [])
                ]
            else:
                hints += [
                    f"# job {j} on {host} {device}: --gres=gpu:{slurm_type(gpu.model)}:1" for j in gpu.jobs
                ]
        gres += hints
        parts = [f"gpu:{t}:{n}" for t, n in sorted(types.items())]
        if mps_total:
            parts.append(f"mps:{mps_total}")
        if shard_total:
            parts.append(f"shard:{shard_total}")
        nodes.append(f"NodeName={host} Gres={','.join(parts)}")
    return "\n".join(gres) + "\n", "\n".join(nodes) + "\n", adjustments


# ---------------------------------------------------------------- all together


def _apply_steps(
    files: Mapping[str, str], mig_names: Mapping[str, str], scripted: Sequence[str] = ()
) -> list[ApplyStep]:
    """How to apply the files, in order; `scripted`: the hosts whose apply script the files hold
    (it installs their gres.conf lines and applies or selects their MIG layout itself)."""
    steps: list[ApplyStep] = []
    if MIG_FILE in files and mig_names:
        create = (
            f"kubectl create configmap gpulens-mig-config -n gpu-operator --from-file=config.yaml={MIG_FILE}"
        )
        policy = "set the ClusterPolicy's migManager.config.name to gpulens-mig-config"
        if all(h in scripted for h in mig_names):
            command = (
                f"Kubernetes with the GPU Operator, once: {create} and {policy}; Slurm nodes: nothing to run"
            )
            purpose = (
                "each node's MIG layout (config gpulens-<node>): its apply script labels the node "
                f"({MIG_CONFIG_LABEL}) or runs nvidia-mig-parted apply on it"
            )
        else:
            command = (
                f"nvidia-mig-parted apply -f {MIG_FILE} -c gpulens-<host>   # on each host, its GPUs idle"
            )
            purpose = (
                "creates each host's MIG instances; on Kubernetes with the GPU Operator instead: "
                f"{create}, {policy}, and the {MIG_CONFIG_LABEL} labels of {LABELS_FILE} select each "
                "node's layout"
            )
        steps.append(ApplyStep(MIG_FILE, command, purpose))
    if CONFIGMAP_FILE in files:
        steps.append(
            ApplyStep(
                CONFIGMAP_FILE,
                f"kubectl apply -f {CONFIGMAP_FILE} && helm upgrade nvdp nvdp/nvidia-device-plugin "
                f"-n {CONFIGMAP_NAMESPACE} --reuse-values --set config.name={CONFIGMAP_NAME} "
                f"--set config.default={DEFAULT_CONFIG}",
                "installs the named device-plugin configs and points the plugin's config-manager at them",
            )
        )
        steps.append(
            ApplyStep(
                LABELS_FILE, f"sh {LABELS_FILE}", "selects each node's config (and MIG layout) by label"
            )
        )
    if GRES_FILE in files:
        gres_scripted = any(applyplan.gres_name(h) in files for h in scripted)
        steps.append(
            ApplyStep(
                GRES_FILE,
                "nothing to run: each node's apply script installs its own lines (gres-<node>.conf); "
                f"set each node's Gres= in slurm.conf as {SLURM_NODES_FILE} says"
                if gres_scripted
                else f"merge {GRES_FILE} into /etc/slurm/gres.conf and {SLURM_NODES_FILE} into slurm.conf "
                "on every node, then: scontrol reconfigure",
                "declares each GPU with its MPS or shard count; each job requests the --gres shown",
            )
        )
    steps += [
        ApplyStep(
            applyplan.apply_name(host),
            f"sh {applyplan.apply_name(host)}   # undo: sh {applyplan.rollback_name(host)}",
            f"{host}, after the steps above: checks it still runs what the plan assumed, saves what "
            "it has, then changes it in order (Kubernetes: where kubectl reaches the cluster; Slurm: "
            "on the node, as root)",
        )
        for host in scripted
    ]
    return steps


def emit(plan: Plan, context: FleetContext | None = None, made: Sequence[Adjustment] = ()) -> Emitted:
    """All configuration files for a plan on the real hosts, changed where a tool needs it, validated.

    Without a context, the plan's own layout names the hosts and GPUs (`context_from_plan`).
    `made`: the adjustments the plan step already made to the plan (`planasrun.as_run`), listed
    first among the emitted ones.
    """
    if context is None:
        context = context_from_plan(plan)
    placement = fleet.place(plan.layout, context.inventory, context.job_uuids, context.windows)
    delta = changes(placement, context.now, context.now_known)
    spec, mig_names = mig_parted_spec(placement, set(context.mig_now), delta)
    data, chosen, plugin_adjustments = device_plugin_configs(placement, context.windows, delta)
    notes: list[str] = []
    files: dict[str, str] = {}
    if len(spec["mig-configs"]) > 1:
        files[MIG_FILE] = "# gpulens: MIG layouts per host (nvidia-mig-parted)\n" + yaml.safe_dump(
            spec, sort_keys=False
        )
    if chosen:
        files[CONFIGMAP_FILE] = configmap_text(data)
        files[LABELS_FILE] = labels_text(chosen, mig_names)
    adjustments = [*made, *placement.adjustments, *plugin_adjustments]
    slurm_out = slurm_files(placement, context.windows, delta)
    if slurm_out is not None:
        files[GRES_FILE], files[SLURM_NODES_FILE], slurm_adjustments = slurm_out
        adjustments += slurm_adjustments
    problems = validate_files(files, context.inventory, mig_names)
    if problems:
        raise InvalidConfig(problems)
    if files:
        files.update(_node_scripts(delta, context, chosen, mig_names, files))
    scripted = [h for h in sorted(delta.hosts) if applyplan.apply_name(h) in files]
    if not files:
        notes.append("the plan changes no GPU on any node: no configuration file is emitted")
    notes += [
        f"{host}: neither Kubernetes nor Slurm named its jobs, so no apply script is written for it: "
        "apply its lines of the files above by hand"
        for host in sorted(delta.hosts)
        if context.inventory.orchestrator(host) is Orchestrator.UNKNOWN
    ]
    return Emitted(
        files=files,
        notes=list(context.inventory.notes) + notes,
        adjustments=adjustments,
        apply=_apply_steps(files, mig_names, scripted),
        placement=placement,
        changes=list(delta.gpus),
        now=delta.now,
    )


def _node_scripts(
    delta: Changes,
    context: FleetContext,
    chosen: Mapping[str, str],
    mig_names: Mapping[str, str],
    files: Mapping[str, str],
) -> dict[str, str]:
    """apply-<node>.sh / rollback-<node>.sh for every changed node (analyzer/applyplan.py)."""
    nodes = []
    for host in sorted(delta.hosts):
        gres = tuple(
            line for line in files.get(GRES_FILE, "").splitlines() if line.startswith(f"NodeName={host} ")
        )
        nodes.append(
            applyplan.NodePlan(
                host,
                context.inventory.orchestrator(host),
                tuple(delta.on(host)),
                chosen.get(host),
                mig_names.get(host),
                gres,
                context.pods,
                _jobs_here(delta, host),
            )
        )
    return applyplan.node_files(nodes, MIG_FILE)


def _jobs_here(delta: Changes, host: str) -> frozenset[str] | None:
    """The jobs on the host's changed GPUs now (None where the state now is not known): a job
    leaving the host leaves one of them, so it is among these; one arriving is not."""
    if not delta.known:
        return None
    return frozenset(
        j for c in delta.on(host) if (gpu := delta.now.get(c.uuid)) is not None for j in gpu.jobs
    )


def validate_files(
    files: Mapping[str, str], inventory: Inventory, mig_names: Mapping[str, str]
) -> list[Problem]:
    """Every emitted file through its tool's validator, with the inventory as context."""
    problems: list[Problem] = []
    hosts = inventory.hosts()
    if MIG_FILE in files:
        models = {}
        counts = {}
        for host, name in mig_names.items():
            slots = inventory.on(host)
            counts[name] = len(slots)
            kinds = {s.model for s in slots}
            if len(kinds) == 1 and (model := _model(next(iter(kinds)))) is not None:
                models[name] = model
        problems += mig_parted.validate_text(files[MIG_FILE], MIG_FILE, models=models, gpu_counts=counts)
    if CONFIGMAP_FILE in files:
        found, configs = dp.validate_configmap(files[CONFIGMAP_FILE], CONFIGMAP_FILE)
        problems += found
        problems += dp.validate_node_labels(files.get(LABELS_FILE, ""), LABELS_FILE, configs, hosts)
    if GRES_FILE in files:
        gpus = {h: len(inventory.on(h)) for h in hosts}
        problems += slurm.validate(files[GRES_FILE], files.get(SLURM_NODES_FILE, ""), gpus)
    return problems
