"""What the kubelet's pod-resources API would answer on a simulated Kubernetes scenario.

The NVIDIA device plugin allocates a GPU by UUID, a MIG instance by its MIG UUID (resource
`nvidia.com/mig-<profile>`), and a time-sliced GPU as replicas `<uuid>::<n>`, one per sharing pod.
With NVIDIA's DRA driver instead (`scenario_claims`), the kubelet names each device of a pod's
ResourceClaim by driver, pool (the node) and device name, and the node's ResourceSlice maps that
name to the UUID.
"""

from __future__ import annotations

from gpulens.sim.engine import mig_uuid
from gpulens.sim.scenario import KubernetesJob, MigInstanceSpec
from gpulens.sim.scenariofile import load_scenario
from tests.attribution.kubelet import ClaimAllocation, ClaimDevice

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


def dra_device_name(gpu: int, inst: MigInstanceSpec | None = None) -> str:
    """The device name NVIDIA's DRA driver publishes: `gpu-<minor>` (the simulator's minor numbers
    are the indexes), `gpu-<minor>-mig-<profile without dots>-<profile id>-<placement start>`."""
    if inst is None:
        return f"gpu-{gpu}"
    profile = inst.profile.name.replace(".", "").replace("+", "-")
    return f"gpu-{gpu}-mig-{profile}-{inst.profile.smi_profile_id}-{inst.start}"


def scenario_claims(name: str) -> tuple[list[ClaimAllocation], dict[str, str]]:
    """The same pods with their devices allocated through DRA instead: one ResourceClaim per pod
    (pods sharing a time-sliced GPU share its device), and the ResourceSlice's device name -> UUID
    for every GPU and MIG device of the node."""
    scenario = load_scenario(name)
    node = scenario.hostname
    gpus = {g.index: g for g in scenario.gpus}
    published: dict[str, str] = {}
    for gpu in scenario.gpus:
        published[dra_device_name(gpu.index)] = gpu.uuid
        for inst in gpu.mig or ():
            published[dra_device_name(gpu.index, inst)] = mig_uuid(node, gpu.index, inst)
    claims: list[ClaimAllocation] = []
    for spec in scenario.processes:
        job = spec.job
        if not isinstance(job, KubernetesJob):
            continue
        held = (
            next(i for i in gpus[spec.gpu].mig or () if i.gpu_instance_id == spec.instance)
            if (spec.instance is not None)
            else None
        )
        device = dra_device_name(spec.gpu, held)
        cdi = (f"k8s.gpu.nvidia.com/claim=0c1d2e3f-{device}",)
        claims.append(
            ClaimAllocation(
                job.namespace, job.pod, job.container, f"{job.pod}-gpu", (ClaimDevice(device, node, cdi=cdi),)
            )
        )
    return claims, published
