"""DRA on a simulated Kubernetes node: the exporter, scraping a stand-in kubelet that reports every
pod's GPU or MIG device as a ResourceClaim device (NVIDIA's DRA driver names, no UUID) and a
stand-in API server publishing the node's ResourceSlice, names the same pods as with the device
plugin: on `gpu_job_info` and on `--compat dcgm`'s device series."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.core import Metric

from gpulens.sim.scenariofile import load_scenario
from tests.attribution.kubeapi import KubeApiStandIn, kube_api, nvidia_slice
from tests.attribution.kubelet import FakeKubelet, kubelet_server
from tests.dcgm.conftest import Sim, series, two_samples
from tests.dcgm.kubelet_allocations import scenario_claims
from tests.dcgm.test_kubernetes import EXPECTED, POD

SCENARIO = "k8s-a100-mixed"


def _scrape(sim: Sim, **config: Any) -> tuple[list[Metric], KubeApiStandIn]:
    claims, published = scenario_claims(SCENARIO)
    node = load_scenario(SCENARIO).hostname
    api = KubeApiStandIn([nvidia_slice(node, published)])
    with kubelet_server(FakeKubelet(claims=claims)) as socket, kube_api(api) as url:
        exporter = sim.exporter(
            pod_resources_socket=socket, kubernetes_api_url=url, kubernetes_node_name=node, **config
        )
        return two_samples(exporter, sim), api


@pytest.fixture
def without_procfs(simulate: Callable[[str], Sim]) -> tuple[list[Metric], KubeApiStandIn]:
    # process cgroups would name the pods first: without them every name comes from the kubelet
    return _scrape(simulate(SCENARIO), attribution_procfs=False)


def test_dra_allocated_gpus_and_mig_devices_name_their_pods_jobs(without_procfs) -> None:
    families, _ = without_procfs
    found = {
        (labels["gpu"], labels["gpu_instance"]): (
            labels["job_pod"],
            labels["job_namespace"],
            labels["job_container"],
        )
        for labels, _ in series(families, "gpu_job_info")
        if labels["job_source"] == "kubernetes"
    }
    assert found == EXPECTED


def test_a_gpu_shared_through_one_device_is_not_guessed(without_procfs) -> None:
    families, _ = without_procfs
    jobs = {labels["job_id"] for labels, _ in series(families, "gpu_job_info", gpu="0")}
    assert jobs == {"unknown"}  # three pods share GPU 0's device: which process is whose is unknown


def test_the_node_s_resource_slices_are_listed_once(without_procfs) -> None:
    _, api = without_procfs
    assert len(api.lists()) == 1


def test_dcgm_compat_series_of_dra_devices_carry_their_pod(simulate: Callable[[str], Sim]) -> None:
    families, _ = _scrape(simulate(SCENARIO), compat="dcgm")
    found = {}
    for labels, _ in series(families, "DCGM_FI_DEV_GPU_TEMP"):
        if "pod" in labels:
            found[(labels["gpu"], labels.get("GPU_I_ID", ""))] = tuple(labels[k] for k in POD)
    assert found == EXPECTED
