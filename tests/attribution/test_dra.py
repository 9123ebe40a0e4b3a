"""GPUs and MIG devices allocated through DRA ResourceClaims, attributed from the kubelet's
pod-resources `dynamic_resources` (a real gRPC server) and the node's ResourceSlices (a real HTTP
server standing in for the API server)."""

import logging

from gpulens.exporter.attribution.dra import DraDevice, uuid_in_names
from gpulens.exporter.attribution.logonce import LogOnce
from gpulens.exporter.attribution.model import DeviceRef
from gpulens.exporter.attribution.pod_resources import PodContainer, PodResourcesClient, read_allocations
from gpulens.exporter.attribution.podresources_pb import build_messages
from gpulens.exporter.attribution.resourceslices import KubeApi, ResourceSlices
from tests.attribution.fakes import GPU0, GPU1, MIG_A, by_job, proc
from tests.attribution.kubeapi import KubeApiStandIn, kube_api, nvidia_slice
from tests.attribution.kubelet import ClaimAllocation, ClaimDevice, FakeKubelet, kubelet_server

NODE = "node-1"
SLICE = nvidia_slice(NODE, {"gpu-0": GPU0, "gpu-1": GPU1, "gpu-0-mig-1g10gb-19-0": MIG_A})


def claim(namespace: str, pod: str, device: str, container: str = "main", name: str = "") -> ClaimAllocation:
    cdi = (f"k8s.gpu.nvidia.com/claim=6f1e2d3c-{device}",)  # NVIDIA's driver: no UUID in the name
    return ClaimAllocation(namespace, pod, container, name or f"{pod}-gpu", (ClaimDevice(device, cdi=cdi),))


def attribute(node, kubelet: FakeKubelet, api: KubeApiStandIn, processes):
    with kubelet_server(kubelet) as socket_path, kube_api(api) as url:
        attributor = node.attributor(pod_resources_socket=socket_path, kube_api=KubeApi(url), node_name=NODE)
        try:
            return by_job(attributor.attribute(processes))
        finally:
            attributor.close()


def test_a_whole_gpu_from_a_resource_claim_is_attributed_to_its_pod(node):
    kubelet = FakeKubelet(claims=[claim("ml", "trainer-0", "gpu-1", container="train")])
    jobs = attribute(node, kubelet, KubeApiStandIn([SLICE]), [proc(10, gpu=1)])
    identity = jobs[(1, None, "ml/trainer-0")].identity
    assert (identity.source, identity.namespace, identity.pod, identity.container) == (
        "kubernetes",
        "ml",
        "trainer-0",
        "train",
    )


def test_a_mig_device_from_a_resource_claim_is_attributed_to_its_pod(node):
    kubelet = FakeKubelet(claims=[claim("research", "nb-0", "gpu-0-mig-1g10gb-19-0")])
    jobs = attribute(node, kubelet, KubeApiStandIn([SLICE]), [proc(11, gi=1, mig_uuid=MIG_A)])
    assert jobs[(0, 1, "research/nb-0")].sharing == "mig"


def test_a_uuid_in_the_cdi_device_name_needs_no_api_call(node):
    named = ClaimDevice("gpu0", driver="gpu.example.com", cdi=(f"nvidia.com/gpu={GPU0}",))
    kubelet = FakeKubelet(claims=[ClaimAllocation("ml", "p", "c", "p-gpu", (named,))])
    api = KubeApiStandIn([SLICE])
    jobs = attribute(node, kubelet, api, [proc(10)])
    assert jobs[(0, None, "ml/p")].identity.container == "c"
    assert api.lists() == []


def test_a_device_shared_through_one_claim_is_not_guessed_for_a_process(node):
    kubelet = FakeKubelet(
        claims=[claim("ml", "a", "gpu-0", name="shared"), claim("ml", "b", "gpu-0", name="shared")]
    )
    jobs = attribute(node, kubelet, KubeApiStandIn([SLICE]), [proc(10)])
    assert set(jobs) == {(0, None, "unknown")}  # like a time-sliced GPU: the device cannot say whose


def test_every_pod_sharing_a_claimed_device_holds_it(node):
    kubelet = FakeKubelet(
        claims=[claim("ml", "a", "gpu-0", name="shared"), claim("ml", "b", "gpu-0", name="shared")]
    )
    with kubelet_server(kubelet) as socket_path, kube_api(KubeApiStandIn([SLICE])) as url:
        attributor = node.attributor(pod_resources_socket=socket_path, kube_api=KubeApi(url), node_name=NODE)
        holders = attributor.holders([DeviceRef(0, GPU0), DeviceRef(1, GPU1)], [])
        attributor.close()
    assert sorted((h.gpu, h.identity.job_id, h.source) for h in holders) == [
        (0, "ml/a", "pod_resources"),
        (0, "ml/b", "pod_resources"),
    ]


