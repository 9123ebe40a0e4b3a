"""Fence one GPU instead of its node: Kubernetes DRA device taints (`DeviceTaintRule`).

Where the cluster allocates GPUs through Dynamic Resource Allocation (NVIDIA's DRA driver publishes
each GPU, or each MIG device, as a device of a `ResourceSlice` with its `uuid` attribute), a
`DeviceTaintRule` taints that one device: `NoSchedule` keeps new claims off it, `NoExecute` also
evicts the pods already using it (the device taint eviction controller deletes them), and the node
stays schedulable for its healthy GPUs. A device-plugin cluster has no such API: there the node is
cordoned and tainted as before (kubernetes.py).

Whether the cluster serves the rules is read from the API (`GET /apis/resource.k8s.io`, then the
resource list of each served version, newest first); the answer is kept once it is known.
Every call takes the action's deadline and never raises for API failures (a `DraError` is caught
by the isolator). RBAC: resourceslices list, devicetaintrules create/get/delete.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import urllib.parse
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpulens.httpclient import Deadline
from gpulens.remediate.kubernetes import (
    LIST_PAGE,
    MAX_LIST_PAGES,
    MAX_PAGE_ANSWER,
    TAINT_KEY,
    KubernetesClient,
    KubernetesError,
)

log = logging.getLogger("gpulens.remediate")
GROUP = "resource.k8s.io"
# newest first: DeviceTaintRule is v1alpha3 in 1.33-1.35, v1beta2 in 1.36, v1 once GA
VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")
ANNOTATION_EPISODE = "gpulens.io/episode"
LABEL_NODE = "gpulens.io/node"
MAX_DEVICES = 4096  # devices of one node: more is not one node's GPUs


class DraError(Exception):
    """A DRA API call failed; the message is one line."""


class DraMode(StrEnum):
    """`--dra-device-taints`: ask the API (auto), always fence GPUs (on), never (off)."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class Effect(StrEnum):
    NO_SCHEDULE = "NoSchedule"  # no new claim gets the device; running pods finish
    NO_EXECUTE = "NoExecute"  # and pods using it are evicted: the GPU must be idle to be reset


@dataclass(frozen=True)
class Device:
    """One device of a ResourceSlice: what a DeviceTaintRule's deviceSelector names."""

    driver: str
    pool: str
    name: str
    uuid: str
    parent_uuid: str = ""  # a MIG device's GPU

    @property
    def gpu_uuid(self) -> str:
        return self.parent_uuid or self.uuid


@dataclass(frozen=True)
class NodeDevices:
    """The devices gpulens would fence for one GPU, and how many other GPUs the node has."""

    faulty: tuple[Device, ...]
    other_gpus: int


def rule_name(episode_id: str, device: Device) -> str:
    """A DNS-subdomain name, the same for the same episode and device (so a retry finds its rule)."""
    key = f"{episode_id}|{device.driver}/{device.pool}/{device.name}"
    return "gpulens-" + hashlib.sha256(key.encode()).hexdigest()[:24]


def rule(name: str, device: Device, effect: Effect, value: str, node: str, episode_id: str) -> dict[str, Any]:
    return {
        "apiVersion": "",  # set by DeviceTaints.create to the served version
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/part-of": "gpulens", LABEL_NODE: node},
            "annotations": {ANNOTATION_EPISODE: episode_id},
        },
        "spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.name},
            "taint": {"key": TAINT_KEY, "value": value, "effect": effect.value},
        },
    }


def _attribute(device: dict[str, Any], name: str) -> str:
    """A string attribute of a slice device: `{"uuid": {"string": "GPU-..."}}` (v1, v1beta2) or
    under `basic.attributes` (v1beta1); the NVIDIA driver also names it `gpu.nvidia.com/uuid`."""
    attributes = device.get("attributes")
    if not isinstance(attributes, dict):
        basic = device.get("basic")
        attributes = basic.get("attributes") if isinstance(basic, dict) else None
    if not isinstance(attributes, dict):
        return ""
    for key, value in attributes.items():
        named = key == name or str(key).endswith("/" + name)
        string = value.get("string") if isinstance(value, dict) else None
        if named and isinstance(string, str):
            return string
    return ""


