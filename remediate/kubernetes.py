"""Kubernetes backend: cordon + taint the node through the REST API, optionally drain it.

Isolation sets `spec.unschedulable`, adds the taint `gpulens.io/gpu-fault=<AlertName>:NoSchedule`
and annotates the node with the time, the reason and the alert fingerprint. A device-plugin
cluster has no way to fence one GPU, so `isolate_gpu` isolates the node without evicting anything:
workloads on the healthy GPUs finish (fencing.py fences the GPU alone where DRA device taints are
served). `isolate_node` additionally evicts
the node's pods through the Eviction API (PodDisruptionBudgets apply) when draining is enabled;
DaemonSet and mirror pods stay, as with `kubectl drain --ignore-daemonsets`.

The client speaks plain HTTPS with a bearer token (a service account's, by default) so no
Kubernetes client library is needed. RBAC: nodes get/list/patch, pods list, pods/eviction create.

Every open episode is also kept on its node, one annotation each (`episodes.gpulens.io/<digest
of the episode id>`, the episode as JSON), removed when it closes; a receiver that restarts
without its audit log (an emptyDir lost with the pod) lists the nodes and resumes from them
(`recorded`). `gpulens.io/remediation` keeps the node's latest episode for people.
"""

from __future__ import annotations

import calendar
import contextlib
import hashlib
import json
import logging
import re
import shlex
import ssl
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens import __version__, httpclient
from gpulens.httpclient import Deadline
from gpulens.remediate.diagnose import DCGMI_TIMEOUT_S, Result, Verdict
from gpulens.remediate.episodes import Episode, Recovery
from gpulens.remediate.escape import printable
from gpulens.remediate.isolator import NodeFencesOnly
from gpulens.remediate.model import IsolationRequest, Outcome
from gpulens.remediate.recovery import Diagnosis, Progress, Recorded, Step

