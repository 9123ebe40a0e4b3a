"""Keep the circuit breaker's state in a ConfigMap, so a receiver pod that is rescheduled, restarted
or OOM-killed comes back with its window and latch (RBAC: configmaps get, create, patch in its
namespace)."""

from __future__ import annotations

import logging
import urllib.parse
from dataclasses import dataclass

from gpulens.remediate.breaker import BreakerSnapshot, BreakerStoreError
from gpulens.remediate.kubernetes import KubernetesClient, KubernetesError

DATA_KEY = "breaker.json"
CORRUPT_KEY = "breaker.json.corrupt"
MAX_KEPT = 64 << 10  # of a corrupt state, what is kept for a person to read
log = logging.getLogger("gpulens.remediate")


@dataclass
class ConfigMapStore:
    client: KubernetesClient
    namespace: str
    name: str

    def describe(self) -> str:
        return f"configmap {self.namespace}/{self.name}"

    @property
    def _path(self) -> str:
        ns, name = urllib.parse.quote(self.namespace), urllib.parse.quote(self.name)
        return f"/api/v1/namespaces/{ns}/configmaps/{name}"

    def load(self) -> BreakerSnapshot | None:
        try:
            status, doc = self.client.request("GET", self._path)
        except KubernetesError as exc:
            raise BreakerStoreError(f"breaker state {self.describe()}: {exc}") from None
        if status == 404:
            return None
        if status != 200:
            raise BreakerStoreError(
                f"breaker state {self.describe()}: HTTP {status} {doc.get('message', '')}"
            )
        text = (doc.get("data") or {}).get(DATA_KEY)
        if not isinstance(text, str):
            return None
        try:
            return BreakerSnapshot.from_json(text, f"breaker state {self.describe()} key {DATA_KEY}")
        except BreakerStoreError as exc:  # corrupt: kept aside for a person, never fatal
            self._move_aside(text, str(exc))
            return None

    def _move_aside(self, text: str, problem: str) -> None:
        """Keep the corrupt text under `breaker.json.corrupt` and drop `breaker.json` (one merge patch)."""
        patch = {"data": {CORRUPT_KEY: text[:MAX_KEPT], DATA_KEY: None}}
        try:
            status, _ = self.client.request(
                "PATCH", self._path, patch, content_type="application/merge-patch+json"
            )
        except KubernetesError as exc:
            status, problem = 0, f"{problem} (not moved aside: {exc})"
        moved = f"moved to key {CORRUPT_KEY}" if status == 200 else "left in place"
        log.warning("%s; %s, starting with a closed breaker and an empty window", problem, moved)

    def save(self, snapshot: BreakerSnapshot) -> None:
        patch = {"data": {DATA_KEY: snapshot.to_json()}}
        try:
            status, doc = self.client.request(
                "PATCH", self._path, patch, content_type="application/merge-patch+json"
            )
            if status == 404:
                body = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    **patch,
                }
                ns = urllib.parse.quote(self.namespace)
                status, doc = self.client.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body)
        except KubernetesError as exc:
            raise BreakerStoreError(f"breaker state {self.describe()}: {exc}") from None
        if status not in (200, 201):
            raise BreakerStoreError(
                f"breaker state {self.describe()}: HTTP {status} {doc.get('message', '')}"
            )
