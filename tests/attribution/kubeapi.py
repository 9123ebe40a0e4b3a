"""A stand-in Kubernetes API server for the exporter's one call: listing a node's ResourceSlices.

A real HTTP server on 127.0.0.1 answering `GET /apis/resource.k8s.io/<version>/resourceslices`
with the `spec.nodeName` field selector and `limit` / `continue` paging, as the API server does;
other versions answer 404 (a cluster that does not serve them).
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DRIVER = "gpu.nvidia.com"


def nvidia_slice(node: str, devices: dict[str, str], version: str = "v1") -> dict[str, Any]:
    """A ResourceSlice as NVIDIA's DRA driver publishes a node's GPUs and MIG devices: device name
    (`gpu-<minor>`, `gpu-<minor>-mig-...`) -> its `uuid` attribute; pool named after the node.
    `v1beta1` nests attributes under `basic`, as that version does."""

    def device(name: str, uuid: str) -> dict[str, Any]:
        attributes = {"uuid": {"string": uuid}, "productName": {"string": "NVIDIA A100-SXM4-80GB"}}
        return (
            {"name": name, "basic": {"attributes": attributes}}
            if version == "v1beta1"
            else {
                "name": name,
                "attributes": attributes,
            }
        )

    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-abc12"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [device(name, uuid) for name, uuid in devices.items()],
        },
    }


@dataclass
class KubeApiStandIn:
    """ResourceSlices served under `version`; `status` (not 200) answers every request with it."""

    slices: list[dict[str, Any]] = field(default_factory=list)
    version: str = "v1"
    status: int = 200
    page_size: int = 500  # the most items per page, whatever `limit` asks
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def lists(self) -> list[str]:
        with self.lock:
            return [r for r in self.requests if "/resourceslices" in r]


def _handler(state: KubeApiStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _reply(self, status: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            with state.lock:
                state.requests.append(self.path)
            url = urllib.parse.urlsplit(self.path)
            if state.status != 200:
                self._reply(state.status, {"kind": "Status", "message": "resourceslices is forbidden"})
                return
            if url.path != f"/apis/resource.k8s.io/{state.version}/resourceslices":
                self._reply(404, {"kind": "Status", "message": "the server could not find the resource"})
                return
            query = urllib.parse.parse_qs(url.query)
            node = query.get("fieldSelector", [""])[0].removeprefix("spec.nodeName=")
            items = [s for s in state.slices if s["spec"].get("nodeName") == node]
            start = int(query.get("continue", ["0"])[0])
            size = min(int(query.get("limit", ["500"])[0]), state.page_size)
            rest = str(start + size) if start + size < len(items) else ""
            self._reply(
                200,
                {
                    "kind": "ResourceSliceList",
                    "metadata": {"continue": rest} if rest else {},
                    "items": items[start : start + size],
                },
            )

    return Handler


@contextlib.contextmanager
def kube_api(state: KubeApiStandIn) -> Iterator[str]:
    """Serve `state` on 127.0.0.1; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
