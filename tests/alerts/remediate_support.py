"""Stand-ins for the remediation tests: a Kubernetes API server over real HTTP, a fake scontrol,
an in-process receiver and a small webhook client."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpulens.remediate.auth import Authenticator
from gpulens.remediate.breaker import CircuitBreaker
from gpulens.remediate.isolator import Isolator
from gpulens.remediate.server import RemediateServer
from gpulens.remediate.service import Remediator

TOKEN = "s3cret-token"


def write_fake_scontrol(
    tmp_path: Path, exit_code: int = 0, state: str = "MIXED", reason: str = ""
) -> tuple[Path, Path]:
    """A `scontrol` in a fresh bin dir that appends its argv (JSON) to a record file.

    `show node` prints a one-line node record in `state` (with `reason`); `update` exits with
    `exit_code` and Slurm's message when it is not 0.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "scontrol-calls.jsonl"
    shown = f"NodeName={{node}} Arch=x86_64 CPUTot=128 State={state} Gres=gpu:h100:8 Partitions=gpu"
    if reason:
        shown += f" Reason={reason} [root@2026-11-29T20:00:00]"
    script = bin_dir / "scontrol"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"with open({str(record)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1:3] == ['show', 'node']:\n"
        f"    print({shown!r}.format(node=sys.argv[3]))\n"
        "    sys.exit(0)\n"
        f"if {exit_code}:\n"
        "    print('slurm_update error: Invalid node name specified', file=sys.stderr)\n"
        f"sys.exit({exit_code})\n"
    )
    script.chmod(0o755)
    return bin_dir, record


def scontrol_updates(record: Path) -> list[list[str]]:
    """The `scontrol update ...` calls only (the backend reads the node first)."""
    return [call for call in scontrol_calls(record) if call[:1] == ["update"]]


def scontrol_calls(record: Path) -> list[list[str]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


@dataclass
class KubeRequest:
    method: str
    path: str
    content_type: str
    authorization: str
    body: object


@dataclass
class KubeStandIn:
    """Serves nodes and pods like the API server does, and records every request."""

    nodes: dict[str, dict] = field(default_factory=dict)
    pods: list[dict] = field(default_factory=list)
    pdb_blocked: set[str] = field(default_factory=set)  # pod names whose eviction answers 429
    conflicts: int = 0  # how many times another writer changes a node between GET and PATCH
    requests: list[KubeRequest] = field(default_factory=list)
    url: str = ""

    def of(self, method: str) -> list[KubeRequest]:
        return [r for r in self.requests if r.method == method]


def _handler(state: KubeStandIn) -> type[BaseHTTPRequestHandler]:
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

        def _record(self) -> object:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            state.requests.append(
                KubeRequest(
                    self.command,
                    self.path,
                    self.headers.get("Content-Type", ""),
                    self.headers.get("Authorization", ""),
                    body,
                )
            )
            return body

        def do_GET(self) -> None:
            self._record()
            url = urllib.parse.urlparse(self.path)
            if url.path.startswith("/api/v1/nodes/"):
                name = url.path.rsplit("/", 1)[1]
                if name in state.nodes:
                    node = state.nodes[name]
                    seen = json.loads(json.dumps(node))  # what this read returns
                    if state.conflicts:  # someone else writes the node right after our read
                        # (before the reply goes out: the client could otherwise PATCH first)
                        state.conflicts -= 1
                        meta = node.setdefault("metadata", {})
                        meta["resourceVersion"] = str(int(meta.get("resourceVersion", "1")) + 1)
                    self._reply(200, seen)
                else:
                    self._reply(404, {"kind": "Status", "message": f'nodes "{name}" not found'})
            elif url.path == "/api/v1/pods":
                selector = urllib.parse.parse_qs(url.query).get("fieldSelector", [""])[0]
                node = selector.removeprefix("spec.nodeName=")
                items = [p for p in state.pods if p["spec"]["nodeName"] == node]
                self._reply(200, {"kind": "PodList", "items": items})
            else:
                self._reply(404, {"message": "not found"})

        def do_PATCH(self) -> None:
            body = self._record()
            name = self.path.rsplit("/", 1)[1]
            node = state.nodes.get(name)
            if node is None:
                self._reply(404, {"message": "not found"})
                return
            meta = node.setdefault("metadata", {})
            wanted = body.get("metadata", {}).get("resourceVersion")
            if wanted and wanted != meta.get("resourceVersion", "1"):
                self._reply(409, {"kind": "Status", "message": "the object has been modified"})
                return
            meta["resourceVersion"] = str(int(meta.get("resourceVersion", "1")) + 1)
            # JSON merge patch (RFC 7386) of metadata.annotations and spec
            annotations = meta.setdefault("annotations", {})
            annotations.update(body.get("metadata", {}).get("annotations", {}))
            node.setdefault("spec", {}).update(body.get("spec", {}))
            self._reply(200, node)

        def do_POST(self) -> None:
            self._record()
            name = self.path.split("/")[-2]
            self._reply(429 if name in state.pdb_blocked else 201, {"kind": "Status"})

    return Handler


@contextlib.contextmanager
def kube_api(state: KubeStandIn) -> Iterator[KubeStandIn]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def receiver(
    isolator: Isolator,
    dry_run: bool = True,
    max_nodes: int = 3,
    window_s: float = 3600,
    auth: Authenticator | None = None,
) -> Iterator[tuple[str, Remediator]]:
    """The receiver in a thread on a free port; yields its base URL and the Remediator."""
    remediator = Remediator(isolator, CircuitBreaker(max_nodes, window_s), dry_run=dry_run)
    server = RemediateServer(("127.0.0.1", 0), remediator, auth or Authenticator(token=TOKEN))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", remediator
    finally:
        server.shutdown()
        server.server_close()


def alert(
    alertname: str = "GPUXidFallenOffBus",
    instance: str = "n1:9842",
    gpu: str = "0",
    remediate: str | None = "isolate_node",
    status: str = "firing",
    fingerprint: str | None = None,
    starts_at: str = "2026-11-29T21:00:00Z",
    **labels: str,
) -> dict:
    all_labels = {
        "alertname": alertname,
        "instance": instance,
        "gpu": gpu,
        "uuid": f"GPU-{gpu}",
        "severity": "critical",
        **labels,
    }
    if remediate:
        all_labels["remediate"] = remediate
    return {
        "status": status,
        "labels": all_labels,
        "annotations": {"summary": "x."},
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": fingerprint or f"fp-{alertname}-{instance}-{gpu}",
    }


def notification(*alerts: dict) -> dict:
    return {
        "version": "4",
        "status": "firing",
        "receiver": "gpulens-remediate",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://am",
        "alerts": list(alerts),
    }


def post(
    url: str, body: object, authorization: str | None = f"Bearer {TOKEN}", raw: bytes | None = None
) -> tuple[int, str]:
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if authorization:
        headers["Authorization"] = authorization
    request = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def path_with(bin_dir: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
