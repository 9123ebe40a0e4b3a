"""Turn one alert into an isolation request: which node, which GPU, which kind.

The node is the alert's `node` label when present, else its `instance` label without the port
(`gpu-17:9842` -> `gpu-17`, `[fd00::1]:9842` -> `fd00::1`). Prometheus sets `instance` to the
scrape address, so relabel it to the node name (Kubernetes: `__meta_kubernetes_pod_node_name`), or
add a `node` label, when addresses are not node names.
"""

from __future__ import annotations

import re

from gpulens.remediate.episodes import Recovery
from gpulens.remediate.model import ISOLATION_KINDS, Alert, IsolationRequest

# Kubernetes node names are DNS subdomains; Slurm node names are simple host names. Anything else
# (spaces, quotes, slashes) is refused rather than passed to an API path or a command line.
_NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")


class PlanError(ValueError):
    """The alert asks for isolation but cannot be acted on."""


def node_name(labels: dict[str, str]) -> str:
    explicit = labels.get("node", "").strip()
    if explicit:
        name = explicit
    else:
        instance = labels.get("instance", "").strip()
        if instance.startswith("["):  # [ipv6]:port
            name = instance[1 : instance.find("]")] if "]" in instance else instance
        elif instance.count(":") == 1:
            name = instance.split(":", 1)[0]
        else:
            name = instance
    if not name:
        raise PlanError("no node: the alert has neither a node nor an instance label")
    if not _NODE_NAME.fullmatch(name):
        raise PlanError(f"node name {name!r} is not a valid host name")
    return name


def plan(alert: Alert) -> IsolationRequest | None:
    """The request of a firing alert labelled for remediation; None when it asks for nothing."""
    kind = alert.labels.get("remediate")
    if kind is None:
        return None
    if kind not in ISOLATION_KINDS:
        raise PlanError(f"remediate={kind!r}: expected one of {', '.join(ISOLATION_KINDS)}")
    try:
        recovery = Recovery.from_label(alert.labels.get("recovery", ""))
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    return IsolationRequest(
        kind=kind,
        node=node_name(alert.labels),
        alertname=alert.name,
        fingerprint=alert.fingerprint,
        episode=f"{alert.fingerprint}@{alert.starts_at}",
        gpu=alert.labels.get("gpu", ""),
        uuid=alert.labels.get("uuid", ""),
        recovery=recovery.value,
        instance=alert.labels.get("instance", ""),
    )


def node_of(alert: Alert) -> str:
    """The node an alert is about, "" when it names none it could act on (it asks for nothing or is
    refused on its labels alone): the dispatcher's lane for it, so one node's alerts keep their order."""
    try:
        request = plan(alert)
    except PlanError:
        return ""
    return request.node if request is not None else ""
