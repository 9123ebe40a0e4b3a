"""Kubernetes backend: cordon + taint the node through the REST API, optionally drain it.

Isolation sets `spec.unschedulable`, adds the taint `gpulens.io/gpu-fault=<AlertName>:NoSchedule`
and annotates the node with the time, the reason and the alert fingerprint. Kubernetes has no
standard way to fence one GPU (the device plugin owns that), so `isolate_gpu` isolates the node
without evicting anything: workloads on the healthy GPUs finish. `isolate_node` additionally evicts
the node's pods through the Eviction API (PodDisruptionBudgets apply) when draining is enabled;
DaemonSet and mirror pods stay, as with `kubectl drain --ignore-daemonsets`.

The client speaks plain HTTPS with a bearer token (a service account's, by default) so no
Kubernetes client library is needed. RBAC: nodes get/patch, pods list, pods/eviction create.
"""

from __future__ import annotations

import json
import re
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens import httpclient
from gpulens.httpclient import Deadline
from gpulens.remediate.escape import printable
from gpulens.remediate.model import IsolationRequest, Outcome

TAINT_KEY = "gpulens.io/gpu-fault"
ANNOTATION_AT = "gpulens.io/isolated-at"
ANNOTATION_REASON = "gpulens.io/isolation-reason"
ANNOTATION_FINGERPRINT = "gpulens.io/alert-fingerprint"
CONFLICT_RETRIES = 3
MAX_ANSWER = 16 << 20  # a node object is tens of kilobytes; a pod list of a full node a few MiB
# RFC 1123 DNS subdomain: what the API accepts as a node name (lower case, no underscores)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class KubernetesError(Exception):
    """An API call failed; the message is one line."""


@dataclass
class KubernetesClient:
    """Bearer-token JSON client of the API server, through gpulens.httpclient: one total deadline
    per call, answers bounded in size, and no redirect to another origin (the token is only ever
    sent to `api_url`, and no answer from elsewhere is acted on)."""

    api_url: str
    token_file: Path | None = None
    ca_file: Path | None = None
    timeout_s: float = 10.0
    max_bytes: int = MAX_ANSWER

    def _context(self) -> ssl.SSLContext | None:
        if not self.api_url.startswith("https"):
            return None
        if self.ca_file:
            return ssl.create_default_context(cafile=str(self.ca_file))
        return ssl.create_default_context()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        deadline: Deadline | None = None,
    ) -> tuple[int, Any]:
        """(status, decoded JSON answer); for errors the answer is {"message": ...}."""
        headers = {"Accept": "application/json"}
        if self.token_file:
            # Read on every call: projected service-account tokens are rotated on disk.
            try:
                headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
            except OSError as exc:
                raise KubernetesError(f"--kube-token-file {self.token_file}: {exc.strerror or exc}") from None
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        call = Deadline(self.timeout_s)
        if deadline is not None and deadline.remaining() < call.remaining():
            call = deadline
        try:
            answer = httpclient.request(
                method,
                self.api_url.rstrip("/") + path,
                deadline=call,
                headers=headers,
                body=data,
                max_bytes=self.max_bytes,
                context=self._context(),
            )
        except (httpclient.HttpError, ssl.SSLError, OSError) as exc:
            raise KubernetesError(_without_base(str(exc), self.api_url, method, path)) from None
        if 200 <= answer.status < 300:
            try:
                doc = json.loads(answer.body) if answer.body else {}
            except (ValueError, RecursionError):
                raise KubernetesError(f"{method} {path}: HTTP {answer.status} answer is not JSON") from None
            if not isinstance(doc, dict):
                raise KubernetesError(f"{method} {path}: HTTP {answer.status} answer is not a JSON object")
            return answer.status, doc
        try:
            message = json.loads(answer.body).get("message", "")
        except (ValueError, AttributeError, RecursionError):
            message = answer.body.decode(errors="replace")[:200]
        return answer.status, {"message": printable(str(message), 200)}


def _without_base(message: str, base: str, method: str, path: str) -> str:
    """httpclient names the full URL; keep the messages short and stable: `GET /api/v1/...: reason`."""
    return message.replace(f"{method} {base.rstrip('/')}{path}", f"{method} {path}", 1)


