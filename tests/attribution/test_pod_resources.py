"""Device -> pod attribution through the kubelet pod-resources v1 gRPC API (a real server in the test)."""

import logging

import pytest

from gpulens.exporter.attribution.logonce import LogOnce
from gpulens.exporter.attribution.pod_resources import PodContainer, PodResourcesClient, device_key
from gpulens.exporter.attribution.podresources_pb import build_messages
from tests.attribution.fakes import CID_A, GPU0, GPU1, MIG_A, MIG_B, POD_UID_A, by_job, kube_systemd, proc
from tests.attribution.kubelet import FakeKubelet, kubelet_server


def test_whole_gpus_and_mig_devices_map_to_pods(node):
    kubelet = FakeKubelet(
        [
            ("ml", "trainer", "main", "nvidia.com/gpu", [GPU1]),
            ("ml", "small-a", "worker", "nvidia.com/mig-1g.10gb", [MIG_A]),
            ("web", "small-b", "server", "nvidia.com/mig-1g.10gb", [MIG_B]),
        ]
    )
    with kubelet_server(kubelet) as socket_path:
        attributor = node.attributor(pod_resources_socket=socket_path)
        jobs = by_job(
            attributor.attribute(
                [proc(10, gpu=1), proc(11, gi=1, mig_uuid=MIG_A), proc(12, gi=2, mig_uuid=MIG_B)]
            )
        )
        attributor.close()
    assert jobs[(1, None, "ml/trainer")].identity.container == "main"
    assert jobs[(1, None, "ml/trainer")].identity.source == "kubernetes"
    assert jobs[(0, 1, "ml/small-a")].sharing == "mig"
    assert jobs[(0, 2, "web/small-b")].identity.namespace == "web"


def test_replica_ids_of_one_pod_map_to_the_gpu(node):
    kubelet = FakeKubelet([("ml", "infer", "srv", "nvidia.com/gpu.shared", [f"{GPU0}::0", f"{GPU0}::3"])])
    with kubelet_server(kubelet) as socket_path:
        [usage] = node.attributor(pod_resources_socket=socket_path).attribute([proc(10)])
    assert usage.identity.job_id == "ml/infer"


def test_replicas_shared_by_several_pods_do_not_guess(node):
    kubelet = FakeKubelet(
        [
            ("ml", "a", "c", "nvidia.com/gpu", [f"{GPU0}::0"]),
            ("ml", "b", "c", "nvidia.com/gpu", [f"{GPU0}::1"]),
        ]
    )
    with kubelet_server(kubelet) as socket_path:
        [usage] = node.attributor(pod_resources_socket=socket_path).attribute([proc(10)])
    assert usage.identity.job_id == "unknown"


def test_procfs_pod_identity_wins_over_pod_resources(node):
    node.pod("ml", "real", POD_UID_A, {"main": CID_A})
    node.process(10, kube_systemd(POD_UID_A, CID_A))
    kubelet = FakeKubelet([("ml", "other", "c", "nvidia.com/gpu", [GPU0])])
    with kubelet_server(kubelet) as socket_path:
        [usage] = node.attributor(pod_resources_socket=socket_path).attribute([proc(10)])
    assert usage.identity.job_id == "ml/real"
    assert kubelet.list_calls == 0  # not even asked: every process was identified from procfs


def test_pod_resources_wins_over_mapping_file(node):
    node.mapping("0", "1234\n")
    kubelet = FakeKubelet([("ml", "p", "c", "nvidia.com/gpu", [GPU0])])
    with kubelet_server(kubelet) as socket_path:
        [usage] = node.attributor(pod_resources_socket=socket_path).attribute([proc(10)])
    assert usage.identity.job_id == "ml/p"


def test_kubelet_is_asked_at_most_every_few_seconds(node):
    kubelet = FakeKubelet([("ml", "p", "c", "nvidia.com/gpu", [GPU0])])
    with kubelet_server(kubelet) as socket_path:
        attributor = node.attributor(pod_resources_socket=socket_path)
        for _ in range(5):
            assert attributor.attribute([proc(10)])[0].identity.job_id == "ml/p"
        attributor.close()
    assert kubelet.list_calls == 1


def test_missing_socket_is_logged_once_and_the_rest_still_works(node, caplog):
    node.mapping("0", "1234\n")
    node.process(11, "0::/system.slice/slurmstepd.scope/job_9/step_0\n")
    attributor = node.attributor(pod_resources_socket=node.root / "no" / "kubelet.sock")
    attributor._pod_resources._backoff_s = 0  # retry on every sample: still logged only once
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            jobs = by_job(attributor.attribute([proc(10), proc(11)]))
    assert set(jobs) == {(0, None, "1234"), (0, None, "9")}
    assert sum("pod-resources socket" in r.getMessage() for r in caplog.records) == 1


