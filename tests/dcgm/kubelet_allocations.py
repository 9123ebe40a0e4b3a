"""What the kubelet's pod-resources API would answer on a simulated Kubernetes scenario.

The NVIDIA device plugin allocates a GPU by UUID, a MIG instance by its MIG UUID (resource
`nvidia.com/mig-<profile>`), and a time-sliced GPU as replicas `<uuid>::<n>`, one per sharing pod.
"""

from __future__ import annotations

from gpulens.sim.engine import mig_uuid
from gpulens.sim.scenario import KubernetesJob, load_scenario

Allocation = tuple[str, str, str, str, list[str]]  # (namespace, pod, container, resource, device ids)


def scenario_allocations(name: str) -> list[Allocation]:
    scenario = load_scenario(name)
    gpus = {g.index: g for g in scenario.gpus}
    pods_per_device: dict[str, int] = {}
    out: list[Allocation] = []
    for spec in scenario.processes:
        job = spec.job
        if not isinstance(job, KubernetesJob):
            continue
        gpu = gpus[spec.gpu]
        if spec.instance is not None:
            inst = next(i for i in gpu.mig or () if i.gpu_instance_id == spec.instance)
            device, resource = (
                mig_uuid(scenario.hostname, gpu.index, inst),
                f"nvidia.com/mig-{inst.profile.name}",
            )
        else:
            device, resource = gpu.uuid, "nvidia.com/gpu"
        replica = pods_per_device.get(device, 0)
        pods_per_device[device] = replica + 1
        out.append((job.namespace, job.pod, job.container, resource, [f"{device}::{replica}"]))
    # a device only one pod holds is allocated whole (no replica suffix)
    return [
        (ns, pod, c, r, [ids[0].split("::")[0]] if pods_per_device[ids[0].split("::")[0]] == 1 else ids)
        for ns, pod, c, r, ids in out
    ]