@dataclass
class DeviceTaints:
    client: KubernetesClient
    mode: DraMode = DraMode.AUTO

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: str | None = None  # the served version of devicetaintrules, once known
        self._slices: str | None = None
        self._known = False

    # ---- discovery -------------------------------------------------------------------------------

    def served(self, deadline: Deadline) -> bool:
        """Whether GPUs can be fenced here: `on`, or `auto` and the API serves both DeviceTaintRules
        and ResourceSlices. An unreadable API is not remembered (asked again next time)."""
        if self.mode is DraMode.OFF:
            return False
        with self._lock:
            if self._known:
                return self._rules is not None and self._slices is not None
        try:
            rules, slices = self._discover(deadline)
        except KubernetesError as exc:
            if self.mode is DraMode.ON:
                raise DraError(str(exc)) from None
            log.warning("DRA device taints: the API cannot be read now (%s): fencing the node", exc)
            return False
        if self.mode is DraMode.ON:
            rules, slices = rules or VERSIONS[1], slices or VERSIONS[0]
        with self._lock:
            self._rules, self._slices, self._known = rules, slices, True
        if rules and slices:
            log.info("DRA device taints served (%s/%s): faulty GPUs are fenced one by one", GROUP, rules)
        return rules is not None and slices is not None

    def _discover(self, deadline: Deadline) -> tuple[str | None, str | None]:
        status, group = self.client.request("GET", f"/apis/{GROUP}", deadline=deadline)
        if status == 404:
            return None, None
        if status != 200:
            raise KubernetesError(f"GET /apis/{GROUP}: HTTP {status} {group.get('message', '')}")
        offered = {v.get("version") for v in group.get("versions") or [] if isinstance(v, dict)}
        rules = slices = None
        for version in (v for v in VERSIONS if v in offered):
            status, listing = self.client.request("GET", f"/apis/{GROUP}/{version}", deadline=deadline)
            if status != 200:
                continue
            names = {r.get("name") for r in listing.get("resources") or [] if isinstance(r, dict)}
            if rules is None and "devicetaintrules" in names:
                rules = version
            if slices is None and "resourceslices" in names:
                slices = version
        return rules, slices

    # ---- devices ---------------------------------------------------------------------------------

    def devices(self, node: str, uuid: str, deadline: Deadline) -> NodeDevices:
        """The node's devices for GPU (or MIG device) `uuid`: the device itself, or every MIG device
        of that GPU; and how many other GPUs the node publishes. DraError when they cannot be listed."""
        found: list[Device] = []
        for item in self._slice_items(node, deadline):
            spec = item.get("spec") or {}
            driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
            for raw in spec.get("devices") or []:
                if isinstance(raw, dict) and isinstance(raw.get("name"), str):
                    device_uuid = _attribute(raw, "uuid")
                    parent = _attribute(raw, "parentUUID")
                    if device_uuid:
                        found.append(Device(str(driver), str(pool), raw["name"], device_uuid, parent))
            if len(found) > MAX_DEVICES:
                raise DraError(f"ResourceSlices of node {node}: more than {MAX_DEVICES} devices")
        faulty = tuple(d for d in found if uuid in (d.uuid, d.parent_uuid))
        gpus = {d.gpu_uuid for d in found if d.gpu_uuid.startswith("GPU-")}
        faulty_gpus = {d.gpu_uuid for d in faulty}
        return NodeDevices(faulty, len(gpus - faulty_gpus))

    def _slice_items(self, node: str, deadline: Deadline) -> Any:
        path = f"/apis/{GROUP}/{self._slices or VERSIONS[0]}/resourceslices"
        token = ""
        for _page in range(MAX_LIST_PAGES):
            query = {"limit": LIST_PAGE, "fieldSelector": f"spec.nodeName={node}"}
            if token:
                query["continue"] = token
            try:
                status, answer = self.client.request(
                    "GET",
                    f"{path}?{urllib.parse.urlencode(query)}",
                    deadline=deadline,
                    max_bytes=MAX_PAGE_ANSWER,
                )
            except KubernetesError as exc:
                raise DraError(str(exc)) from None
            if status != 200:
                raise DraError(
                    f"list ResourceSlices of node {node}: HTTP {status} {answer.get('message', '')}"
                )
            yield from (i for i in answer.get("items") or [] if isinstance(i, dict))
            token = str((answer.get("metadata") or {}).get("continue") or "")
            if not token:
                return
        raise DraError(f"list ResourceSlices of node {node}: more than {MAX_LIST_PAGES} pages")

    # ---- rules -----------------------------------------------------------------------------------

    def _path(self, name: str = "") -> str:
        base = f"/apis/{GROUP}/{self._rules or VERSIONS[1]}/devicetaintrules"
        return f"{base}/{urllib.parse.quote(name)}" if name else base

    def create(self, body: dict[str, Any], deadline: Deadline) -> bool:
        """Create the rule; True when created now, False when it was there already (an earlier try)."""
        body = {**body, "apiVersion": f"{GROUP}/{self._rules or VERSIONS[1]}"}
        name = body["metadata"]["name"]
        try:
            status, answer = self.client.request("POST", self._path(), body, deadline=deadline)
        except KubernetesError as exc:
            raise DraError(str(exc)) from None
        if status == 409:
            return False
        if status not in (200, 201):
            raise DraError(f"create DeviceTaintRule {name}: HTTP {status} {answer.get('message', '')}")
        return True

    def exists(self, name: str, deadline: Deadline) -> bool:
        """Whether the rule is there now (a person deleting it returns the GPU); DraError if unknown."""
        try:
            status, answer = self.client.request("GET", self._path(name), deadline=deadline)
        except KubernetesError as exc:
            raise DraError(str(exc)) from None
        if status == 404:
            return False
        if status != 200 or (answer.get("metadata") or {}).get("name") != name:
            raise DraError(f"GET DeviceTaintRule {name}: HTTP {status} {answer.get('message', '')}")
        return True

    def delete(self, name: str, deadline: Deadline) -> bool:
        """Delete the rule; True when deleted now, False when it was gone already."""
        try:
            status, answer = self.client.request("DELETE", self._path(name), deadline=deadline)
        except KubernetesError as exc:
            raise DraError(str(exc)) from None
        if status == 404:
            return False
        if status not in (200, 202):
            raise DraError(f"delete DeviceTaintRule {name}: HTTP {status} {answer.get('message', '')}")
        return True

    def describe(self, name: str = "") -> str:
        return f"{self.client.api_url.rstrip('/')}{self._path(name)}"