log = logging.getLogger("gpulens.remediate")
TAINT_KEY = "gpulens.io/gpu-fault"
ANNOTATION_AT = "gpulens.io/isolated-at"
ANNOTATION_REASON = "gpulens.io/isolation-reason"
ANNOTATION_FINGERPRINT = "gpulens.io/alert-fingerprint"
ANNOTATION_RETURNED = "gpulens.io/returned-at"
ANNOTATION_EPISODE = "gpulens.io/episode"  # on recovery Jobs: the episode they serve
ANNOTATION_EPISODE_RECORD = "gpulens.io/remediation"  # on the node: its latest episode, as JSON
EPISODE_ANNOTATION_PREFIX = "episodes.gpulens.io/"  # + digest: one open episode each, as JSON
MAX_RECORD_DETAIL = 512  # characters of an episode's detail kept on the node
# Lists come in pages (limit/continue) of at most MAX_PAGE_ANSWER bytes: decoded, a page takes up to
# ~50 times its size, and only one page is held at a time, so a node with hundreds of pods or a
# fleet of thousands of nodes stays within the receiver's memory limit
LIST_PAGE = 20  # objects per list call
MAX_PAGE_ANSWER = 1 << 20
MAX_LIST_PAGES = 5000
# nvidia-smi comes with the NVIDIA container toolkit's driver mount; any image with nsenter works for reboots
DEFAULT_JOB_IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
# the return diagnostic runs `gpulens remediate diag`: by default the receiver's own image, the one
# the chart and the kustomization deploy it with (gpulens-exporter:<appVersion>; they pass it as
# --diag-image); for DCGM's own diagnostic an image with both gpulens and dcgmi on the PATH
DEFAULT_DIAG_IMAGE = f"gpulens-exporter:{__version__}"
CONFLICT_RETRIES = 3
MAX_ANSWER = 4 << 20  # one object (a Job, an eviction): lists are paged under MAX_PAGE_ANSWER
# one node object is a few KiB (tens with many images or episode annotations); decoded, JSON takes
# up to ~50 times its size, so a 15 MB node took the receiver to 805 MiB against a 128 MiB limit
MAX_NODE_ANSWER = 1 << 20
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
        max_bytes: int | None = None,
    ) -> tuple[int, Any]:
        """(status, decoded JSON answer); for errors the answer is {"message": ...}.

        An answer over `max_bytes` (default the client's) is a KubernetesError, read no further."""
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
                max_bytes=self.max_bytes if max_bytes is None else max_bytes,
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
class KubernetesIsolator(NodeFencesOnly):
    client: KubernetesClient
    drain: bool = False
    backend: str = "kubernetes"
    job_namespace: str = "gpulens"
    job_image: str = DEFAULT_JOB_IMAGE
    diag_image: str = DEFAULT_DIAG_IMAGE

    def _patch(self, request: IsolationRequest, now: float, taints: list[dict[str, Any]]) -> dict[str, Any]:
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
        status, node = self.client.request("GET", path, deadline=deadline, max_bytes=MAX_NODE_ANSWER)
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

    def _pods_on(self, node: str, deadline: Deadline) -> Iterator[dict[str, Any]]:
        """The pods bound to `node`, a page at a time (KubernetesError when a page fails)."""
        return self._listed("/api/v1/pods", f"pods of node {node}", deadline, f"spec.nodeName={node}")

    def _listed(
        self, path: str, what: str, deadline: Deadline, field_selector: str = ""
    ) -> Iterator[dict[str, Any]]:
        token = ""
        for _page in range(MAX_LIST_PAGES):
            query = {"limit": LIST_PAGE, **({"fieldSelector": field_selector} if field_selector else {})}
            if token:
                query["continue"] = token
            status, answer = self.client.request(
                "GET", f"{path}?{urllib.parse.urlencode(query)}", deadline=deadline, max_bytes=MAX_PAGE_ANSWER
            )
            if status != 200:
                raise KubernetesError(f"list {what}: HTTP {status} {answer.get('message', '')}")
            yield from (item for item in answer.get("items") or [] if isinstance(item, dict))
            token = str((answer.get("metadata") or {}).get("continue") or "")
            if not token:
                return
        raise KubernetesError(f"list {what}: more than {MAX_LIST_PAGES} pages of {LIST_PAGE}")

    def _drain(self, request: IsolationRequest, deadline: Deadline) -> str:
        if not self._drains(request):
            return ""
        evicted, blocked, failed = 0, 0, 0
        try:
            pods = list(self._evictable(request.node, deadline))
        except KubernetesError as exc:
            return f"; drain failed: {exc}"
        for pod in pods:
            meta = pod.get("metadata", {})
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

    # ---- recovery and return (see recovery.Recoverer) ----------------------------------------------
    # The mechanism: a Job pinned to the node (spec.nodeName, so the cordon does not stop it;
    # tolerating every taint) that runs the action there. reset_gpu runs `nvidia-smi -r -i <uuid>`
    # in a privileged container the NVIDIA container toolkit equips (NVIDIA_VISIBLE_DEVICES=all);
    # nvidia-smi refuses while processes use the GPU, the Job fails and is retried later.
    # reboot_node starts once no evictable pod is left on the node and runs `systemctl reboot` in
    # the host's namespaces (hostPID, nsenter -t 1); it is done when the node reports a new
    # status.nodeInfo.bootID. RBAC: jobs create/get in the Job namespace.

    def job(self, episode: Episode) -> dict[str, Any]:
        action = "reset_gpu" if episode.recovery is Recovery.RESET_GPU else "reboot_node"
        digest = hashlib.sha256(f"{episode.id}#{episode.attempts}".encode()).hexdigest()[:8]
        node = re.sub(r"[^a-z0-9-]", "-", episode.node)[:36].strip("-")
        name = f"gpulens-{'reset' if action == 'reset_gpu' else 'reboot'}-{node}-{digest}"
        if action == "reset_gpu":
            command = ["nvidia-smi", "-r", "-i", episode.uuid or episode.gpu]
        else:
            command = ["nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "--", "systemctl", "reboot"]
        container: dict[str, Any] = {
            "name": action.replace("_", "-"),
            "image": self.job_image,
            "command": command,
            "securityContext": {"privileged": True},
        }
        if action == "reset_gpu":
            container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        pod: dict[str, Any] = {
            "nodeName": episode.node,
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [container],
        }
        if action == "reboot_node":
            pod["hostPID"] = True
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": self.job_namespace,
                "labels": {"app.kubernetes.io/part-of": "gpulens", "gpulens.io/action": action},
                "annotations": {ANNOTATION_EPISODE: episode.id},
            },
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": 600,
                "ttlSecondsAfterFinished": 86400,
                "template": {"metadata": {"labels": {"gpulens.io/action": action}}, "spec": pod},
            },
        }

    def describe_recovery(self, episode: Episode) -> str:
        job = self.job(episode)
        command = shlex.join(job["spec"]["template"]["spec"]["containers"][0]["command"])
        return (
            f"POST {self.client.api_url.rstrip('/')}{self._jobs_path()} "
            f"{job['metadata']['name']} on node {episode.node}: {command}"
        )

    def _jobs_path(self) -> str:
        return f"/apis/batch/v1/namespaces/{urllib.parse.quote(self.job_namespace)}/jobs"

    def _boot_id(self, node: str, deadline: Deadline) -> str:
        status, doc = self.client.request(
            "GET", f"/api/v1/nodes/{urllib.parse.quote(node)}", deadline=deadline, max_bytes=MAX_NODE_ANSWER
        )
        if status != 200:
            raise KubernetesError(f"GET node {node}: HTTP {status} {doc.get('message', '')}")
        info = (doc.get("status") or {}).get("nodeInfo") or {}
        return str(info.get("bootID", ""))

    def _evictable(self, node: str, deadline: Deadline) -> Iterator[dict[str, Any]]:
        """The pods of `node` a drain evicts: only their names are kept, never whole pages."""
        for pod in self._pods_on(node, deadline):
            if not _stays(pod):
                meta = pod.get("metadata") or {}
                yield {"metadata": {"namespace": meta.get("namespace", ""), "name": meta.get("name", "")}}

    def can_start(self, episode: Episode, deadline: Deadline) -> Progress:
        if episode.recovery is not Recovery.REBOOT_NODE:
            return Progress(Step.DONE)
        try:
            left = list(self._evictable(episode.node, deadline))
        except KubernetesError as exc:
            return Progress(Step.PENDING, str(exc))
        if left:
            return Progress(
                Step.PENDING, f"node {episode.node} still runs {len(left)} pod(s); reboot once drained"
            )
        return Progress(Step.DONE)

    def start_recovery(self, episode: Episode, deadline: Deadline) -> Progress:
        job = self.job(episode)
        try:
            boot = self._boot_id(episode.node, deadline) if episode.recovery is Recovery.REBOOT_NODE else ""
            status, answer = self.client.request("POST", self._jobs_path(), job, deadline=deadline)
        except KubernetesError as exc:
            return Progress(Step.FAILED, str(exc))
        if status not in (200, 201, 409):  # 409: created by an earlier attempt that lost its answer
            return Progress(
                Step.FAILED,
                f"create Job {job['metadata']['name']}: HTTP {status} {answer.get('message', '')}",
            )
        return Progress(
            Step.DONE,
            f"created Job {self.job_namespace}/{job['metadata']['name']}",
            f"{job['metadata']['name']}|{boot}",
        )

    def recovery_progress(self, episode: Episode, deadline: Deadline) -> Progress:
        name, _, boot = episode.marker.partition("|")
        try:
            if episode.recovery is Recovery.REBOOT_NODE:
                now_boot = self._boot_id(episode.node, deadline)
                if now_boot and now_boot != boot:
                    return Progress(Step.DONE, f"node {episode.node} rebooted (bootID {now_boot})")
            status, doc = self.client.request(
                "GET", f"{self._jobs_path()}/{urllib.parse.quote(name)}", deadline=deadline
            )
        except KubernetesError as exc:
            return Progress(Step.PENDING, str(exc))
        if status == 404:
            return Progress(Step.FAILED, f"Job {self.job_namespace}/{name} is gone")
        job_status = doc.get("status") or {}
        if job_status.get("failed"):
            return Progress(Step.FAILED, f"Job {self.job_namespace}/{name} failed")
        if job_status.get("succeeded") and episode.recovery is Recovery.RESET_GPU:
            return Progress(
                Step.DONE, f"Job {self.job_namespace}/{name} reset GPU {episode.uuid or episode.gpu}"
            )
        return Progress(Step.PENDING, f"Job {self.job_namespace}/{name} running")

    # ---- the return diagnostic (recovery.Recoverer) ------------------------------------------------
    # A Job pinned to the node like the recovery Jobs, unprivileged, running `gpulens remediate diag`
    # (diagnose.py) for the episode's GPU (every GPU for a node-level episode). Its verdict is the
    # container's termination message, read from the Job's pod (RBAC: pods list, as for drains).

    def diagnostic_unavailable(self, episode: Episode) -> str:
        return ""

    def diagnostic_job(self, episode: Episode, level: int) -> dict[str, Any]:
        digest = hashlib.sha256(f"{episode.id}#diag".encode()).hexdigest()[:8]
        node = re.sub(r"[^a-z0-9-]", "-", episode.node)[:36].strip("-")
        # the shape the admission policy admits, element by element: `--gpu` and `--uuid` only when known
        command = ["gpulens", "remediate", "diag", "--level", str(level)]
        if episode.gpu:
            command += ["--gpu", episode.gpu]
        if episode.uuid:
            command += ["--uuid", episode.uuid]
        container = {
            "name": "diagnose",
            "image": self.diag_image,
            "command": command,
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            # unprivileged (the policy requires it): NVML and dcgmi read the GPU as any CUDA pod does
            "securityContext": {
                "privileged": False,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }
        pod = {
            "nodeName": episode.node,
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,  # it calls no API: its verdict is its termination message
            "containers": [container],
        }
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"gpulens-diag-{node}-{digest}",
                "namespace": self.job_namespace,
                "labels": {"app.kubernetes.io/part-of": "gpulens", "gpulens.io/action": "diagnose"},
                "annotations": {ANNOTATION_EPISODE: episode.id},
            },
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": DCGMI_TIMEOUT_S[level] + 300,
                "ttlSecondsAfterFinished": 86400,
                "template": {"metadata": {"labels": {"gpulens.io/action": "diagnose"}}, "spec": pod},
            },
        }

    def describe_diagnostic(self, episode: Episode, level: int) -> str:
        job = self.diagnostic_job(episode, level)
        command = shlex.join(job["spec"]["template"]["spec"]["containers"][0]["command"])
        return (
            f"POST {self.client.api_url.rstrip('/')}{self._jobs_path()} "
            f"{job['metadata']['name']} on node {episode.node}: {command}"
        )

    def start_diagnostic(self, episode: Episode, level: int, deadline: Deadline) -> Progress:
        job = self.diagnostic_job(episode, level)
        name = job["metadata"]["name"]
        try:
            status, answer = self.client.request("POST", self._jobs_path(), job, deadline=deadline)
        except KubernetesError as exc:
            return Progress(Step.FAILED, str(exc))
        if status not in (200, 201, 409):  # 409: created by an earlier pass that lost its answer
            return Progress(Step.FAILED, f"create Job {name}: HTTP {status} {answer.get('message', '')}")
        return Progress(Step.DONE, f"created Job {self.job_namespace}/{name}", name)

    def diagnostic_progress(self, episode: Episode, deadline: Deadline) -> Diagnosis:
        name = episode.marker
        where = f"Job {self.job_namespace}/{name}"
        try:
            status, doc = self.client.request(
                "GET", f"{self._jobs_path()}/{urllib.parse.quote(name)}", deadline=deadline
            )
            if status == 404:
                return Diagnosis(Step.DONE, Verdict(Result.ERROR, "unknown", f"{where} is gone"))
            if status != 200:
                return Diagnosis(Step.PENDING, detail=f"GET {where}: HTTP {status} {doc.get('message', '')}")
            job_status = doc.get("status") or {}
            if not job_status.get("succeeded") and not job_status.get("failed"):
                return Diagnosis(Step.PENDING, detail=f"{where} running")
            verdict = self._verdict(name, deadline)
        except KubernetesError as exc:
            return Diagnosis(Step.PENDING, detail=str(exc))
        if job_status.get("succeeded"):
            return Diagnosis(Step.DONE, verdict or Verdict(Result.PASSED, "unknown", f"{where} succeeded"))
        if verdict is not None and verdict.result is not Result.PASSED:
            return Diagnosis(Step.DONE, verdict)
        reasons = [
            str(c.get("reason") or c.get("type"))
            for c in job_status.get("conditions") or []
            if isinstance(c, dict) and c.get("status") == "True"
        ]
        why = f"{where} failed ({', '.join(reasons) or 'no reason given'}) without a verdict"
        return Diagnosis(Step.DONE, Verdict(Result.ERROR, verdict.check if verdict else "unknown", why))

    def _verdict(self, job: str, deadline: Deadline) -> Verdict | None:
        """The verdict the Job's pod left as its termination message (None if there is none)."""
        query = urllib.parse.urlencode({"labelSelector": f"job-name={job}", "limit": 1})
        path = f"/api/v1/namespaces/{urllib.parse.quote(self.job_namespace)}/pods?{query}"
        status, answer = self.client.request("GET", path, deadline=deadline, max_bytes=MAX_PAGE_ANSWER)
        if status != 200:
            raise KubernetesError(f"list the pods of Job {job}: HTTP {status} {answer.get('message', '')}")
        for pod in answer.get("items") or []:
            for container in (
                ((pod.get("status") or {}).get("containerStatuses") or []) if isinstance(pod, dict) else []
            ):
                terminated = ((container or {}).get("state") or {}).get("terminated") or {}
                message = terminated.get("message")
                if isinstance(message, str):
                    return Verdict.from_message(message.strip())
        return None

    isolation_mark = f"the taint {TAINT_KEY} and the cordon (spec.unschedulable)"

    def isolation_in_place(self, node: str, deadline: Deadline) -> bool | None:
        """gpulens' isolation is its taint and the cordon: both are there after `isolate`, and a
        person who returns the node by hand removes them (docs/alerts.md). Either gone: not ours."""
        path = f"/api/v1/nodes/{urllib.parse.quote(node)}"
        try:
            status, doc = self.client.request("GET", path, deadline=deadline, max_bytes=MAX_NODE_ANSWER)
        except KubernetesError as exc:
            log.warning("node %s: its state cannot be read: %s", node, exc)
            return None
        if status != 200:
            message = doc.get("message", "")
            log.warning("node %s: its state cannot be read: GET HTTP %d %s", node, status, message)
            return None
        spec = doc.get("spec") or {}
        taints = (spec.get("taints") or []) if isinstance(spec, dict) else None
        if not isinstance(taints, list):
            log.warning("node %s: its state cannot be read: the answer is not a node's", node)
            return None
        ours = any(isinstance(t, dict) and t.get("key") == TAINT_KEY for t in taints)
        return ours and spec.get("unschedulable") is True

    def recovery_returns_node(self, episode: Episode) -> bool:
        return False  # the node stays cordoned and tainted until gpulens (or a person) returns it

    def describe_return(self, node: str) -> str:
        return (
            f"PATCH {self.client.api_url.rstrip('/')}/api/v1/nodes/{node}: remove taint {TAINT_KEY}, "
            "uncordon (when gpulens cordoned it), drop the gpulens isolation annotations"
        )

    def return_node(self, node: str, deadline: Deadline) -> Outcome:
        path = f"/api/v1/nodes/{urllib.parse.quote(node)}"
        try:
            for _ in range(CONFLICT_RETRIES):
                status, doc = self.client.request("GET", path, deadline=deadline, max_bytes=MAX_NODE_ANSWER)
                if status != 200:
                    return Outcome("failed", f"GET node {node}: HTTP {status} {doc.get('message', '')}")
                spec = doc.get("spec") or {}
                annotations = (doc.get("metadata") or {}).get("annotations") or {}
                taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
                ours = [t for t in taints if t.get("key") == TAINT_KEY]
                cordoned_by_us = ANNOTATION_AT in annotations
                if not ours and not cordoned_by_us:
                    return Outcome("already", f"node {node} carries no gpulens isolation")
                patch: dict[str, Any] = {
                    "metadata": {
                        "annotations": {
                            ANNOTATION_AT: None,
                            ANNOTATION_REASON: None,
                            ANNOTATION_FINGERPRINT: None,
                            ANNOTATION_RETURNED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        },
                    },
                    "spec": {"taints": [t for t in taints if t.get("key") != TAINT_KEY]},
                }
                if cordoned_by_us:
                    patch["spec"]["unschedulable"] = False
                version = (doc.get("metadata") or {}).get("resourceVersion")
                if version:
                    patch["metadata"]["resourceVersion"] = version
                status, answer = self.client.request(
                    "PATCH", path, patch, content_type="application/merge-patch+json", deadline=deadline
                )
                if status == 409:
                    continue
                if status != 200:
                    return Outcome("failed", f"PATCH node {node}: HTTP {status} {answer.get('message', '')}")
                return Outcome("applied", f"removed taint {TAINT_KEY} from node {node} and uncordoned it")
            return Outcome("failed", f"PATCH node {node}: still conflicting after {CONFLICT_RETRIES} tries")
        except KubernetesError as exc:
            return Outcome("failed", str(exc))

    def record(self, episode: Episode, deadline: Deadline) -> None:
        """The episode on its node (best effort): as gpulens.io/remediation, the latest for people,
        and while open under its own annotation, what a restart without the audit log resumes."""
        doc = {k: v for k, v in episode.to_dict().items() if v not in (None, "", 0) and k != "detail"}
        full = {**episode.to_dict(), "detail": episode.detail[:MAX_RECORD_DETAIL]}
        annotations: dict[str, str | None] = {
            ANNOTATION_EPISODE_RECORD: json.dumps(doc, sort_keys=True),
            episode_annotation(episode.id): json.dumps(full, sort_keys=True) if episode.state.open else None,
        }
        patch = {"metadata": {"annotations": annotations}}
        with contextlib.suppress(KubernetesError):
            self.client.request(
                "PATCH",
                f"/api/v1/nodes/{urllib.parse.quote(episode.node)}",
                patch,
                content_type="application/merge-patch+json",
                deadline=deadline,
            )

    def recorded(self, deadline: Deadline) -> Recorded:
        """The open episodes and return times kept on the nodes (every node, a page at a time)."""
        episodes: list[Episode] = []
        returned: dict[str, float] = {}
        skipped = 0
        for node in self._listed("/api/v1/nodes", "nodes", deadline):
            meta = node.get("metadata") or {}
            name, annotations = meta.get("name"), meta.get("annotations") or {}
            if not isinstance(name, str) or not isinstance(annotations, dict):
                continue
            at = _epoch(annotations.get(ANNOTATION_RETURNED))
            if at is not None:
                returned[name] = at
            for key, value in annotations.items():
                if not str(key).startswith(EPISODE_ANNOTATION_PREFIX):
                    continue
                episode = _episode(value, name)
                if episode is None:
                    skipped += 1
                else:
                    episodes.append(episode)
        return Recorded(episodes, returned, skipped)


