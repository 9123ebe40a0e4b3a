"""`--compat dcgm` on Kubernetes: pod, namespace and container on the series of a device one pod
holds (dcgm-exporter's default pod mapping), from the kubelet's pod-resources API."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client.core import Metric

from tests.attribution.kubelet import FakeKubelet, kubelet_server
from tests.dcgm.conftest import Sim, series, two_samples
from tests.dcgm.kubelet_allocations import scenario_allocations

POD = ("pod", "namespace", "container")
# k8s-a100-mixed: GPU 0 time-sliced by three pods, GPU 1 MIG (instance 13 unused), GPUs 2 and 3 exclusive
EXPECTED = {
    ("1", "3"): ("triton-resnet-5c8d7f9b4-8wq2n", "ml-serving", "triton"),
    ("1", "4"): ("lora-sweep-3-0", "research", "trainer"),
    ("1", "11"): ("jupyter-omar-0", "research", "notebook"),
    ("1", "12"): ("ocr-worker-6f7b9d-kx7vw", "docs", "ocr"),
    ("2", ""): ("pretrain-llm-0", "research", "trainer"),
    ("3", ""): ("feature-stream-0", "batch", "app"),
}


def _pods_on(families: list[Metric], name: str) -> dict[tuple[str, str], tuple[str, ...] | None]:
    out: dict[tuple[str, str], tuple[str, ...] | None] = {}
    for labels, _ in series(families, name):
        key = (labels["gpu"], labels.get("GPU_I_ID", ""))
        out[key] = tuple(labels[k] for k in POD) if "pod" in labels else None
    return out


@pytest.fixture
def k8s(simulate: Callable[[str], Sim]) -> list[Metric]:
    sim = simulate("k8s-a100-mixed")
    with kubelet_server(FakeKubelet(scenario_allocations("k8s-a100-mixed"))) as socket:
        return two_samples(sim.exporter(compat="dcgm", pod_resources_socket=socket), sim)


def test_a_device_one_pod_holds_carries_its_pod_namespace_and_container(k8s: list[Metric]) -> None:
    found = _pods_on(k8s, "DCGM_FI_DEV_GPU_TEMP")
    assert {key: value for key, value in found.items() if value is not None} == EXPECTED


def test_a_device_several_pods_share_carries_no_pod_labels(k8s: list[Metric]) -> None:
    found = _pods_on(k8s, "DCGM_FI_DEV_FB_USED")
    assert found[("0", "")] is None  # three time-slicing pods: which one a value belongs to is unknown
    assert found[("1", "13")] is None  # an instance no pod holds


def test_every_compat_family_of_a_held_device_carries_the_pod(k8s: list[Metric]) -> None:
    for family in k8s:
        if not family.name.startswith("DCGM_"):
            continue
        for sample in family.samples:
            key = (sample.labels["gpu"], sample.labels.get("GPU_I_ID", ""))
            assert tuple(sample.labels.get(k) for k in POD) == EXPECTED.get(key, (None, None, None)), (
                family.name,
                sample.labels,
            )


def test_an_allocated_pod_without_processes_still_labels_its_device(simulate: Callable[[str], Sim]) -> None:
    sim = simulate("k8s-a100-mixed")
    spare = next(u for u in sim.node.identities if u.index == 3).uuid
    kubelet = FakeKubelet([("ml", "idle-0", "main", "nvidia.com/gpu", [spare])])
    with kubelet_server(kubelet) as socket:
        families = two_samples(sim.exporter(compat="dcgm", pod_resources_socket=socket), sim)
    ((labels, _),) = series(families, "DCGM_FI_DEV_GPU_TEMP", gpu="3")
    assert (labels["pod"], labels["namespace"], labels["container"]) == ("idle-0", "ml", "main")


def test_without_the_kubelet_socket_pods_come_from_the_processes_cgroups(
    simulate: Callable[[str], Sim],
) -> None:
    sim = simulate("k8s-a100-mixed")
    families = two_samples(sim.exporter(compat="dcgm", pod_resources_socket=None), sim)
    found = _pods_on(families, "DCGM_FI_DEV_GPU_TEMP")
    assert {key: value for key, value in found.items() if value is not None} == EXPECTED


def test_native_series_never_get_pod_labels(k8s: list[Metric]) -> None:
    for family in k8s:
        if family.name.startswith("gpu_") and not family.name.startswith("gpu_job_"):
            assert all("pod" not in s.labels for s in family.samples), family.name
