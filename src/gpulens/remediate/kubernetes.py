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
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.remediate.model import IsolationRequest, Outcome

TAINT_KEY = "gpulens.io/gpu-fault"
ANNOTATION_AT = "gpulens.io/isolated-at"
ANNOTATION_REASON = "gpulens.io/isolation-reason"
ANNOTATION_FINGERPRINT = "gpulens.io/alert-fingerprint"
CONFLICT_RETRIES = 3


class KubernetesError(Exception):
    """An API call failed; the message is one line."""


@dataclass
class KubernetesClient:
    api_url: str
    token_file: Path | None = None
    ca_file: Path | None = None
    timeout_s: float = 10.0

    def _context(self) -> ssl.SSLContext | None:
        if not self.api_url.startswith("https"):
            return None
        if self.ca_file:
            return ssl.create_default_context(cafile=str(self.ca_file))
        return ssl.create_default_context()

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
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
        request = urllib.request.Request(
            self.api_url.rstrip("/") + path, data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._context()) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = json.loads(raw).get("message", "")
            except (ValueError, AttributeError):
                message = raw.decode(errors="replace")[:200]
            return exc.code, {"message": message}
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise KubernetesError(f"{method} {path}: {reason}") from None


def _taint(request: IsolationRequest) -> dict[str, str]:
    # Taint values are at most 63 characters of [A-Za-z0-9._-]: alert names fit. The time goes in
    # an annotation, since the API keeps `timeAdded` for NoExecute taints only.
    return {"key": TAINT_KEY, "value": request.alertname[:63] or "unknown", "effect": "NoSchedule"}


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

    def isolate(self, request: IsolationRequest, now: float) -> Outcome:
        try:
            for _ in range(CONFLICT_RETRIES):
                outcome = self._cordon_and_taint(request, now)
                if outcome is not None:
                    return outcome
            return Outcome(
                "failed", f"PATCH node {request.node}: still conflicting after {CONFLICT_RETRIES} tries"
            )
        except KubernetesError as exc:
            return Outcome("failed", str(exc))

    def _cordon_and_taint(self, request: IsolationRequest, now: float) -> Outcome | None:
        """One read-modify-write of the node; None when another writer changed it in between."""
        path = f"/api/v1/nodes/{urllib.parse.quote(request.node)}"
        status, node = self.client.request("GET", path)
        if status != 200:
            return Outcome("failed", f"GET node {request.node}: HTTP {status} {node.get('message', '')}")
        spec = node.get("spec", {})
        taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
        ours = any(t.get("key") == TAINT_KEY for t in taints)
        if ours and spec.get("unschedulable"):
            detail = f"node {request.node} already cordoned and tainted {TAINT_KEY}"
            return Outcome("already", detail + self._drain(request))
        if not ours:
            taints.append(_taint(request))
        # A merge patch replaces the taints list as a whole, hence the list read above; the
        # resourceVersion makes the API refuse (409) if someone changed the node since.
        patch = self._patch(request, now, taints)
        version = node.get("metadata", {}).get("resourceVersion")
        if version:
            patch["metadata"]["resourceVersion"] = version
        status, answer = self.client.request(
            "PATCH", path, patch, content_type="application/merge-patch+json"
        )
        if status == 409:
            return None
        if status != 200:
            return Outcome("failed", f"PATCH node {request.node}: HTTP {status} {answer.get('message', '')}")
        detail = f"cordoned node {request.node} and tainted {TAINT_KEY}={request.alertname}:NoSchedule"
        return Outcome("applied", detail + self._drain(request))

    def _drain(self, request: IsolationRequest) -> str:
        if not self._drains(request):
            return ""
        selector = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={request.node}"})
        status, pods = self.client.request("GET", f"/api/v1/pods?{selector}")
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
            code, _ = self.client.request("POST", path, body)
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
