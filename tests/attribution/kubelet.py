"""A real gRPC server implementing the kubelet pod-resources v1 API on a unix socket, for tests.

It answers device-plugin allocations (`devices`) and DRA ones (`dynamic_resources`: per claim the
driver, pool and device names and the CDI devices, as the kubelet reports ResourceClaims).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gpulens.exporter.attribution.podresources_pb import SERVICE, build_messages


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a ResourceClaim (ClaimResource): NVIDIA's DRA driver by default."""

    device: str
    pool: str = "node-1"
    driver: str = "gpu.nvidia.com"
    cdi: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClaimAllocation:
    """A container's ResourceClaim (namespace and name as the pod's) and its devices."""

    namespace: str
    pod: str
    container: str
    claim: str
    devices: tuple[ClaimDevice, ...]


@dataclass
class FakeKubelet:
    """Pods as (namespace, pod, container, resource name, [device ids]) and DRA `claims`;
    `delay_s` slows every answer; `answer`, when set, builds the whole List answer instead."""

    allocations: list[tuple[str, str, str, str, list[str]]] = field(default_factory=list)
    claims: list[ClaimAllocation] = field(default_factory=list)
    answer: Callable[[object], object] | None = None
    delay_s: float = 0.0
    list_calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def list_response(self, messages):
        if self.answer is not None:
            return self.answer(messages)
        response = messages.ListPodResourcesResponse()
        pods: dict[tuple[str, str], object] = {}

        def pod_entry(namespace: str, pod: str):
            entry = pods.get((namespace, pod))
            if entry is None:
                entry = pods[(namespace, pod)] = response.pod_resources.add(name=pod, namespace=namespace)
            return entry

        for namespace, pod, container, resource, device_ids in self.allocations:
            c = pod_entry(namespace, pod).containers.add(name=container)
            c.devices.add(resource_name=resource, device_ids=device_ids)
        for claim in self.claims:
            c = pod_entry(claim.namespace, claim.pod).containers.add(name=claim.container)
            dynamic = c.dynamic_resources.add(claim_name=claim.claim, claim_namespace=claim.namespace)
            for device in claim.devices:
                resource = dynamic.claim_resources.add(
                    driver_name=device.driver, pool_name=device.pool, device_name=device.device
                )
                for name in device.cdi:
                    resource.cdi_devices.add(name=name)
        return response


@contextlib.contextmanager
def kubelet_server(kubelet: FakeKubelet) -> Iterator[Path]:
    """Serve `kubelet` on `<short tmp dir>/kubelet.sock` (unix socket paths must stay < 108 bytes)."""
    messages = build_messages()
    directory = Path(tempfile.mkdtemp(prefix="gl-kubelet-", dir="/tmp"))
    socket_path = directory / "kubelet.sock"

    def list_handler(request, context):
        with kubelet.lock:
            kubelet.list_calls += 1
        if kubelet.delay_s:
            time.sleep(kubelet.delay_s)
        return kubelet.list_response(messages)

    def allocatable_handler(request, context):
        response = messages.AllocatableResourcesResponse()
        for _, _, _, resource, device_ids in kubelet.allocations:
            response.devices.add(resource_name=resource, device_ids=device_ids)
        return response

    def get_handler(request, context):
        full = kubelet.list_response(messages)
        for pod in full.pod_resources:
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return messages.GetPodResourcesResponse(pod_resources=pod)
        context.abort(grpc.StatusCode.NOT_FOUND, "pod not found")
        return None

    def handler(fn, request_cls, response_cls):
        return grpc.unary_unary_rpc_method_handler(
            fn,
            request_deserializer=request_cls.FromString,
            response_serializer=response_cls.SerializeToString,
        )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "List": handler(
                        list_handler, messages.ListPodResourcesRequest, messages.ListPodResourcesResponse
                    ),
                    "GetAllocatableResources": handler(
                        allocatable_handler,
                        messages.AllocatableResourcesRequest,
                        messages.AllocatableResourcesResponse,
                    ),
                    "Get": handler(
                        get_handler, messages.GetPodResourcesRequest, messages.GetPodResourcesResponse
                    ),
                },
            ),
        )
    )
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    try:
        yield socket_path
    finally:
        server.stop(grace=None)
        shutil.rmtree(directory, ignore_errors=True)
