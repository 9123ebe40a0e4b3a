"""Parse and validate Alertmanager webhook bodies; every problem is one line for a 400 answer."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gpulens.remediate.model import Alert


class PayloadError(ValueError):
    """The body is not a usable Alertmanager webhook notification."""


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise PayloadError(f"{where}: expected an object of string values")
    return dict(value)


def _fingerprint(labels: dict[str, str]) -> str:
    """Stand-in when a sender omits `fingerprint` (Alertmanager always sends one)."""
    canonical = json.dumps(sorted(labels.items())).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


def parse_webhook(body: bytes) -> list[Alert]:
    """The alerts of one notification, in order."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"body is not JSON: {exc.msg if hasattr(exc, 'msg') else exc}") from None
    if not isinstance(doc, dict):
        raise PayloadError("body: expected a JSON object (Alertmanager webhook payload)")
    version = doc.get("version")
    if version is not None and version != "4":
        raise PayloadError(f'version: expected "4", got {version!r}')
    raw_alerts = doc.get("alerts")
    if not isinstance(raw_alerts, list):
        raise PayloadError("alerts: expected a list")
    alerts = []
    for i, raw in enumerate(raw_alerts):
        where = f"alerts[{i}]"
        if not isinstance(raw, dict):
            raise PayloadError(f"{where}: expected an object")
        status = raw.get("status")
        if status not in ("firing", "resolved"):
            raise PayloadError(f'{where}.status: expected "firing" or "resolved", got {status!r}')
        labels = _str_map(raw.get("labels"), f"{where}.labels")
        if not labels:
            raise PayloadError(f"{where}.labels: expected at least one label")
        annotations = _str_map(raw.get("annotations"), f"{where}.annotations")
        fingerprint = raw.get("fingerprint") or _fingerprint(labels)
        if not isinstance(fingerprint, str):
            raise PayloadError(f"{where}.fingerprint: expected a string")
        starts_at = raw.get("startsAt", "")
        if not isinstance(starts_at, str):
            raise PayloadError(f"{where}.startsAt: expected a string")
        alerts.append(Alert(status, labels, annotations, fingerprint, starts_at))
    return alerts