def test_device_plugin_and_dra_allocations_on_one_node_are_both_attributed(node):
    kubelet = FakeKubelet(
        [("ml", "legacy", "c", "nvidia.com/gpu", [GPU0])], claims=[claim("ml", "dra", "gpu-1")]
    )
    jobs = attribute(node, kubelet, KubeApiStandIn([SLICE]), [proc(10), proc(11, gpu=1)])
    assert {key[2] for key in jobs} == {"ml/legacy", "ml/dra"}


def test_resource_slices_are_listed_once_for_devices_already_known(node):
    kubelet = FakeKubelet(claims=[claim("ml", "p", "gpu-0")])
    api = KubeApiStandIn([SLICE])
    with kubelet_server(kubelet) as socket_path, kube_api(api) as url:
        clock = [0.0]
        log = LogOnce(logging.getLogger("t"))
        slices = ResourceSlices(KubeApi(url), NODE, log, clock=lambda: clock[0])
        client = PodResourcesClient(socket_path, log, clock=lambda: clock[0], uuids=slices)
        for _ in range(4):
            clock[0] += 6.0  # past the kubelet answer's 5 s cache: asked again every time
            assert client.devices() == {GPU0: (PodContainer("ml", "p", "main"),)}
        client.close()
    assert kubelet.list_calls == 4
    assert len(api.lists()) == 1


def test_an_unknown_device_asks_again_only_after_the_refresh_interval():
    api = KubeApiStandIn([SLICE])
    clock = [0.0]
    with kube_api(api) as url:
        slices = ResourceSlices(KubeApi(url), NODE, LogOnce(logging.getLogger("t")), clock=lambda: clock[0])
        unknown = DraDevice("gpu.nvidia.com", NODE, "gpu-7")
        assert slices.uuid_of(unknown) is None
        clock[0] += 10.0
        api.slices = [nvidia_slice(NODE, {"gpu-7": GPU1})]  # the driver published it meanwhile
        assert slices.uuid_of(unknown) is None  # 10 s after the last listing: not asked yet
        clock[0] += 25.0
        assert slices.uuid_of(unknown) == GPU1
    assert len(api.lists()) == 2


def test_a_mig_device_re_created_under_its_name_gets_its_new_uuid():
    api = KubeApiStandIn([SLICE])
    clock = [0.0]
    mig = DraDevice("gpu.nvidia.com", NODE, "gpu-0-mig-1g10gb-19-0")
    new_uuid = "MIG-cccccccc-1111-2222-3333-000000000000"
    with kube_api(api) as url:
        slices = ResourceSlices(KubeApi(url), NODE, LogOnce(logging.getLogger("t")), clock=lambda: clock[0])
        assert slices.uuid_of(mig) == MIG_A
        api.slices = [nvidia_slice(NODE, {"gpu-0-mig-1g10gb-19-0": new_uuid})]
        clock[0] += 301.0
        assert slices.uuid_of(mig) == new_uuid


def test_paged_slices_and_older_api_versions_are_read():
    api = KubeApiStandIn(
        [nvidia_slice(NODE, {"gpu-0": GPU0}, "v1beta1"), nvidia_slice(NODE, {"gpu-1": GPU1}, "v1beta1")],
        version="v1beta1",
        page_size=1,
    )
    with kube_api(api) as url:
        slices = ResourceSlices(KubeApi(url), NODE, LogOnce(logging.getLogger("t")))
        assert slices.uuid_of(DraDevice("gpu.nvidia.com", NODE, "gpu-1")) == GPU1
    assert [r.split("?")[0].rsplit("/", 2)[1] for r in api.lists()] == ["v1", "v1beta2", "v1beta1", "v1beta1"]


def test_other_nodes_slices_and_non_gpu_uuids_are_not_used():
    other = nvidia_slice("node-2", {"gpu-0": GPU1})
    odd = nvidia_slice(NODE, {"gpu-0": "not-a-gpu", "gpu-1": GPU1})
    with kube_api(KubeApiStandIn([other, odd])) as url:
        slices = ResourceSlices(KubeApi(url), NODE, LogOnce(logging.getLogger("t")))
        assert slices.uuid_of(DraDevice("gpu.nvidia.com", NODE, "gpu-0")) == ""  # listed, not a GPU
        assert slices.uuid_of(DraDevice("gpu.nvidia.com", NODE, "gpu-1")) == GPU1


