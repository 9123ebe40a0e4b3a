"""Read every emitted file for one node back into the state it gives that node, and check they agree.

After applying a plan, each tool on a node must see the same GPUs: mig-parted's config for the node
(which GPUs are MIG and with which instances, starting from what runs now), the device plugin's
config selected by the node's label (its MIG strategy), and Slurm's gres.conf / NodeName line (MIG
instances as slurmd's NVML autodetection reports them, whole GPUs by type). A disagreement (a
freed MIG GPU that keeps its instances while Slurm declares it whole) is a plan an SRE cannot apply.
"""

from __future__ import annotations

import re
from collections import Counter

import yaml

from gpulens.analyzer import emit as em
from gpulens.analyzer.nodestate import Mode


def mig_after(emitted: em.Emitted, host: str) -> dict[int, Counter[str] | None]:
    """Index -> MIG instances after applying mig-parted.yaml's config for `host` to what runs now."""
    assert emitted.placement is not None
    now = {}
    for slot in emitted.placement.inventory.on(host):
        gpu_now = emitted.now.get(slot.uuid)
        if gpu_now is not None and gpu_now.mode is Mode.MIG:
            now[slot.index] = Counter(dict(gpu_now.mig_profiles)) or None
        else:
            now[slot.index] = None
    text = emitted.files.get(em.MIG_FILE)
    if text is None:
        return now
    configs = yaml.safe_load(text)["mig-configs"]
    for entry in configs.get(em.config_name("gpulens", host), []):
        for index in entry["devices"]:
            now[index] = Counter(entry["mig-devices"]) if entry["mig-enabled"] else None
    return now


def check_node(emitted: em.Emitted, host: str) -> list[str]:
    """What the files say about `host` that does not agree; [] when they describe one state."""
    problems: list[str] = []
    mig = mig_after(emitted, host)
    mig_gpus = {i for i, c in mig.items() if c is not None}
    labels = emitted.files.get(em.LABELS_FILE, "")
    configmap = emitted.files.get(em.CONFIGMAP_FILE)
    line = next((ln for ln in labels.splitlines() if f"label node {host} " in ln), None)
    if line is not None and configmap is not None:
        key = re.search(r"nvidia.com/device-plugin.config=(\S+)", line)
        assert key is not None
        config = yaml.safe_load(yaml.safe_load(configmap)["data"][key[1]])
        strategy = config["flags"]["migStrategy"]
        if (strategy == "mixed") != bool(mig_gpus):
            problems.append(
                f"{host}: device plugin migStrategy {strategy} but MIG GPUs after: {sorted(mig_gpus)}"
            )
    nodes = emitted.files.get(em.SLURM_NODES_FILE, "")
    node_line = next((ln for ln in nodes.splitlines() if ln.startswith(f"NodeName={host} ")), None)
    if node_line is not None:
        gres = dict(
            (":".join(p.split(":")[:-1]), int(p.split(":")[-1]))
            for p in node_line.split("Gres=", 1)[1].split(",")
            if p.startswith("gpu:")
        )
        wanted: Counter[str] = Counter()
        for index, instances in mig.items():
            if instances is None:
                assert emitted.placement is not None
                slot = next(s for s in emitted.placement.inventory.on(host) if s.index == index)
                wanted[f"gpu:{em.slurm_type(slot.model)}"] += 1
            else:
                for profile, count in instances.items():
                    wanted[f"gpu:{profile}"] += count
        if dict(wanted) != gres:
            problems.append(f"{host}: slurm declares {gres}, the MIG layout after gives {dict(wanted)}")
        autodetect = f"NodeName={host} AutoDetect=nvml" in emitted.files.get(em.GRES_FILE, "")
        if autodetect != bool(mig_gpus):
            problems.append(f"{host}: AutoDetect=nvml is {autodetect} with MIG GPUs {sorted(mig_gpus)}")
    return problems


def check_all(emitted: em.Emitted) -> list[str]:
    assert emitted.placement is not None
    return [p for host in emitted.placement.inventory.hosts() for p in check_node(emitted, host)]