def episode_annotation(episode_id: str) -> str:
    """The annotation key of one episode: the id is a fingerprint@time, too long for a key name."""
    return EPISODE_ANNOTATION_PREFIX + hashlib.sha256(episode_id.encode()).hexdigest()[:32]


def _episode(value: Any, node: str) -> Episode | None:
    """An episode annotation back as an Episode; None unless it is a whole, open one of `node`."""
    try:
        doc = json.loads(value) if isinstance(value, str) and len(value) <= 64 << 10 else None
        episode = Episode.from_dict(doc) if isinstance(doc, dict) else None
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if episode is None or episode.node != node or not episode.state.open:
        return None
    texts = (episode.id, episode.alertname, episode.kind, episode.gpu, episode.uuid, episode.instance)
    times: list[object] = [episode.detected_at, episode.isolated_at, episode.action_started_at]
    times += [episode.action_finished_at, episode.resolved_at, episode.healthy_since]
    times += [episode.recovered_at, episode.returned_at]
    if not all(
        isinstance(t, str)
        for t in (*texts, episode.marker, episode.detail, episode.fence, episode.diagnostic)
    ):
        return None
    if not all(t is None or (isinstance(t, int | float) and not isinstance(t, bool)) for t in times):
        return None
    if not isinstance(episode.attempts, int) or not isinstance(episode.kept_gpus, int):
        return None
    if episode.detected_at is None:
        return None
    return episode


def _epoch(text: Any) -> float | None:
    """`2026-12-01T10:00:00Z` (gpulens.io/returned-at) as epoch seconds."""
    if not isinstance(text, str):
        return None
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _stays(pod: dict[str, Any]) -> bool:
    """Pods a drain leaves alone: DaemonSet-managed, static (mirror) and finished ones."""
    meta = pod.get("metadata", {})
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
        return True
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return True
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