def test_a_claimed_device_that_is_no_gpu_is_neither_logged_nor_asked_about_again(node, caplog):
    nic = nvidia_slice(NODE, {})
    nic["spec"].update(
        driver="dra.net", devices=[{"name": "eth1", "attributes": {"ifName": {"string": "eth1"}}}]
    )
    kubelet = FakeKubelet(
        claims=[ClaimAllocation("ml", "p", "c", "p-nic", (ClaimDevice("eth1", driver="dra.net"),))]
    )
    api = KubeApiStandIn([SLICE, nic])
    with kubelet_server(kubelet) as socket_path, kube_api(api) as url:
        attributor = node.attributor(pod_resources_socket=socket_path, kube_api=KubeApi(url), node_name=NODE)
        attributor._pod_resources._refresh_s = 0  # ask the kubelet every sample
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                attributor.attribute([proc(10)])
        attributor.close()
    assert kubelet.list_calls == 3
    assert len(api.lists()) == 1
    assert not [r for r in caplog.records if "DRA" in r.getMessage()]


def test_forbidden_slices_are_one_line_and_device_plugin_pods_still_attributed(node, caplog):
    kubelet = FakeKubelet(
        [("ml", "legacy", "c", "nvidia.com/gpu", [GPU0])], claims=[claim("ml", "dra", "gpu-1")]
    )
    with caplog.at_level(logging.WARNING):
        jobs = attribute(node, kubelet, KubeApiStandIn([SLICE], status=403), [proc(10), proc(11, gpu=1)])
    assert set(jobs) == {(0, None, "ml/legacy"), (1, None, "unknown")}
    forbidden = [r.getMessage() for r in caplog.records if "ResourceSlices" in r.getMessage()]
    assert len(forbidden) == 2  # the listing, and the claimed device left without a UUID
    assert all("\n" not in m for m in forbidden)
    assert any("HTTP 403" in m and "list on resource.k8s.io resourceslices" in m for m in forbidden)


def test_without_an_api_server_an_unnamed_dra_device_is_one_line(node, caplog):
    kubelet = FakeKubelet(claims=[claim("ml", "p", "gpu-0")])
    with kubelet_server(kubelet) as socket_path:
        attributor = node.attributor(pod_resources_socket=socket_path)
        attributor._pod_resources._refresh_s = 0  # ask the kubelet every sample: still one line
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                [usage] = attributor.attribute([proc(10)])
        attributor.close()
    assert usage.identity.job_id == "unknown"
    lines = [r.getMessage() for r in caplog.records if "DRA devices" in r.getMessage()]
    assert lines == [
        "attribution: 1 DRA devices have no GPU or MIG UUID in the kubelet answer, e.g. "
        "gpu.nvidia.com/node-1/gpu-0; their pods are not attributed from it (docs/attribution.md, DRA)"
    ]


# -- hostile answers ------------------------------------------------------------------------


def _response_with_claims(messages, claims: int, devices_per_claim: int):
    response = messages.ListPodResourcesResponse()
    container = response.pod_resources.add(name="p", namespace="ml").containers.add(name="c")
    for i in range(claims):
        dynamic = container.dynamic_resources.add(claim_name=f"c{i}", claim_namespace="ml")
        for j in range(devices_per_claim):
            dynamic.claim_resources.add(driver_name="gpu.nvidia.com", pool_name=NODE, device_name=f"gpu-{j}")
    return response


def test_an_answer_with_more_entries_than_the_limit_is_read_only_up_to_it():
    response = _response_with_claims(build_messages(), claims=50, devices_per_claim=50)
    allocations = read_allocations(response, max_entries=100)
    assert allocations.truncated
    assert len(allocations.dra) <= 100


def test_a_huge_dra_answer_is_one_line_and_the_client_keeps_working(node, caplog):
    kubelet = FakeKubelet(
        answer=lambda messages: _response_with_claims(messages, claims=300, devices_per_claim=300)
    )
    with kubelet_server(kubelet) as socket_path:
        attributor = node.attributor(pod_resources_socket=socket_path)
        with caplog.at_level(logging.WARNING):
            [usage] = attributor.attribute([proc(10)])
        attributor.close()
    assert usage.identity.job_id == "unknown"
    assert sum("more than 65536 entries" in r.getMessage() for r in caplog.records) == 1


def test_an_answer_over_the_message_limit_is_refused_in_one_line(node, caplog):
    def huge(messages):
        response = messages.ListPodResourcesResponse()
        for i in range(5):
            response.pod_resources.add(name=f"p{i}", namespace="x" * (1 << 20))
        return response

    node.mapping("0", "1234\n")
    with kubelet_server(FakeKubelet(answer=huge)) as socket_path:
        attributor = node.attributor(pod_resources_socket=socket_path)
        with caplog.at_level(logging.WARNING):
            [usage] = attributor.attribute([proc(10)])
        attributor.close()
    assert usage.identity.job_id == "1234"  # the other sources still answer
    assert sum("RESOURCE_EXHAUSTED" in r.getMessage() for r in caplog.records) == 1


