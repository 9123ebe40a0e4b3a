"""The fleet's real hosts and GPUs, and where each GPU of a plan lands on them.

A plan packs jobs onto abstract GPUs of a model; the tools need real places: Slurm's `NodeName`
is a host, mig-parted's `devices` and `gres.conf`'s `File` are GPU indices on it, and the NVIDIA
device plugin applies one sharing strategy to every GPU of a Kubernetes node. `place` puts each
planned GPU on a GPU of the inventory (`gpu_info`: host, index, UUID, model), keeping jobs where
they run when it can (on the very GPU when the layout entry names its `uuid`), and honours the
per-node rule:

- a shared GPU whose jobs never overlap has one sharer at a time and saves nothing as shared: it
  is placed as a whole GPU (a *lone sharer*);
- the device plugin applies one sharing strategy to every GPU of a Kubernetes node (and of a node
  whose orchestrator is unknown, since both kinds of files are written for it): where the fleet
  has room, GPUs of one sharing family (`mps`, `time-slicing`, `whole` for exclusive jobs and
  MIG) go to the same nodes; `emit` settles a node that still mixes families. Slurm shares per
  GPU, so its nodes mix freely;
- a planned GPU goes only to a node of the orchestrator its jobs run under now (a pod cannot run
  on a Slurm node, nor a Slurm job on a Kubernetes node); one of unknown orchestrator (no job of
  known source ran there) only after those, among nodes that keep one sharing family;
- a planned GPU for which the fleet has no GPU of its model left is not placed and its jobs stay
  where they are (an `Adjustment` says so): a file never describes GPUs the fleet does not have.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpulens.catalog import model_for_nvml_name


class Orchestrator(StrEnum):
    KUBERNETES = "kubernetes"
    SLURM = "slurm"
    UNKNOWN = "unknown"


class Family(StrEnum):
    """How a GPU is shared, as far as the device plugin's per-node setting is concerned."""

    MPS = "mps"
    TIME_SLICING = "time-slicing"
    WHOLE = "whole"  # exclusive jobs and MIG slices
    UNCHANGED = "unchanged"  # left as it is (jobs the analyzer could not size)


@dataclass(frozen=True)
class GpuSlot:
    """One physical GPU of the inventory."""

    host: str
    index: int
    uuid: str
    model: str  # catalog key where known, else the NVML name


@dataclass(frozen=True)
class Inventory:
    """Every GPU seen in the window and how each host's jobs are scheduled."""

    gpus: tuple[GpuSlot, ...]
    orchestrators: Mapping[str, Orchestrator] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def hosts(self) -> list[str]:
        return sorted({g.host for g in self.gpus})

    def on(self, host: str) -> list[GpuSlot]:
        return sorted((g for g in self.gpus if g.host == host), key=lambda g: g.index)

    def orchestrator(self, host: str) -> Orchestrator:
        return self.orchestrators.get(host, Orchestrator.UNKNOWN)

    def by_uuid(self) -> dict[str, GpuSlot]:
        return {g.uuid: g for g in self.gpus}


_PORT = re.compile(r"^(?P<host>\[[^\]]+\]|[^:]+)(?::\d+)?$")


def host_of(instance: str) -> str:
    """The host of a Prometheus `instance` label: `node-1:9400` -> `node-1`, `[::1]:9400` -> `::1`."""
    text = str(instance).strip()
    match = _PORT.match(text)
    host = match["host"] if match else text
    return host.strip("[]") or "unknown-host"


def model_key(name: str) -> str:
    """A model's catalog key whether named by the catalog or by NVML (itself when unknown)."""
    model = model_for_nvml_name(name)
    return model.key if model else name


def uuids_of(value: object) -> list[str]:
    """The GPUs of a job row's `uuids` (comma-separated; a missing value reads "nan")."""
    return [u for u in str(value).split(",") if u and u != "nan"]


def orchestrator_of(sources: Iterable[str]) -> Orchestrator:
    """A host's orchestrator: the `job_source` most of its jobs have (unknown without one)."""
    counts = Counter(s for s in sources if s in ("kubernetes", "slurm"))
    if not counts:
        return Orchestrator.UNKNOWN
    return Orchestrator(counts.most_common(1)[0][0])


def _index(value: object) -> int | None:
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isdigit() else None


