"""Device -> (namespace, pod, container) from the kubelet pod-resources v1 gRPC API.

The kubelet answers `List` on a unix socket with every pod's allocated devices. NVIDIA's device
plugin reports GPU UUIDs (`GPU-...`), MIG device UUIDs (`MIG-...`) and, with time-slicing or MPS
sharing, replica ids `<uuid>::<n>`; the replica suffix is stripped so all replicas of one device
map to it. Device names of the `nvidiaN` kind (device-name id type) are ignored: N is a minor
number, not the NVML index, and guessing would misattribute.

Devices allocated through Dynamic Resource Allocation come in `dynamic_resources` (per claim, the
(driver, pool, device) triplet and its CDI device names); dra.py finds the GPU or MIG UUID in those
names where a driver writes it there, else resourceslices.py looks it up in the node's
ResourceSlices. Either way the device then maps to its containers like a device-plugin one, and a
device several pods share through one ResourceClaim is shared like a time-sliced GPU.

An answer is another program's output, so reading it is bounded: gRPC refuses messages over
`MAX_MESSAGE_BYTES`, at most `MAX_ENTRIES` entries (pods, containers, device ids, claim devices,
CDI names) are read, names over `MAX_NAME` characters and entries missing a field are skipped, each
problem in one log line.

The sampler must never stall on the kubelet: a missing socket is a cheap `stat`, each call has a
short deadline, answers are cached for `refresh_s`, and after a failure the next try waits
`backoff_s` (doubling up to `max_backoff_s`). Problems are logged once, and again only after a
success in between.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulens.exporter.attribution.dra import DeviceUuids, DraDevice, uuid_in_names
from gpulens.exporter.attribution.logonce import LogOnce

_log = logging.getLogger(__name__)


MAX_MESSAGE_BYTES = 4 << 20  # gRPC's default, stated: ~110 pods answer in a few KiB
MAX_ENTRIES = 65_536
MAX_NAME = 512  # Kubernetes names are at most 253 characters, CDI device names similar


@dataclass(frozen=True)
class PodContainer:
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class Allocations:
    """One kubelet answer: device-plugin device keys and DRA devices -> the containers holding them."""

    devices: dict[str, frozenset[PodContainer]] = field(default_factory=dict)
    dra: dict[DraDevice, frozenset[PodContainer]] = field(default_factory=dict)
    truncated: bool = False  # more than MAX_ENTRIES entries: the rest were not read
    skipped: int = 0  # entries missing a field or with an over-long name
    example: str = ""  # one skipped entry, for the log line


def device_key(device_id: str) -> str | None:
    """`GPU-...`/`MIG-...` id with any `::<replica>` suffix removed; None for ids we cannot map."""
    base = device_id.split("::", 1)[0].strip()
    if base.startswith(("GPU-", "MIG-")):
        return base
    return None


class _Budget:
    """Counts entries read from one answer; `spend` is False once MAX_ENTRIES are used up."""

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.truncated = False

    def spend(self) -> bool:
        if self.left <= 0:
            self.truncated = True
            return False
        self.left -= 1
        return True


def _show(text: str, limit: int = 64) -> str:
    """A name from the answer as it may appear in a log line: short, control characters escaped."""
    return text[:limit].encode("unicode_escape").decode("ascii")


def _bad_name(*names: str) -> bool:
    return any(not name or len(name) > MAX_NAME for name in names)


def read_allocations(response: Any, max_entries: int = MAX_ENTRIES) -> Allocations:
    """Device-plugin and DRA allocations of a ListPodResourcesResponse, bounded (module docstring)."""
    budget = _Budget(max_entries)
    devices: dict[str, set[PodContainer]] = {}
    dra: dict[DraDevice, set[PodContainer]] = {}
    skipped, example = 0, ""
    for pod in response.pod_resources:
        if not budget.spend():
            break
        if _bad_name(pod.namespace, pod.name):
            skipped += 1
            example = (
                example or f"pod {_show(pod.namespace)!r}/{_show(pod.name)!r}: namespace and name expected"
            )
            continue
        for container in pod.containers:
            if not budget.spend():
                break
            holder = PodContainer(pod.namespace, pod.name, container.name[:MAX_NAME])
            for group in container.devices:
                if not budget.spend():
                    break
                for device_id in group.device_ids:
                    if not budget.spend():
                        break
                    key = device_key(device_id) if len(device_id) <= MAX_NAME else None
                    if key is not None:
                        devices.setdefault(key, set()).add(holder)
            for claim in container.dynamic_resources:
                if not budget.spend():
                    break
                for resource in claim.claim_resources:
                    if not budget.spend():
                        break
                    cdi: list[str] = []
                    for cdi_device in resource.cdi_devices:
                        if not budget.spend():
                            break
                        if not _bad_name(cdi_device.name):
                            cdi.append(cdi_device.name)
                    names = (resource.driver_name, resource.pool_name, resource.device_name)
                    if _bad_name(*names):
                        skipped += 1
                        example = example or (
                            f"pod {_show(pod.namespace)}/{_show(pod.name)} claim "
                            f"{_show(claim.claim_namespace)}/{_show(claim.claim_name)}: "
                            "driver, pool and device names expected"
                        )
                        continue
                    dra.setdefault(DraDevice(*names, tuple(cdi)), set()).add(holder)
    return Allocations(
        devices={key: frozenset(value) for key, value in devices.items()},
        dra={key: frozenset(value) for key, value in dra.items()},
        truncated=budget.truncated,
        skipped=skipped,
        example=example,
    )


def _ordered(containers: set[PodContainer] | frozenset[PodContainer]) -> tuple[PodContainer, ...]:
    return tuple(sorted(containers, key=lambda c: (c.namespace, c.pod, c.container)))


def devices_from_response(response: Any) -> dict[str, tuple[PodContainer, ...]]:
    """Map device-plugin device key -> containers it is allocated to (DRA devices: `resolve`)."""
    return {key: _ordered(value) for key, value in read_allocations(response).devices.items()}


def resolve(
    allocations: Allocations, uuids: DeviceUuids | None
) -> tuple[dict[str, tuple[PodContainer, ...]], list[DraDevice]]:
    """(device key -> containers, with DRA devices under their GPU / MIG UUID; DRA devices whose
    UUID is unknown, leaving out those the ResourceSlices list as no GPU). A UUID in the names
    wins; `uuids` (the ResourceSlices) is asked otherwise."""
    found: dict[str, set[PodContainer]] = {key: set(value) for key, value in allocations.devices.items()}
    unresolved: list[DraDevice] = []
    for device, holders in allocations.dra.items():
        uuid = uuid_in_names(device) or (uuids.uuid_of(device) if uuids is not None else None)
        if uuid:
            found.setdefault(uuid, set()).update(holders)
        elif uuid is None:
            unresolved.append(device)  # "" is a device of the node's slices that is no GPU
    return {key: _ordered(value) for key, value in found.items()}, unresolved


class PodResourcesClient:
    """Cached, deadline-bounded `List` calls against the kubelet socket."""

    def __init__(
        self,
        socket_path: Path,
        log: LogOnce,
        timeout_s: float = 0.5,
        refresh_s: float = 5.0,
        backoff_s: float = 30.0,
        max_backoff_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        uuids: DeviceUuids | None = None,
    ) -> None:
        self._socket_path = socket_path
        self._uuids = uuids  # DRA device -> UUID where the kubelet answer does not say it
        self._log = log
        self._timeout_s = timeout_s
        self._refresh_s = refresh_s
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._clock = clock
        self._devices: dict[str, tuple[PodContainer, ...]] = {}
        self._next_try = 0.0
        self._failures = 0
        self._channel: Any = None
        self._call: Any = None
        self._messages: Any = None
        self._unavailable = False

    def _ensure_stub(self) -> bool:
        if self._call is not None:
            return True
        if self._unavailable:
            return False
        try:  # deferred: grpcio and protobuf are the optional kubernetes extra
            import grpc

            from gpulens.exporter.attribution.podresources_pb import METHOD_LIST, build_messages
        except ImportError as exc:
            self._unavailable = True
            self._log.warning(
                "pod-resources-import",
                "attribution: kubelet pod-resources lookups disabled: %s (install grpcio and protobuf)",
                exc,
            )
            return False
        self._messages = build_messages()
        self._channel = grpc.insecure_channel(
            f"unix:{self._socket_path}",
            options=[("grpc.enable_http_proxy", 0), ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        self._call = self._channel.unary_unary(
            METHOD_LIST,
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=self._messages.ListPodResourcesResponse.FromString,
        )
        return True

    def _fail(self, now: float, key: str, message: str, *args: object) -> None:
        self._failures += 1
        delay = min(self._backoff_s * 2 ** (self._failures - 1), self._max_backoff_s)
        self._next_try = now + delay
        self._devices = {}
        self._log.warning(key, message, *args)

    def devices(self) -> dict[str, tuple[PodContainer, ...]]:
        """The latest device map (refreshed when stale; empty while the kubelet is unreachable)."""
        now = self._clock()
        if now < self._next_try:
            return self._devices
        try:
            mode = os.stat(self._socket_path).st_mode
        except OSError:
            self._fail(
                now,
                "pod-resources-missing",
                "attribution: kubelet pod-resources socket %s not found; pods are named from cgroups and "
                "kubelet log directories only (mount the socket, or disable pod-resources attribution)",
                self._socket_path,
            )
            return self._devices
        if not stat.S_ISSOCK(mode):
            self._fail(
                now, "pod-resources-not-socket", "attribution: %s is not a unix socket", self._socket_path
            )
            return self._devices
        if not self._ensure_stub():
            self._next_try = float("inf")
            return self._devices
        try:
            response = self._call(self._messages.ListPodResourcesRequest(), timeout=self._timeout_s)
        except Exception as exc:  # grpc.RpcError and channel errors: never let the kubelet break a sample
            code = getattr(exc, "code", None)
            detail = code().name if callable(code) else type(exc).__name__
            self._fail(
                now,
                "pod-resources-call",
                "attribution: kubelet pod-resources List on %s failed (%s, deadline %.1fs); retrying later",
                self._socket_path,
                detail,
                self._timeout_s,
            )
            return self._devices
        allocations = read_allocations(response)
        self._devices, unresolved = resolve(allocations, self._uuids)
        self._report(allocations, unresolved)
        if self._failures:
            _log.info("attribution: kubelet pod-resources on %s answers again", self._socket_path)
            self._log.forget_where(lambda key: isinstance(key, str) and key.startswith("pod-resources-"))
        self._failures = 0
        self._next_try = now + self._refresh_s
        return self._devices

    def _report(self, allocations: Allocations, unresolved: list[DraDevice]) -> None:
        """One line per kind of problem while it lasts (re-armed once an answer is clean again)."""
        self._problem(
            "pod-resources-truncated",
            allocations.truncated,
            "attribution: the kubelet pod-resources answer has more than %d entries; the rest are ignored",
            MAX_ENTRIES,
        )
        self._problem(
            "pod-resources-skipped",
            allocations.skipped > 0,
            "attribution: %d kubelet pod-resources entries skipped, e.g. %s",
            allocations.skipped,
            allocations.example,
        )
        self._problem(
            "pod-resources-dra-unresolved",
            bool(unresolved),
            "attribution: %d DRA devices have no GPU or MIG UUID in the kubelet answer%s, e.g. %s; "
            "their pods are not attributed from it (docs/attribution.md, DRA)",
            len(unresolved),
            "" if self._uuids is None else " nor in this node's ResourceSlices",
            _show(str(min(unresolved, key=str)), 3 * MAX_NAME) if unresolved else "",
        )

    def _problem(self, key: str, present: bool, message: str, *args: object) -> None:
        if present:
            self._log.warning(key, message, *args)
        else:
            self._log.forget(key)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._call = None
