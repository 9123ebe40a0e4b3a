"""Device -> (namespace, pod, container) from the kubelet pod-resources v1 gRPC API.

The kubelet answers `List` on a unix socket with every pod's allocated devices. NVIDIA's device
plugin reports GPU UUIDs (`GPU-...`), MIG device UUIDs (`MIG-...`) and, with time-slicing or MPS
sharing, replica ids `<uuid>::<n>`; the replica suffix is stripped so all replicas of one device
map to it. Device names of the `nvidiaN` kind (device-name id type) are ignored: N is a minor
number, not the NVML index, and guessing would misattribute.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.exporter.attribution.logonce import LogOnce

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodContainer:
    namespace: str
    pod: str
    container: str


def device_key(device_id: str) -> str | None:
    """`GPU-...`/`MIG-...` id with any `::<replica>` suffix removed; None for ids we cannot map."""
    base = device_id.split("::", 1)[0].strip()
    if base.startswith(("GPU-", "MIG-")):
        return base
    return None


def devices_from_response(response: Any) -> dict[str, tuple[PodContainer, ...]]:
    """Map device key -> containers it is allocated to, from a ListPodResourcesResponse."""
    found: dict[str, set[PodContainer]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    key = device_key(device_id)
                    if key is not None:
                        found.setdefault(key, set()).add(
                            PodContainer(pod.namespace, pod.name, container.name)
                        )
    return {
        key: tuple(sorted(value, key=lambda c: (c.namespace, c.pod, c.container)))
        for key, value in found.items()
    }


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
    ) -> None:
        self._socket_path = socket_path
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
        try:
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
            f"unix:{self._socket_path}", options=[("grpc.enable_http_proxy", 0)]
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
        self._devices = devices_from_response(response)
        if self._failures:
            _log.info("attribution: kubelet pod-resources on %s answers again", self._socket_path)
            self._log.forget_where(lambda key: isinstance(key, str) and key.startswith("pod-resources-"))
        self._failures = 0
        self._next_try = now + self._refresh_s
        return self._devices

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._call = None