def inventory_from_rows(
    gpus: Iterable[Mapping[str, object]], jobs: Iterable[Mapping[str, object]] = ()
) -> Inventory:
    """An inventory from `gpu_info` rows (uuid, model, instance, gpu) and job rows (uuids, instance,
    gpu_model, job_source) of the profile table.

    GPUs seen only through jobs are added; a GPU without an index (or whose index another GPU of
    the host already has) gets the next free one on its host in UUID order, and a note says the
    indices are assumed.
    """
    known: dict[str, tuple[str, str, int | None]] = {}  # uuid -> (host, model, index)
    for row in gpus:
        uuid = str(row.get("uuid") or "")
        if uuid:
            host = host_of(str(row.get("instance") or ""))
            known[uuid] = (host, model_key(str(row.get("model") or "")), _index(row.get("gpu")))
    sources: dict[str, list[str]] = {}
    for row in jobs:
        for uuid in str(row.get("uuids") or "").split(","):
            if not uuid:
                continue
            if uuid not in known:
                host = host_of(str(row.get("instance") or ""))
                known[uuid] = (host, model_key(str(row.get("gpu_model") or "")), None)
            sources.setdefault(known[uuid][0], []).append(str(row.get("job_source") or ""))
    taken: dict[str, set[int]] = {}
    for uuid in sorted(known):
        host, model, index = known[uuid]
        if index is not None and index in taken.get(host, set()):
            known[uuid] = (host, model, None)  # two GPUs claim one index (a synthetic trace host)
        elif index is not None:
            taken.setdefault(host, set()).add(index)
    out: list[GpuSlot] = []
    assumed = False
    for uuid in sorted(known):
        host, model, index = known[uuid]
        if index is None:
            used = taken.setdefault(host, set())
            index = next(i for i in range(len(used) + 1) if i not in used)
            used.add(index)
            assumed = True
        out.append(GpuSlot(host, index, uuid, model))
    notes = ("GPU indices were not in the data; they are assumed in UUID order per host",) if assumed else ()
    orchestrators = {h: orchestrator_of(s) for h, s in sources.items()}
    return Inventory(tuple(sorted(out, key=lambda g: (g.host, g.index))), orchestrators, notes)


@dataclass
class PlacedGpu:
    """A planned GPU on a real GPU: the layout entry of the plan and where it goes."""

    host: str
    index: int
    uuid: str
    model: str
    family: Family
    entry: dict[str, Any]

    @property
    def jobs(self) -> list[str]:
        return list(self.entry.get("jobs", []))


@dataclass(frozen=True)
class Adjustment:
    """A change emit made so that the tools can express the plan (shown in the report)."""

    what: str  # lone-sharer | unplaced | mps-equal-split | slurm-mps-over-100 | ...
    where: str  # host or host/gpuN
    jobs: tuple[str, ...]
    message: str


@dataclass
class Placement:
    """Planned GPUs on hosts, the GPUs left free, and what had to change."""

    inventory: Inventory
    gpus: list[PlacedGpu]
    adjustments: list[Adjustment] = field(default_factory=list)

    def on(self, host: str) -> list[PlacedGpu]:
        return sorted((g for g in self.gpus if g.host == host), key=lambda g: g.index)

    def families(self, host: str) -> set[Family]:
        """Sharing families of the planned GPUs on `host` (GPUs left unchanged not counted)."""
        return {g.family for g in self.on(host) if g.family is not Family.UNCHANGED}

    def free(self) -> list[GpuSlot]:
        """GPUs of the inventory no planned GPU uses: reclaimable."""
        used = {(g.host, g.index) for g in self.gpus}
        return [s for s in self.inventory.gpus if (s.host, s.index) not in used]


def concurrent_jobs(entry: Mapping[str, Any], windows: Mapping[str, tuple[float, float]]) -> int:
    """Most jobs of a layout entry running at one time (1 when their windows never overlap)."""
    jobs = list(entry.get("jobs", []))
    spans = [windows[j] for j in jobs if j in windows]
    if not spans:
        return len(jobs)
    return max(sum(1 for s, e in spans if s <= t <= e) for t, _ in spans)


def _family(entry: Mapping[str, object]) -> Family:
    sharing = str(entry.get("sharing", ""))
    if sharing == "mps":
        return Family.MPS
    if sharing == "time-slicing":
        return Family.TIME_SLICING
    if sharing == "unchanged":
        return Family.UNCHANGED
    return Family.WHOLE


def _constrained(inventory: Inventory, host: str) -> bool:
    """One sharing family per node: Kubernetes (device plugin) and unknown orchestrators."""
    return inventory.orchestrator(host) is not Orchestrator.SLURM