def test_slow_kubelet_is_cut_off_at_the_deadline(node, caplog):
    kubelet = FakeKubelet([("ml", "p", "c", "nvidia.com/gpu", [GPU0])], delay_s=2.0)
    node.mapping("0", "1234\n")
    with kubelet_server(kubelet) as socket_path:
        attributor = node.attributor(pod_resources_socket=socket_path)
        with caplog.at_level(logging.WARNING):
            [usage] = attributor.attribute([proc(10)])
        attributor.close()
    # the kubelet's answer (ml/p) never arrived: the sample fell back to the mapping file
    assert usage.identity.job_id == "1234"
    assert sum("DEADLINE_EXCEEDED" in r.getMessage() for r in caplog.records) == 1


def test_slow_kubelet_is_not_asked_again_by_the_next_sample(node):
    kubelet = FakeKubelet([("ml", "p", "c", "nvidia.com/gpu", [GPU0])], delay_s=2.0)
    node.mapping("0", "1234\n")
    with kubelet_server(kubelet) as socket_path:
        attributor = node.attributor(pod_resources_socket=socket_path)
        first = attributor.attribute([proc(10)])
        second = attributor.attribute([proc(10)])  # within the backoff: no second deadline to wait
        attributor.close()
    assert first[0].identity.job_id == second[0].identity.job_id == "1234"
    assert kubelet.list_calls == 1


def test_kubelet_coming_back_is_used_again(node):
    kubelet = FakeKubelet([("ml", "p", "c", "nvidia.com/gpu", [GPU0])])
    client_log = LogOnce(logging.getLogger("t"))
    with kubelet_server(kubelet) as socket_path:
        clock = [0.0]
        client = PodResourcesClient(socket_path.parent / "absent.sock", client_log, clock=lambda: clock[0])
        assert client.devices() == {}
        client._socket_path = socket_path
        clock[0] += 31.0
        assert client.devices() == {GPU0: (PodContainer("ml", "p", "c"),)}
        client.close()


def test_device_keys():
    assert device_key(f"{GPU0}::7") == GPU0
    assert device_key(MIG_A) == MIG_A
    assert device_key("nvidia0") is None


def test_messages_match_the_kubelet_wire_format():
    """Bytes hand-encoded from api.proto field numbers (PodResources: name=1, namespace=2, containers=3;
    ContainerResources: name=1, devices=2; ContainerDevices: resource_name=1, device_ids=2)."""

    def ld(field, payload: bytes) -> bytes:  # length-delimited field
        return bytes([field << 3 | 2, len(payload)]) + payload

    devices = ld(1, b"nvidia.com/gpu") + ld(2, b"GPU-x") + ld(2, b"GPU-y::1")
    container = ld(1, b"c") + ld(2, devices)
    pod = ld(1, b"p") + ld(2, b"ns") + ld(3, container)
    wire = ld(1, pod)
    messages = build_messages()
    decoded = messages.ListPodResourcesResponse.FromString(wire)
    assert decoded.pod_resources[0].namespace == "ns"
    assert list(decoded.pod_resources[0].containers[0].devices[0].device_ids) == ["GPU-x", "GPU-y::1"]
    assert decoded.SerializeToString() == wire
    get = messages.GetPodResourcesRequest(pod_name="p", pod_namespace="ns")
    assert get.SerializeToString() == ld(1, b"p") + ld(2, b"ns")


def test_get_and_allocatable_methods_are_served():
    import grpc

    kubelet = FakeKubelet([("ml", "p", "c", "nvidia.com/gpu", [GPU0])])
    messages = build_messages()
    with kubelet_server(kubelet) as socket_path, grpc.insecure_channel(f"unix:{socket_path}") as channel:
        get = channel.unary_unary(
            "/v1.PodResourcesLister/Get",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=messages.GetPodResourcesResponse.FromString,
        )
        reply = get(messages.GetPodResourcesRequest(pod_name="p", pod_namespace="ml"), timeout=5)
        allocatable = channel.unary_unary(
            "/v1.PodResourcesLister/GetAllocatableResources",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=messages.AllocatableResourcesResponse.FromString,
        )(messages.AllocatableResourcesRequest(), timeout=5)
    assert reply.pod_resources.containers[0].devices[0].device_ids == [GPU0]
    assert list(allocatable.devices[0].device_ids) == [GPU0]


@pytest.mark.parametrize("disabled", [{"enable_pod_resources": False}, {"pod_resources_socket": None}])
def test_pod_resources_can_be_disabled(node, disabled):
    kubelet = FakeKubelet([("ml", "p", "c", "nvidia.com/gpu", [GPU0])])
    with kubelet_server(kubelet) as socket_path:
        settings = {"pod_resources_socket": socket_path, **disabled}
        [usage] = node.attributor(**settings).attribute([proc(10)])
    assert usage.identity.job_id == "unknown" and kubelet.list_calls == 0
