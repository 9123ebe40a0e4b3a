"""Which job or pod holds each GPU / MIG device, as the compatibility collectors need it.

The attribution engine reports every holder it knows per device (`NodeSnapshot.holders`): pods the
kubelet's pod-resources API allocated the device to, jobs its mapping file names, and jobs whose
processes run on it. The peers each use one of those, so each view picks its own, falling back to the
jobs seen running when the peer's source says nothing (no kubelet socket mounted, no prolog files).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpulens.exporter.snapshot import NodeSnapshot

if TYPE_CHECKING:
    from gpulens.exporter.attribution.model import DeviceHolder

# DeviceHolder.source values (set by the attribution engine)
POD_RESOURCES = "pod_resources"
MAPPING = "mapping"
PROCESS = "process"

Device = tuple[int, int | None]  # (GPU index, GPU instance or None)


@dataclass(frozen=True)
class PodLabels:
    namespace: str
    pod: str
    container: str


def _by_device(snapshot: NodeSnapshot, sources: Iterable[str]) -> dict[Device, dict[str, list[DeviceHolder]]]:
    wanted = set(sources)
    out: dict[Device, dict[str, list[DeviceHolder]]] = {}
    for holder in snapshot.holders:
        if holder.source in wanted:
            out.setdefault((holder.gpu, holder.gpu_instance), {}).setdefault(holder.source, []).append(holder)
    return out


def pods(snapshot: NodeSnapshot) -> dict[Device, PodLabels]:
    """The one pod holding each device, as dcgm-exporter labels it: from the kubelet's allocations,
    else from the pods whose processes run there. A device several pods hold (time-slicing or MPS
    replicas) has none: the device alone cannot say which pod a value belongs to."""
    out: dict[Device, PodLabels] = {}
    for device, found in _by_device(snapshot, (POD_RESOURCES, PROCESS)).items():
        holders = found.get(POD_RESOURCES) or [
            h for h in found.get(PROCESS, []) if h.identity.source == "kubernetes" and h.identity.pod
        ]
        names = {(h.identity.namespace, h.identity.pod) for h in holders}
        if len(names) != 1:
            continue
        namespace, pod = next(iter(names))
        containers = sorted({c for h in holders for c in h.identity.container.split(",") if c})
        out[device] = PodLabels(namespace, pod, ",".join(containers))
    return out


def slurm_jobs(snapshot: NodeSnapshot) -> dict[Device, list[tuple[str, int | None]]]:
    """(job id, uid) of the jobs holding each device, as Princeton jobstats' exporter reads them:
    from the device's mapping file, else from the Slurm jobs whose processes run there."""
    out: dict[Device, list[tuple[str, int | None]]] = {}
    # a dcgm-exporter style mapping file names the job only: its uid is the one its processes run as
    uids = {h.identity.job_id: h.identity.uid for h in snapshot.holders if h.identity.uid is not None}
    for device, found in _by_device(snapshot, (MAPPING, PROCESS)).items():
        holders = found.get(MAPPING) or [h for h in found.get(PROCESS, []) if h.identity.source == "slurm"]
        jobs: dict[str, int | None] = {}
        for h in holders:
            if jobs.get(h.identity.job_id) is None:
                jobs[h.identity.job_id] = (
                    h.identity.uid if h.identity.uid is not None else uids.get(h.identity.job_id)
                )
        if jobs:
            out[device] = sorted(jobs.items())
    return out
