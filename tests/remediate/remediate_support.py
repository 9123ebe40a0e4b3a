"""Stand-ins for the remediation tests: a Kubernetes API server over real HTTP, a fake scontrol,
an in-process receiver and a small webhook client."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpulens.remediate.auth import Authenticator
from gpulens.remediate.breaker import CircuitBreaker
from gpulens.remediate.recovery import Backend
from gpulens.remediate.server import RemediateServer
from gpulens.remediate.service import MAX_HISTORY, Remediator

TOKEN = "s3cret-token"
WAIT_S = 60.0  # a guard against a hang, never a measure of speed


FAKE_SCONTROL = Path(__file__).with_name("fake_scontrol.py")
START = 1_796_000_000.0  # the test clock's first reading (2026-12-01)


class Clock:
    """A clock the test moves by hand (`clock.now += ...`): the receiver's time, never the wall's."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write_fake_scontrol(
    tmp_path: Path,
    exit_code: int = 0,
    state: str = "MIXED",
    reason: str = "",
    **options: object,
) -> tuple[Path, Path]:
    """A `scontrol`, an `squeue` and an `sbatch` (tests/remediate/fake_scontrol.py) in a fresh bin
    dir; returns (bin dir, record file).

    Any node name exists in `state` (with `reason`) unless `any_node=False` and `nodes={...}`;
    `update` exits with `exit_code`. More `options` go to the state file (`sets`, `delay_s`,
    `stateful`, `reboot`, `jobs`, `no_requeue`, `hold_jobs`, `user`, `hang`): see fake_scontrol.py.
    The state file is `tmp_path/scontrol-state.json`.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "scontrol-calls.jsonl"
    default = {"State": state, **({"Reason": reason} if reason else {})}
    config = {"record": str(record), "update_exit": exit_code, "default": default, **options}
    state_file = tmp_path / "scontrol-state.json"
    state_file.write_text(json.dumps(config))
    command = shlex.join([sys.executable, str(FAKE_SCONTROL), str(state_file)])
    for name, first in (("scontrol", ""), ("squeue", " --squeue"), ("sbatch", " --sbatch")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec {command}{first} "$@"\n')
        script.chmod(0o755)
    return bin_dir, record


def scontrol_state(tmp_path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((tmp_path / "scontrol-state.json").read_text())
    return doc


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
    """Serves nodes (one, or all in pages), pods, ConfigMaps and Jobs like the API server does, and
    records every request; with `dra` also DRA's ResourceSlices and DeviceTaintRules.

    `hold` makes reads of a node wait until its event is set (a slow API for that node only);
    `held` is set when such a read arrived. `redirect` answers every request with a 302 to that
    URL. A created Job completes at once (`job_outcome`: "succeeded" or "failed") the way the
    node's kubelet would report it, and a reboot Job (label gpulens.io/action=reboot_node) gives
    its node a new `status.nodeInfo.bootID`, as a real reboot does. A diagnostic Job
    (gpulens.io/action=diagnose) runs through `kubelet` (the Job -> its container's exit status and
    termination message; default: `run_diagnostic` on the host, which has no dcgmi and no GPU), and
    its pod, labelled job-name, is listed under /api/v1/namespaces/NS/pods with that message.
    """

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    pdb_blocked: set[str] = field(default_factory=set)  # pod names whose eviction answers 429
    conflicts: int = 0  # how many times another writer changes a node between GET and PATCH
    configmaps: dict[str, dict[str, Any]] = field(default_factory=dict)  # "namespace/name" -> object
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # "namespace/name" -> object
    job_outcome: str = "succeeded"
    kubelet: Any = None  # Callable[[dict], tuple[int, str]] for diagnostic Jobs
    job_pods: list[dict[str, Any]] = field(default_factory=list)
    hold: dict[str, threading.Event] = field(default_factory=dict)
    held: threading.Event = field(default_factory=threading.Event)
    redirect: str = ""
    # DRA: with `dra` the API serves resource.k8s.io (v1 ResourceSlices, v1beta2 DeviceTaintRules)
    dra: bool = False
    dra_unavailable: bool = False  # resource.k8s.io answers 503 (an aggregated API or etcd trouble)
    resource_slices: list[dict[str, Any]] = field(default_factory=list)
    device_taint_rules: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> object
    requests: list[KubeRequest] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, method: str) -> list[KubeRequest]:
        return [r for r in self.requests if r.method == method]

    def isolation_patches(self) -> list[KubeRequest]:
        """PATCHes that change a node's scheduling (cordon, taint), not only its episode annotations."""
        return [r for r in self.of("PATCH") if isinstance(r.body, dict) and "spec" in r.body]

    def schedulable_devices(self, node: str) -> list[str]:
        """The DRA devices of `node` a new claim can get, as the scheduler decides: none on a cordoned
        or NoSchedule-tainted node, else every published device no DeviceTaintRule selects."""
        spec = self.nodes[node].get("spec", {})
        tainted = any(t.get("effect") in ("NoSchedule", "NoExecute") for t in spec.get("taints") or [])
        if spec.get("unschedulable") or tainted:
            return []
        names = []
        for item in self.resource_slices:
            slice_spec = item["spec"]
            if slice_spec.get("nodeName") != node:
                continue
            for device in slice_spec["devices"]:
                selected = (slice_spec["driver"], slice_spec["pool"]["name"], device["name"])
                rules = [r["spec"]["deviceSelector"] for r in self.device_taint_rules.values()]
                if not any((r.get("driver"), r.get("pool"), r.get("device")) == selected for r in rules):
                    names.append(device["name"])
        return names

    def episode_records(self, node: str) -> dict[str, dict[str, Any]]:
        """The episodes kept on `node` (annotations episodes.gpulens.io/...), by annotation key."""
        annotations = self.nodes[node].get("metadata", {}).get("annotations") or {}
        return {k: json.loads(v) for k, v in annotations.items() if k.startswith("episodes.gpulens.io/")}


