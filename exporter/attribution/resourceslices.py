"""DRA device -> GPU / MIG UUID from this node's ResourceSlices (the Kubernetes API).

NVIDIA's DRA driver publishes every GPU and MIG device of a node as a device of a ResourceSlice
(`spec.nodeName` = the node, pool named after the node) with a `uuid` attribute, also spelled
`gpu.nvidia.com/uuid`. The kubelet's pod-resources answer names only (driver, pool, device), so
this is where the exporter learns which GPU `gpu-0` is. It is the exporter's only API-server call:
`GET /apis/resource.k8s.io/<version>/resourceslices?fieldSelector=spec.nodeName=<node>` (RBAC:
`list` on `resourceslices`), asked only when the kubelet reports a DRA device whose UUID is not
known yet, at most every `min_refresh_s`, and again every `max_age_s` (a MIG device re-created
under the same name has a new UUID).

Bounded like the kubelet client: one total deadline per refresh, each page at most
`MAX_PAGE_BYTES`, at most `MAX_PAGES` pages and `MAX_DEVICES` devices; problems are logged once
until a refresh succeeds. Versions: `v1` (1.34+), `v1beta2` (1.33), `v1beta1` (1.32, devices under
`basic`), the first the API serves is kept.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens import httpclient
from gpulens.exporter.attribution.dra import DraDevice, uuid_in_names
from gpulens.exporter.attribution.logonce import LogOnce

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
VERSIONS = ("v1", "v1beta2", "v1beta1")
PAGE_LIMIT = 500
MAX_PAGES = 64
MAX_PAGE_BYTES = 1 << 20
MAX_DEVICES = 4096  # one node's devices; more is not one node's GPUs
_LOG_PREFIX = "resourceslices-"


@dataclass(frozen=True)
class KubeApi:
    """Where the API server is and how to authenticate (the token is re-read on every call:
    projected service-account tokens are rotated on disk)."""

    url: str
    token_file: Path | None = None
    ca_file: Path | None = None

    def context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https"):
            return None
        return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)


def in_cluster_api(env: Mapping[str, str] = os.environ, account: Path = SERVICE_ACCOUNT) -> KubeApi | None:
    """The in-cluster API server when the pod runs with a service-account token, else None."""
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    token = account / "token"
    if not host or not token.is_file():
        return None
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    ca = account / "ca.crt"
    return KubeApi(
        url=f"https://{host}:{env.get('KUBERNETES_SERVICE_PORT', '443')}",
        token_file=token,
        ca_file=ca if ca.is_file() else None,
    )


class SliceError(Exception):
    """A listing failed; the message is one line."""


def _attributes(device: Mapping[str, Any]) -> Mapping[str, Any]:
    attributes = device.get("attributes")
    if not isinstance(attributes, dict):  # v1beta1 nests them under `basic`
        basic = device.get("basic")
        attributes = basic.get("attributes") if isinstance(basic, dict) else None
    return attributes if isinstance(attributes, dict) else {}


def device_uuids(item: Any) -> Iterator[tuple[tuple[str, str, str], str]]:
    """((driver, pool, device), uuid) for each device of one ResourceSlice: its `uuid` attribute
    when that is a GPU or MIG UUID, else "" (not a GPU: a NIC of another DRA driver); anything
    malformed is skipped (a slice is another program's output)."""
    spec = item.get("spec") if isinstance(item, dict) else None
    if not isinstance(spec, dict):
        return
    driver, pool, devices = spec.get("driver"), spec.get("pool"), spec.get("devices")
    pool_name = pool.get("name") if isinstance(pool, dict) else None
    if not isinstance(driver, str) or not isinstance(pool_name, str) or not isinstance(devices, list):
        return
    for device in devices:
        if not isinstance(device, dict) or not isinstance(device.get("name"), str):
            continue
        attributes = _attributes(device)
        value = attributes.get("uuid") or attributes.get(f"{driver}/uuid")
        text = value.get("string") if isinstance(value, dict) else None
        uuid = uuid_in_names(DraDevice(driver, pool_name, text)) if isinstance(text, str) else None
        yield (driver, pool_name, device["name"]), uuid if uuid is not None and uuid == text else ""


class ResourceSlices:
    """Cached (driver, pool, device) -> UUID of one node's ResourceSlices ("" for a listed device
    that is not a GPU: known, so not asked about again)."""

    def __init__(
        self,
        api: KubeApi,
        node: str,
        log: LogOnce,
        timeout_s: float = 1.0,
        min_refresh_s: float = 30.0,
        max_age_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._node = node
        self._log = log
        self._timeout_s = timeout_s
        self._min_refresh_s = min_refresh_s
        self._max_age_s = max_age_s
        self._clock = clock
        self._uuids: dict[tuple[str, str, str], str] = {}
        self._tried_at: float | None = None
        self._version: str | None = None
        self.refreshes = 0  # listings attempted (tests, debugging)

    def uuid_of(self, device: DraDevice) -> str | None:
        key = (device.driver, device.pool, device.device)
        now = self._clock()
        since = None if self._tried_at is None else now - self._tried_at
        if (
            since is None
            or since >= self._max_age_s
            or (key not in self._uuids and since >= self._min_refresh_s)
        ):
            self._refresh(now)
        return self._uuids.get(key)

    def _refresh(self, now: float) -> None:
        self._tried_at = now
        self.refreshes += 1
        deadline = httpclient.Deadline(self._timeout_s)  # wall time, whatever clock paces refreshes
        try:
            uuids = self._list(deadline)
        except SliceError as exc:  # the last good map stays: a UUID that left matches no device
            self._log.warning(
                f"{_LOG_PREFIX}list",
                "attribution: ResourceSlices of node %s not read: %s; DRA devices without a UUID in "
                "the kubelet answer stay unattributed until a later try",
                self._node,
                exc,
            )
            return
        self._uuids = uuids
        self._log.forget_where(lambda key: isinstance(key, str) and key.startswith(_LOG_PREFIX))

    def _list(self, deadline: httpclient.Deadline) -> dict[tuple[str, str, str], str]:
        versions = (self._version,) if self._version else VERSIONS
        for version in versions:
            found = self._list_version(version, deadline)
            if found is not None:
                self._version = version
                return found
        raise SliceError(f"the API serves no resource.k8s.io version of {', '.join(VERSIONS)}")

    def _list_version(
        self, version: str, deadline: httpclient.Deadline
    ) -> dict[tuple[str, str, str], str] | None:
        """The node's devices from `version`, or None when the API does not serve it (404)."""
        uuids: dict[tuple[str, str, str], str] = {}
        token = ""
        for _ in range(MAX_PAGES):
            query = {"fieldSelector": f"spec.nodeName={self._node}", "limit": str(PAGE_LIMIT)}
            if token:
                query["continue"] = token
            path = f"/apis/resource.k8s.io/{version}/resourceslices?{urllib.parse.urlencode(query)}"
            status, doc = self._get(path, deadline)
            if status == 404 and not uuids:
                return None
            if status != 200:
                message = doc.get("message") if isinstance(doc, dict) else None
                hint = " (the exporter needs list on resource.k8s.io resourceslices)" if status == 403 else ""
                text = str(message or "")[:200].encode("unicode_escape").decode("ascii")  # one line
                raise SliceError(f"GET {path}: HTTP {status} {text}{hint}".rstrip())
            items = doc.get("items")
            for item in items if isinstance(items, list) else ():
                for key, uuid in device_uuids(item):
                    if len(uuids) >= MAX_DEVICES:
                        raise SliceError(f"more than {MAX_DEVICES} devices on one node: not one node's GPUs")
                    uuids[key] = uuid
            metadata = doc.get("metadata")
            token = metadata.get("continue", "") if isinstance(metadata, dict) else ""
            if not isinstance(token, str) or not token:
                return uuids
        raise SliceError(f"more than {MAX_PAGES} pages of ResourceSlices")

    def _get(self, path: str, deadline: httpclient.Deadline) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        if self._api.token_file is not None:
            try:
                headers["Authorization"] = f"Bearer {self._api.token_file.read_text().strip()}"
            except OSError as exc:
                raise SliceError(f"token file {self._api.token_file}: {exc.strerror or exc}") from None
        try:
            answer = httpclient.request(
                "GET",
                self._api.url.rstrip("/") + path,
                deadline=deadline,
                headers=headers,
                max_bytes=MAX_PAGE_BYTES,
                context=self._api.context(),
            )
        except (httpclient.HttpError, ssl.SSLError, OSError) as exc:
            raise SliceError(str(exc).replace("\n", " ")[:300]) from None
        try:
            doc = json.loads(answer.body) if answer.body else {}
        except (ValueError, RecursionError):
            if answer.status == 200:
                raise SliceError(f"GET {path}: the answer is not JSON") from None
            doc = {}
        return answer.status, doc if isinstance(doc, dict) else {}