def test_claim_devices_missing_names_are_skipped_in_one_line(node, caplog):
    def partial(messages):
        response = messages.ListPodResourcesResponse()
        good = response.pod_resources.add(name="good", namespace="ml").containers.add(name="c")
        good.dynamic_resources.add(claim_name="g", claim_namespace="ml").claim_resources.add(
            driver_name="gpu.nvidia.com", pool_name=NODE, device_name="gpu-0", cdi_devices=[{"name": "x"}]
        )
        bad = response.pod_resources.add(name="bad", namespace="ml").containers.add(name="c")
        bad.dynamic_resources.add(claim_name="b").claim_resources.add(cdi_devices=[{"name": "y"}])
        bad.dynamic_resources.add()  # no claim, no devices
        response.pod_resources.add(namespace="ml").containers.add(name="nameless")
        return response

    with kubelet_server(FakeKubelet(answer=partial)) as socket_path, kube_api(KubeApiStandIn([SLICE])) as url:
        attributor = node.attributor(pod_resources_socket=socket_path, kube_api=KubeApi(url), node_name=NODE)
        with caplog.at_level(logging.WARNING):
            [usage] = attributor.attribute([proc(10)])
        attributor.close()
    assert usage.identity.job_id == "ml/good"
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert lines == [
        "attribution: 2 kubelet pod-resources entries skipped, e.g. pod ml/bad claim /b: "
        "driver, pool and device names expected"
    ]


# -- names and the wire ------------------------------------------------------------------------


def test_uuids_are_found_in_device_and_cdi_names():
    assert uuid_in_names(DraDevice("d", "p", GPU0)) == GPU0
    assert uuid_in_names(DraDevice("d", "p", "gpu-0", (f"vendor.com/gpu={GPU1}",))) == GPU1
    assert uuid_in_names(DraDevice("d", "p", f"mig-of-{GPU0}", (f"v.com/mig={MIG_A}",))) == MIG_A
    legacy = f"MIG-{GPU0}/1/0"
    assert uuid_in_names(DraDevice("d", "p", "x", (legacy,))) == legacy
    assert (
        uuid_in_names(DraDevice("gpu.nvidia.com", NODE, "gpu-0", ("k8s.gpu.nvidia.com/claim=u-gpu-0",)))
        is None
    )


def test_dynamic_resources_match_the_kubelet_wire_format():
    """Bytes hand-encoded from api.proto: ContainerResources.dynamic_resources=5; DynamicResource
    claim_name=2, claim_namespace=3, claim_resources=4; ClaimResource cdi_devices=1, driver_name=2,
    pool_name=3, device_name=4, share_id=5; CDIDevice name=1."""

    def ld(field, payload: bytes) -> bytes:
        return bytes([field << 3 | 2, len(payload)]) + payload

    resource = ld(1, ld(1, b"k8s.gpu.nvidia.com/claim=u-gpu-0")) + ld(2, b"gpu.nvidia.com")
    resource += ld(3, b"node-1") + ld(4, b"gpu-0") + ld(5, b"s1")
    dynamic = ld(2, b"claim") + ld(3, b"ml") + ld(4, resource)
    container = ld(1, b"c") + ld(5, dynamic)
    wire = ld(1, ld(1, b"p") + ld(2, b"ml") + ld(3, container))
    decoded = build_messages().ListPodResourcesResponse.FromString(wire)
    allocations = read_allocations(decoded)
    device = DraDevice("gpu.nvidia.com", "node-1", "gpu-0", ("k8s.gpu.nvidia.com/claim=u-gpu-0",))
    assert allocations.dra == {device: frozenset({PodContainer("ml", "p", "c")})}
    assert decoded.pod_resources[0].containers[0].dynamic_resources[0].claim_resources[0].share_id == "s1"
    assert decoded.SerializeToString() == wire


def test_the_in_cluster_api_server_is_used_only_with_a_mounted_token(tmp_path):
    from gpulens.exporter.attribution.resourceslices import in_cluster_api

    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_api(env, tmp_path) is None  # the charts mount no token by default
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("")
    assert in_cluster_api(env, tmp_path) == KubeApi(
        "https://[fd00::1]:6443", tmp_path / "token", tmp_path / "ca.crt"
    )
    assert in_cluster_api({}, tmp_path) is None