DRA_DRIVER = "gpu.nvidia.com"


def gpu_slice(node: str, uuids: list[str], mig: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """A ResourceSlice as NVIDIA's DRA driver publishes a node's GPUs (resource.k8s.io/v1): one
    device `gpu-<i>` per GPU with its `uuid` attribute, and `gpu-<i>-mig-<j>` per MIG device of the
    GPUs named in `mig` (uuid -> MIG uuids) with their `parentUUID`."""
    devices = []
    for index, uuid in enumerate(uuids):
        devices.append({"name": f"gpu-{index}", "attributes": {"uuid": {"string": uuid}}})
        for j, mig_uuid in enumerate((mig or {}).get(uuid, [])):
            attributes = {"uuid": {"string": mig_uuid}, "parentUUID": {"string": uuid}}
            devices.append({"name": f"gpu-{index}-mig-{j}", "attributes": attributes})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRA_DRIVER}-x1"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """JSON merge patch (RFC 7386)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = json.loads(json.dumps(value))
    return target


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

        def _redirected(self) -> bool:
            if not state.redirect:
                return False
            self.send_response(302)
            self.send_header("Location", state.redirect + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True

        def _dra(self, method: str, url: urllib.parse.ParseResult, body: object) -> bool:
            """resource.k8s.io when `dra`: discovery, ResourceSlices (list) and DeviceTaintRules
            (create, get, list, delete); True when it answered."""
            if not state.dra or not url.path.startswith("/apis/resource.k8s.io"):
                return False
            if state.dra_unavailable:
                self._reply(
                    503, {"kind": "Status", "message": "the server is currently unable to handle the request"}
                )
                return True
            parts = url.path.strip("/").split("/")[2:]  # after apis/resource.k8s.io
            resources = {"v1": ["resourceslices", "resourceclaims"], "v1beta2": ["devicetaintrules"]}
            if method == "GET" and not parts:
                versions = [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in resources]
                self._reply(200, {"kind": "APIGroup", "name": "resource.k8s.io", "versions": versions})
            elif method == "GET" and len(parts) == 1 and parts[0] in resources:
                listing = [{"name": r, "namespaced": False} for r in resources[parts[0]]]
                self._reply(200, {"kind": "APIResourceList", "resources": listing})
            elif method == "GET" and parts == ["v1", "resourceslices"]:
                query = urllib.parse.parse_qs(url.query)
                node = query.get("fieldSelector", [""])[0].removeprefix("spec.nodeName=")
                items = [i for i in state.resource_slices if i["spec"].get("nodeName") == node]
                self._reply(200, {"kind": "ResourceSliceList", "metadata": {}, "items": items})
            elif parts[:2] == ["v1beta2", "devicetaintrules"]:
                self._device_taint_rules(method, parts[2:], body)
            else:
                self._reply(404, {"kind": "Status", "message": f"{url.path} not found"})
            return True

        def _device_taint_rules(self, method: str, rest: list[str], body: object) -> None:
            rules = state.device_taint_rules
            with state.lock:
                if method == "POST" and not rest and isinstance(body, dict):
                    name = body["metadata"]["name"]
                    if name in rules:
                        self._reply(
                            409, {"kind": "Status", "message": f'devicetaintrules "{name}" already exists'}
                        )
                        return
                    rules[name] = json.loads(json.dumps(body))
                    self._reply(201, rules[name])
                elif method == "GET" and not rest:
                    self._reply(200, {"kind": "DeviceTaintRuleList", "items": list(rules.values())})
                elif method in ("GET", "DELETE") and len(rest) == 1:
                    found = rules.get(rest[0]) if method == "GET" else rules.pop(rest[0], None)
                    if found is None:
                        self._reply(
                            404, {"kind": "Status", "message": f'devicetaintrules "{rest[0]}" not found'}
                        )
                    else:
                        self._reply(200, found)
                else:
                    self._reply(405, {"kind": "Status", "message": "method not allowed"})

        def do_DELETE(self) -> None:
            self._record()
            if not self._dra("DELETE", urllib.parse.urlparse(self.path), None):
                self._reply(404, {"message": "not found"})

        def do_GET(self) -> None:
            self._record()
            if self._redirected():
                return
            url = urllib.parse.urlparse(self.path)
            parts = url.path.strip("/").split("/")
            if self._dra("GET", url, None):
                return
            if url.path == "/api/v1/nodes":  # a list, in pages of `limit` with a `continue` token
                query = urllib.parse.parse_qs(url.query)
                limit = int(query.get("limit", ["0"])[0]) or len(state.nodes) or 1
                start = int(query.get("continue", ["0"])[0])
                with state.lock:
                    names = sorted(state.nodes)
                    items = [json.loads(json.dumps(state.nodes[n])) for n in names[start : start + limit]]
                more = str(start + limit) if start + limit < len(names) else ""
                self._reply(200, {"kind": "NodeList", "metadata": {"continue": more}, "items": items})
            elif url.path.startswith("/api/v1/nodes/"):
                name = url.path.rsplit("/", 1)[1]
                if name in state.hold:
                    state.held.set()
                    state.hold[name].wait(30)
                with state.lock:
                    if name not in state.nodes:
                        self._reply(404, {"kind": "Status", "message": f'nodes "{name}" not found'})
                        return
                    node = state.nodes[name]
                    seen = json.loads(json.dumps(node))  # what this read returns
                    if state.conflicts:  # someone else writes the node right after our read
                        # (before the reply goes out: the client could otherwise PATCH first)
                        state.conflicts -= 1
                        meta = node.setdefault("metadata", {})
                        meta["resourceVersion"] = str(int(meta.get("resourceVersion", "1")) + 1)
                self._reply(200, seen)
            elif url.path == "/api/v1/pods":  # pods of a node, in pages like the node list
                query = urllib.parse.parse_qs(url.query)
                on = query.get("fieldSelector", [""])[0].removeprefix("spec.nodeName=")
                everything = [p for p in state.pods if p["spec"]["nodeName"] == on]
                limit = int(query.get("limit", ["0"])[0]) or len(everything) or 1
                start = int(query.get("continue", ["0"])[0])
                more = str(start + limit) if start + limit < len(everything) else ""
                page = everything[start : start + limit]
                self._reply(200, {"kind": "PodList", "metadata": {"continue": more}, "items": page})
            elif len(parts) == 5 and parts[2] == "namespaces" and parts[4] == "pods":
                query = urllib.parse.parse_qs(url.query)
                wanted = query.get("labelSelector", [""])[0].removeprefix("job-name=")
                items = [
                    p
                    for p in state.job_pods
                    if p["metadata"]["namespace"] == parts[3]
                    and p["metadata"]["labels"]["job-name"] == wanted
                ]
                self._reply(200, {"kind": "PodList", "metadata": {}, "items": items})
            elif len(parts) >= 5 and parts[-4] == "namespaces" and parts[-2] in ("configmaps", "jobs"):
                store = state.configmaps if parts[-2] == "configmaps" else state.jobs
                obj = store.get(f"{parts[-3]}/{parts[-1]}")
                if obj is None:
                    self._reply(404, {"kind": "Status", "message": f'{parts[-2]} "{parts[-1]}" not found'})
                else:
                    self._reply(200, obj)
            else:
                self._reply(404, {"message": "not found"})

        def do_PATCH(self) -> None:
            body = self._record()
            if self._redirected():
                return
            assert isinstance(body, dict), f"a PATCH body is a JSON object, got {body!r}"
            parts = urllib.parse.urlparse(self.path).path.strip("/").split("/")
            if len(parts) == 6 and parts[4] == "configmaps":
                obj = state.configmaps.get(f"{parts[3]}/{parts[5]}")
                if obj is None:
                    self._reply(404, {"kind": "Status", "message": f'configmaps "{parts[5]}" not found'})
                else:
                    self._reply(200, _merge(obj, body))
                return
            name = parts[-1]
            with state.lock:
                node = state.nodes.get(name)
                if node is None:
                    self._reply(404, {"message": "not found"})
                    return
                meta = node.setdefault("metadata", {})
                wanted = body.get("metadata", {}).get("resourceVersion")
                if wanted and wanted != meta.get("resourceVersion", "1"):
                    self._reply(409, {"kind": "Status", "message": "the object has been modified"})
                    return
                patch = json.loads(json.dumps(body))
                patch.get("metadata", {}).pop("resourceVersion", None)
                _merge(node, patch)
                meta["resourceVersion"] = str(int(meta.get("resourceVersion", "1")) + 1)
                answer = json.loads(json.dumps(node))
            self._reply(200, answer)

        def do_POST(self) -> None:
            body = self._record()
            if self._redirected():
                return
            if self._dra("POST", urllib.parse.urlparse(self.path), body):
                return
            parts = urllib.parse.urlparse(self.path).path.strip("/").split("/")
            if parts[-1] in ("configmaps", "jobs") and isinstance(body, dict):
                namespace = parts[-2]
                name = body.get("metadata", {}).get("name") or f"job-{len(state.jobs)}"
                store = state.configmaps if parts[-1] == "configmaps" else state.jobs
                if f"{namespace}/{name}" in store:
                    self._reply(409, {"kind": "Status", "message": f'"{name}" already exists'})
                    return
                obj = json.loads(json.dumps(body))
                obj.setdefault("metadata", {}).update({"name": name, "namespace": namespace})
                if parts[-1] == "jobs":
                    self._run_job(obj)
                store[f"{namespace}/{name}"] = obj
                self._reply(201, obj)
                return
            name = parts[-2]
            self._reply(429 if name in state.pdb_blocked else 201, {"kind": "Status"})

        def _run_job(self, job: dict[str, Any]) -> None:
            """What the kubelet of the pinned node reports once the Job's pod ran."""
            labels = job.get("metadata", {}).get("labels", {})
            if labels.get("gpulens.io/action") == "diagnose":
                self._run_diagnostic(job)
                return
            succeeded = state.job_outcome == "succeeded"
            job["status"] = {"succeeded": 1} if succeeded else {"failed": 1}
            condition = "Complete" if succeeded else "Failed"
            job["status"]["conditions"] = [{"type": condition, "status": "True"}]
            labels = job.get("metadata", {}).get("labels", {})
            pod_spec = job.get("spec", {}).get("template", {}).get("spec", {})
            node = state.nodes.get(pod_spec.get("nodeName", ""))
            if succeeded and node is not None and labels.get("gpulens.io/action") == "reboot_node":
                with state.lock:
                    info = node.setdefault("status", {}).setdefault("nodeInfo", {})
                    info["bootID"] = f"boot-{len(state.jobs) + 2}"

        def _run_diagnostic(self, job: dict[str, Any]) -> None:
            exit_status, message = (state.kubelet or run_diagnostic())(job)
            job["status"] = {"succeeded": 1} if exit_status == 0 else {"failed": 1}
            condition = "Complete" if exit_status == 0 else "Failed"
            job["status"]["conditions"] = [{"type": condition, "status": "True"}]
            meta = job["metadata"]
            terminated = {"exitCode": exit_status, "message": message}
            state.job_pods.append(
                {
                    "metadata": {
                        "name": f"{meta['name']}-pod",
                        "namespace": meta["namespace"],
                        "labels": {"job-name": meta["name"]},
                    },
                    "status": {
                        "containerStatuses": [{"name": "diagnose", "state": {"terminated": terminated}}]
                    },
                }
            )

    return Handler


def run_diagnostic(bin_dir: Path | None = None, env: dict[str, str] | None = None) -> Any:
    """A kubelet for diagnostic Jobs: runs the Job's command (`gpulens remediate diag ...`) here,
    with `bin_dir` first on the PATH (where a test puts its `dcgmi`), and reports its exit status
    and its verdict line as the termination message."""

    def run(job: dict[str, Any]) -> tuple[int, str]:
        command = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[:3] == ["gpulens", "remediate", "diag"], command
        environment = {**os.environ, **(env or {})}
        if bin_dir is not None:
            environment["PATH"] = f"{bin_dir}{os.pathsep}{environment.get('PATH', '')}"
        done = subprocess.run(
            [sys.executable, "-m", "gpulens.cli", *command[1:]],
            capture_output=True,
            text=True,
            env=environment,
            timeout=120,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        return done.returncode, lines[-1] if lines else done.stderr.strip()[:200]

    return run


def sim_dcgmi(bin_dir: Path, scenario: Path) -> Path:
    """A `dcgmi` on `bin_dir` answering diagnostics from the simulated node of `scenario`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    dcgmi = bin_dir / "dcgmi"
    dcgmi.write_text(
        f"#!/bin/sh\nGPULENS_SIM_SCENARIO={shlex.quote(str(scenario))} "
        f'exec {shlex.quote(sys.executable)} -m gpulens.sim.dcgm.dcgmi "$@"\n'
    )
    dcgmi.chmod(0o755)
    return dcgmi


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
    isolator: Backend,
    dry_run: bool = True,
    max_nodes: int = 3,
    window_s: float = 3600,
    auth: Authenticator | None = None,
    breaker: CircuitBreaker | None = None,
    action_timeout_s: float = 30.0,
    **loop: Any,
) -> Iterator[tuple[str, Remediator]]:
    """The receiver in a thread on a free port, acting on what it queues; yields its base URL and
    the Remediator.

    `loop` goes to the Remediator (audit_log, policy, health, clock, queue); the reconciler's thread
    is not started: tests call `remediator.reconciler.tick()` for each pass. `POST /alerts` only
    queues: `deliver` waits for the actions."""
    remediator = Remediator(
        isolator,
        breaker or CircuitBreaker(max_nodes, window_s),
        dry_run=dry_run,
        action_timeout_s=action_timeout_s,
        **loop,
    )
    server = RemediateServer(("127.0.0.1", 0), remediator, auth or Authenticator(token=TOKEN))
    remediator.start()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", remediator
    finally:
        server.shutdown()
        server.server_close()
        remediator.stop()


def alert(
    alertname: str = "GPUXidFallenOffBus",
    instance: str = "n1:9842",
    gpu: str = "0",
    remediate: str | None = "isolate_node",
    status: str = "firing",
    fingerprint: str | None = None,
    starts_at: str = "2026-11-29T21:00:00Z",
    **labels: str,
) -> dict[str, Any]:
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


def notification(*alerts: dict[str, Any]) -> dict[str, Any]:
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


def state(base: str, authorization: str | None = f"Bearer {TOKEN}") -> dict[str, Any]:
    """The receiver's /-/state document (behind the receiver's credentials, like its writes)."""
    doc: dict[str, Any] = json.loads(get(f"{base}/-/state", authorization)[1])
    return doc


def wait_drained(
    base: str, timeout: float = WAIT_S, authorization: str | None = f"Bearer {TOKEN}"
) -> dict[str, Any]:
    """Wait until the receiver at `base` has acted on every notification it queued (its /-/state
    `queue.pending` is 0); returns that state. `timeout` only guards against a hang."""
    deadline = time.monotonic() + timeout
    while (doc := state(base, authorization))["queue"]["pending"]:
        if time.monotonic() > deadline:
            raise AssertionError(f"{doc['queue']['pending']} notification(s) still queued after {timeout:g}s")
        time.sleep(0.01)
    return doc


def wait_actions(base: str, node: str, timeout: float = WAIT_S) -> list[dict[str, Any]]:
    """Wait until the receiver at `base` has recorded an action on `node`; returns its actions there.
    For a notification posted while another is still being acted on (`deliver` waits for both)."""
    deadline = time.monotonic() + timeout
    while not (actions := [a for a in state(base)["actions"] if a["node"] == node]):
        if time.monotonic() > deadline:
            raise AssertionError(f"no action on node {node} after {timeout:g}s")
        time.sleep(0.01)
    return actions


def deliver(
    base: str, body: dict[str, Any], authorization: str | None = f"Bearer {TOKEN}"
) -> list[dict[str, Any]]:
    """POST a notification to the receiver at `base`, wait until it has been acted on and return the
    actions it recorded (as /-/state shows them): what `POST /alerts` itself answered before the
    queue. One notification at a time: the actions are told apart by their place in the history."""
    before = len(state(base, authorization)["actions"])
    status, answer = post(f"{base}/alerts", body, authorization)
    assert status == 200, (status, answer)
    assert json.loads(answer)["queued"] == len(body["alerts"]), answer
    actions = wait_drained(base, authorization=authorization)["actions"]
    assert len(actions) < MAX_HISTORY, "too many actions to tell this notification's apart"
    items: list[dict[str, Any]] = actions[before:]
    return items


def get(url: str, authorization: str | None = f"Bearer {TOKEN}") -> tuple[int, str]:
    """GET with the receiver's credentials by default (`/-/state` needs them; the open paths ignore them)."""
    headers = {"Authorization": authorization} if authorization else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read().decode()


def path_with(bin_dir: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