def place(
    layout: Iterable[dict[str, Any]],
    inventory: Inventory,
    job_uuids: Mapping[str, Iterable[str]],
    windows: Mapping[str, tuple[float, float]] | None = None,
) -> Placement:
    """Put every planned GPU (layout entry) on an inventory GPU; see the module docstring."""
    windows = windows or {}
    slots = inventory.by_uuid()
    free: dict[str, list[GpuSlot]] = {h: inventory.on(h) for h in inventory.hosts()}
    host_family: dict[str, Family] = {}
    placement = Placement(inventory, [])

    def take(slot: GpuSlot, entry: dict[str, Any], family: Family) -> None:
        free[slot.host].remove(slot)
        if family is not Family.UNCHANGED and _constrained(inventory, slot.host):
            host_family.setdefault(slot.host, family)
        placement.gpus.append(PlacedGpu(slot.host, slot.index, slot.uuid, slot.model, family, entry))

    entries: list[tuple[dict[str, Any], Family]] = []
    for entry in layout:
        family = _family(entry)
        if family in (Family.MPS, Family.TIME_SLICING) and concurrent_jobs(entry, windows) < 2:
            jobs = list(entry.get("jobs", []))
            who = (
                f"{jobs[0]} is alone on its"
                if len(jobs) == 1
                else f"{', '.join(jobs)} never overlap on their"
            )
            placement.adjustments.append(
                Adjustment(
                    "lone-sharer",
                    str(entry.get("gpu", "")),
                    tuple(jobs),
                    f"{who} {family.value} GPU, so sharing it saves nothing: placed as a whole GPU",
                )
            )
            family = Family.WHOLE
        entries.append((entry, family))

    # pinned first (GPUs left as they are), then shared families (one per node), then whole GPUs
    order = {Family.UNCHANGED: 0, Family.MPS: 1, Family.TIME_SLICING: 1, Family.WHOLE: 2}
    entries.sort(
        key=lambda pair: (order[pair[1]], -len(pair[0].get("jobs", [])), str(pair[0].get("gpu", "")))
    )
    for entry, family in entries:
        model = model_key(str(entry.get("model", "")))
        planned = slots.get(str(entry.get("uuid", "")))
        if planned is not None and planned in free[planned.host] and planned.model == model:
            take(planned, entry, family)  # the plan named the real GPU (and GPUs left as they are)
            continue
        current = [slots[u] for j in entry.get("jobs", []) for u in job_uuids.get(j, ()) if u in slots]
        preferred = Counter(s.host for s in current)
        kinds = {inventory.orchestrator(s.host) for s in current} - {Orchestrator.UNKNOWN}
        own = next(iter(kinds)) if len(kinds) == 1 else None  # its jobs' orchestrator

        candidates = [
            h
            for h in free
            if any(s.model == model for s in free[h])
            and (own is None or inventory.orchestrator(h) in (own, Orchestrator.UNKNOWN))
        ]
        if not candidates:
            where = f" on a {own.value} node" if own else ""
            placement.adjustments.append(
                Adjustment(
                    "unplaced",
                    str(entry.get("gpu", "")),
                    tuple(entry.get("jobs", [])),
                    f"no {model} GPU of the fleet{where} is left for this planned GPU: "
                    "its jobs stay where they are",
                )
            )
            for slot in sorted({s for s in current if s in free[s.host]}, key=lambda s: (s.host, s.index)):
                take(slot, {**entry, "sharing": "unchanged", "uuid": slot.uuid}, Family.UNCHANGED)
            continue

        def rank(
            host: str, fam: Family = family, near: Counter[str] = preferred, own: Orchestrator | None = own
        ) -> tuple[bool, bool, int, int, list[int]]:
            # Kubernetes nodes: one sharing family per node where the fleet allows it
            same = not _constrained(inventory, host) or host_family.get(host, fam) in (fam, Family.UNCHANGED)
            # then a node of its jobs' orchestrator before one whose orchestrator is unknown
            known = own is None or inventory.orchestrator(host) is own
            return (same, known, near.get(host, 0), len(free[host]), [-ord(c) for c in host])

        host = max(candidates, key=rank)
        here = [s for s in free[host] if s.model == model]
        now = {s.index for s in current if s.host == host}
        slot = next((s for s in here if s.index in now), here[0])
        take(slot, entry, family)
    placement.gpus.sort(key=lambda g: (g.host, g.index))
    return placement
