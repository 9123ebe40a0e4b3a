"""Message classes of the kubelet pod-resources v1 API, built at runtime from descriptors.

Why not generated `_pb2` modules: generated code pins a protobuf runtime version and needs
grpcio-tools at build time. The API is small and stable, so its messages are declared here with
`google.protobuf.descriptor_pb2`, field numbers copied from kubernetes
`staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto` (package `v1`, service
`v1.PodResourcesLister`: List, GetAllocatableResources, Get). They live in a private descriptor
pool so they never clash with another `v1` package in the default pool. `tests/attribution` checks
the wire encoding against hand-encoded bytes, so a wrong field number here fails a test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "v1"
SERVICE = "v1.PodResourcesLister"
METHOD_LIST = f"/{SERVICE}/List"
METHOD_ALLOCATABLE = f"/{SERVICE}/GetAllocatableResources"
METHOD_GET = f"/{SERVICE}/Get"

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _INT64, _UINT64, _MESSAGE = _F.TYPE_STRING, _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_MESSAGE
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# message name -> [(field name, number, type, label, message type name or "")]
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [
        ("devices", 1, _MESSAGE, _REPEATED, "ContainerDevices"),
        ("cpu_ids", 2, _INT64, _REPEATED, ""),
        ("memory", 3, _MESSAGE, _REPEATED, "ContainerMemory"),
    ],
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _MESSAGE, _REPEATED, "PodResources")],
    "PodResources": [
        ("name", 1, _STRING, _OPTIONAL, ""),
        ("namespace", 2, _STRING, _OPTIONAL, ""),
        ("containers", 3, _MESSAGE, _REPEATED, "ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, _STRING, _OPTIONAL, ""),
        ("devices", 2, _MESSAGE, _REPEATED, "ContainerDevices"),
        ("cpu_ids", 3, _INT64, _REPEATED, ""),
        ("memory", 4, _MESSAGE, _REPEATED, "ContainerMemory"),
        ("dynamic_resources", 5, _MESSAGE, _REPEATED, "DynamicResource"),
    ],
    "ContainerMemory": [
        ("memory_type", 1, _STRING, _OPTIONAL, ""),
        ("size", 2, _UINT64, _OPTIONAL, ""),
        ("topology", 3, _MESSAGE, _OPTIONAL, "TopologyInfo"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, _STRING, _OPTIONAL, ""),
        ("device_ids", 2, _STRING, _REPEATED, ""),
        ("topology", 3, _MESSAGE, _OPTIONAL, "TopologyInfo"),
    ],
    "TopologyInfo": [("nodes", 1, _MESSAGE, _REPEATED, "NUMANode")],
    "NUMANode": [("ID", 1, _INT64, _OPTIONAL, "")],
    "DynamicResource": [
        ("claim_name", 2, _STRING, _OPTIONAL, ""),
        ("claim_namespace", 3, _STRING, _OPTIONAL, ""),
        ("claim_resources", 4, _MESSAGE, _REPEATED, "ClaimResource"),
    ],
    "ClaimResource": [
        ("cdi_devices", 1, _MESSAGE, _REPEATED, "CDIDevice"),
        ("driver_name", 2, _STRING, _OPTIONAL, ""),
        ("pool_name", 3, _STRING, _OPTIONAL, ""),
        ("device_name", 4, _STRING, _OPTIONAL, ""),
        # `optional` in api.proto (consumable capacity, 1.34+): presence only, the same on the wire
        ("share_id", 5, _STRING, _OPTIONAL, ""),
    ],
    "CDIDevice": [("name", 1, _STRING, _OPTIONAL, "")],
    "GetPodResourcesRequest": [
        ("pod_name", 1, _STRING, _OPTIONAL, ""),
        ("pod_namespace", 2, _STRING, _OPTIONAL, ""),
    ],
    "GetPodResourcesResponse": [("pod_resources", 1, _MESSAGE, _OPTIONAL, "PodResources")],
}


@dataclass(frozen=True)
class PodResourcesMessages:
    """The message classes (attribute names as in api.proto)."""

    ListPodResourcesRequest: Any
    ListPodResourcesResponse: Any
    PodResources: Any
    ContainerResources: Any
    ContainerDevices: Any
    AllocatableResourcesRequest: Any
    AllocatableResourcesResponse: Any
    GetPodResourcesRequest: Any
    GetPodResourcesResponse: Any


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="gpulens/kubelet/podresources/v1/api.proto", package=PACKAGE, syntax="proto3"
    )
    for message_name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=message_name)
        for name, number, ftype, label, type_name in fields:
            field = message.field.add(name=name, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = f".{PACKAGE}.{type_name}"
    service = proto.service.add(name="PodResourcesLister")
    for method, request, response in (
        ("List", "ListPodResourcesRequest", "ListPodResourcesResponse"),
        ("GetAllocatableResources", "AllocatableResourcesRequest", "AllocatableResourcesResponse"),
        ("Get", "GetPodResourcesRequest", "GetPodResourcesResponse"),
    ):
        service.method.add(
            name=method, input_type=f".{PACKAGE}.{request}", output_type=f".{PACKAGE}.{response}"
        )
    return proto


def build_messages() -> PodResourcesMessages:
    """Fresh message classes in a private pool (cheap; called once per client / test server)."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor())
    classes = {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in PodResourcesMessages.__dataclass_fields__
    }
    return PodResourcesMessages(**classes)