def taint_value(alertname: str) -> str:
    """A valid taint value for the alert name: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9._-]", "_", alertname)[:63].strip("._-")
    return value or "unknown"


def _taint(request: IsolationRequest) -> dict[str, str]:
    # The time goes in an annotation, since the API keeps `timeAdded` for NoExecute taints only.
    return {"key": TAINT_KEY, "value": taint_value(request.alertname), "effect": "NoSchedule"}


def check_node_name(node: str) -> str | None:
    """Why the API could not name this node (None when it can): node names are DNS subdomains."""
    if len(node) > 253 or not _DNS_SUBDOMAIN.fullmatch(node):
        return f"node name {node!r} is not a Kubernetes node name (a lower-case DNS subdomain)"
    return None


@dataclass
class KubernetesIsolator:
    client: KubernetesClient
    drain: bool = False
    backend: str = "kubernetes"

    def _patch(self, request: IsolationRequest, now: float, taints: list[dict]) -> dict:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        return {
            "metadata": {
                "annotations": {
                    ANNOTATION_AT: stamp,
                    ANNOTATION_REASON: request.reason,
                    ANNOTATION_FINGERPRINT: request.fingerprint,
                }
            },
            "spec": {"unschedulable": True, "taints": taints},
        }

    def check_node(self, node: str) -> str | None:
        return check_node_name(node)

    def _drains(self, request: IsolationRequest) -> bool:
        return self.drain and request.kind == "isolate_node"

    def describe(self, request: IsolationRequest, now: float) -> str:
        patch = self._patch(request, now, [_taint(request)])
        text = (
            f"PATCH {self.client.api_url.rstrip('/')}/api/v1/nodes/{request.node} "
            f"(merge patch, existing taints kept) {json.dumps(patch, sort_keys=True)}"
        )
        if self._drains(request):
            text += f"; then evict every non-DaemonSet pod on {request.node} via the Eviction API"
        return text

    def isolate(self, request: IsolationRequest, now: float, deadline: Deadline) -> Outcome:
        try:
            for _ in range(CONFLICT_RETRIES):
                outcome = self._cordon_and_taint(request, now, deadline)
                if outcome is not None:
                    return outcome
            return Outcome(
                "failed", f"PATCH node {request.node}: still conflicting after {CONFLICT_RETRIES} tries"
            )
        except KubernetesError as exc:
            return Outcome("failed", str(exc))

    def _cordon_and_taint(self, request: IsolationRequest, now: float, deadline: Deadline) -> Outcome | None:
        """One read-modify-write of the node; None when another writer changed it in between."""
        path = f"/api/v1/nodes/{urllib.parse.quote(request.node)}"
        status, node = self.client.request("GET", path, deadline=deadline)
        if status != 200:
            return Outcome("failed", f"GET node {request.node}: HTTP {status} {node.get('message', '')}")
        spec = node.get("spec", {})
        taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
        ours = any(t.get("key") == TAINT_KEY for t in taints)
        if ours and spec.get("unschedulable"):
            detail = f"node {request.node} already cordoned and tainted {TAINT_KEY}"
            return Outcome("already", detail + self._drain(request, deadline))
        if not ours:
            taints.append(_taint(request))
        # A merge patch replaces the taints list as a whole, hence the list read above; the
        # resourceVersion makes the API refuse (409) if someone changed the node since.
        patch = self._patch(request, now, taints)
        version = node.get("metadata", {}).get("resourceVersion")
        if version:
            patch["metadata"]["resourceVersion"] = version
        status, answer = self.client.request(
            "PATCH", path, patch, content_type="application/merge-patch+json", deadline=deadline
        )
        if status == 409:
            return None
        if status != 200:
            return Outcome("failed", f"PATCH node {request.node}: HTTP {status} {answer.get('message', '')}")
        detail = f"cordoned node {request.node} and tainted {TAINT_KEY}={_taint(request)['value']}:NoSchedule"
        return Outcome("applied", detail + self._drain(request, deadline))

    def _drain(self, request: IsolationRequest, deadline: Deadline) -> str:
        if not self._drains(request):
            return ""
        selector = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={request.node}"})
        try:
            status, pods = self.client.request("GET", f"/api/v1/pods?{selector}", deadline=deadline)
        except KubernetesError as exc:
            return f"; drain failed: {exc}"
        if status != 200:
            return f"; drain failed: list pods HTTP {status}"
        evicted, blocked, failed = 0, 0, 0
        for pod in pods.get("items", []):
            meta = pod.get("metadata", {})
            if _stays(pod):
                continue
            namespace, name = meta.get("namespace", ""), meta.get("name", "")
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            }
            path = (
                f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods/{urllib.parse.quote(name)}/eviction"
            )
            try:
                code, _ = self.client.request("POST", path, body, deadline=deadline)
            except KubernetesError:
                failed += 1
                continue
            if code in (200, 201):
                evicted += 1
            elif code == 429:  # a PodDisruptionBudget does not allow it now
                blocked += 1
            elif code != 404:
                failed += 1
        return f"; drain: {evicted} evicted, {blocked} blocked by disruption budgets, {failed} failed"


def _stays(pod: dict) -> bool:
    """Pods a drain leaves alone: DaemonSet-managed, static (mirror) and finished ones."""
    meta = pod.get("metadata", {})
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
        return True
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return True
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
