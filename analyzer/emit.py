"""Configuration that realises a plan: mig-parted, NVIDIA device-plugin sharing, Slurm hints.

Everything is generated from the plan's node groups (DESIGN: sharing mode is per node for the
device plugin) and validated before it is returned: every MIG geometry is re-placed with
`catalog.place_mig_layout`, replica counts are positive, and MPS replica memory is checked
against the clients' pinned limits (the device plugin's MPS daemon gives each replica
total/replicas of memory by default).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import yaml

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.plan import Plan
from gpulens.catalog import MIB, CatalogError, get_model, place_mig_layout


@dataclass
class Emitted:
    """Generated files (name -> text) and notes a person should read before applying them."""

    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _gpus_by_group(plan: Plan) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for entry in plan.layout:
        if entry.get("node_group"):
            groups.setdefault(entry["node_group"], []).append(entry)
    return groups


def mig_parted_config(plan: Plan) -> dict:
    """`nvidia.com/mig.config` layouts, one named config per node group that has MIG or whole GPUs."""
    configs: dict[str, list[dict]] = {"all-disabled": [{"devices": "all", "mig-enabled": False}]}
    for name, gpus in sorted(_gpus_by_group(plan).items()):
        entries: list[dict] = []
        whole: list[int] = []
        for index, gpu in enumerate(gpus):
            if gpu["sharing"] == "mig":
                counts = Counter(s["profile"] for s in gpu["mig_layout"])
                entries.append(
                    {"devices": [index], "mig-enabled": True, "mig-devices": dict(sorted(counts.items()))}
                )
            else:
                whole.append(index)
        if whole:
            entries.append({"devices": whole, "mig-enabled": False})
        configs[name] = entries
    return {"version": "v1", "mig-configs": configs}


def device_plugin_configs(plan: Plan) -> tuple[dict, list[str]]:
    """Named device-plugin configs (select per node with label nvidia.com/device-plugin.config)."""
    out: dict[str, dict] = {}
    notes: list[str] = []
    for name, gpus in sorted(_gpus_by_group(plan).items()):
        kind = gpus[0]["sharing"]
        if kind == "mps":
            replicas = max(len(g.get("mps_clients", [])) for g in gpus)
            model = get_model(gpus[0]["model"])
            per_replica = model.memory_bytes // max(replicas, 1)
            largest = max(c["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] or 0 for g in gpus for c in g["mps_clients"])
            if largest > per_replica:
                notes.append(
                    f"{name}: the device plugin's default MPS memory share "
                    f"({per_replica // MIB} MiB per replica) is below the largest client limit "
                    f"({largest // MIB} MiB); set CUDA_MPS_PINNED_DEVICE_MEM_LIMIT per job as in the plan"
                )
            out[name] = {
                "version": "v1",
                "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}},
            }
        elif kind == "time-slicing":
            replicas = max(int(g.get("replicas", 1)) for g in gpus)
            out[name] = {
                "version": "v1",
                "sharing": {
                    "timeSlicing": {
                        "failRequestsGreaterThanOne": True,
                        "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}],
                    }
                },
            }
        else:
            out[name] = {"version": "v1", "flags": {"migStrategy": "mixed" if _has_mig(gpus) else "none"}}
    return out, notes


def _has_mig(gpus: list[dict]) -> bool:
    return any(g["sharing"] == "mig" for g in gpus)


def slurm_hints(plan: Plan) -> str:
    """gres.conf / slurm.conf lines and the `--gres` each job would request."""
    lines = [
        "# gpulens: Slurm hints for the consolidation plan (review before use).",
        "# slurm.conf needs SelectType=select/cons_tres and GresTypes=gpu,mps,shard as used below.",
    ]
    for name, gpus in sorted(_gpus_by_group(plan).items()):
        kind = gpus[0]["sharing"]
        n = len(gpus)
        files = f"/dev/nvidia[0-{n - 1}]" if n > 1 else "/dev/nvidia0"
        lines.append("")
        lines.append(f"# node group {name}: {n} x {gpus[0]['model']}, {kind}")
        if kind == "mps":
            lines.append(f"NodeName={name} Name=gpu File={files}")
            lines.append(f"NodeName={name} Name=mps Count={100 * n} File={files}")
            for gpu in gpus:
                for client in gpu["mps_clients"]:
                    pct = client["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]
                    limit = client["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]
                    lines.append(
                        f"#   job {client['job_id']}: --gres=mps:{pct}  "
                        f"(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={limit // MIB}M)"
                    )
        elif kind == "time-slicing":
            replicas = max(int(g.get("replicas", 1)) for g in gpus)
            lines.append(f"NodeName={name} Name=gpu File={files}")
            lines.append(f"NodeName={name} Name=shard Count={replicas * n} File={files}")
            lines.extend(f"#   job {job}: --gres=shard:1" for g in gpus for job in g["jobs"])
        else:
            lines.append(f"NodeName={name} AutoDetect=nvml")
            for gpu in gpus:
                if gpu["sharing"] == "mig":
                    for s in gpu["mig_layout"]:
                        lines.append(
                            f"#   job {s['job_id']}: --gres=gpu:{s['profile']}:1  "
                            "(AutoDetect names MIG types after the profile; check `slurmd -G`)"
                        )
                else:
                    lines.extend(f"#   job {job}: --gres=gpu:1" for job in gpu["jobs"])
    return "\n".join(lines) + "\n"


def validate(plan: Plan, mig_config: dict, plugin: dict) -> None:
    """Re-check every generated geometry and replica count against the catalog."""
    groups = _gpus_by_group(plan)
    for name, entries in mig_config["mig-configs"].items():
        if name == "all-disabled":
            continue
        model = get_model(groups[name][0]["model"])
        for entry in entries:
            if not entry["mig-enabled"]:
                continue
            requests = [(p, None) for p, count in entry["mig-devices"].items() for _ in range(count)]
            try:
                place_mig_layout(model, requests)
            except CatalogError as exc:
                raise AnalyzerError(f"generated MIG config {name} is invalid: {exc}") from exc
    for name, config in plugin.items():
        for sharing in config.get("sharing", {}).values():
            for resource in sharing["resources"]:
                if resource["replicas"] < 1:
                    raise AnalyzerError(f"generated device-plugin config {name} has no replicas")


def emit(plan: Plan) -> Emitted:
    """All configuration files for a plan, validated."""
    mig = mig_parted_config(plan)
    plugin, notes = device_plugin_configs(plan)
    validate(plan, mig, plugin)
    labels = [
        f"kubectl label node <node> nvidia.com/mig.config={name} nvidia.com/device-plugin.config={name}"
        for name in sorted(_gpus_by_group(plan))
    ]
    return Emitted(
        files={
            "mig-parted.yaml": yaml.safe_dump(mig, sort_keys=False),
            "device-plugin-config.yaml": yaml.safe_dump(plugin, sort_keys=False),
            "slurm-gres-hints.conf": slurm_hints(plan),
            "node-labels.txt": "\n".join(labels) + ("\n" if labels else ""),
        },
        notes=notes,
    )
