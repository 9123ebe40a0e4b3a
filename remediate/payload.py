"""Parse and validate Alertmanager webhook bodies; every problem is one line for a 400 answer.

The caller is authenticated but its input is still bounded: nesting depth (checked before the
JSON parser recurses), the number of alerts and labels, and the length of every string the
receiver keeps (fingerprints and start times become idempotency keys held for thousands of
episodes). Alertmanager's own notifications are far inside every limit.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from gpulens.remediate.model import Alert

MAX_DEPTH = 16  # Alertmanager's payload is 4 deep (body, alerts, alert, labels)
MAX_ALERTS = 1000
MAX_LABELS = 64
MAX_LABEL_NAME = 128
MAX_LABEL_VALUE = 1024
MAX_ANNOTATION = 8192  # summaries and descriptions; read, never kept
MAX_FINGERPRINT = 64  # Alertmanager sends 16 hex digits
MAX_STARTS_AT = 64  # RFC 3339 with nanoseconds is 35 characters

_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


class PayloadError(ValueError):
    """The body is not a usable Alertmanager webhook notification."""


def _check_depth(body: bytes) -> None:
    """Refuse nesting deeper than MAX_DEPTH without recursing (json.loads would, into a RecursionError)."""
    brackets = _STRINGS.sub(b"", body).translate(None, _NOT_BRACKETS)
    depth = 0
    for byte in brackets:
        if byte in b"[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise PayloadError(f"body: nested deeper than {MAX_DEPTH} levels")
        else:
            depth -= 1


def _bounded(value: str, limit: int, where: str) -> str:
    if len(value) > limit:
        raise PayloadError(f"{where}: longer than {limit} characters ({len(value)})")
    return value


def _str_map(value: Any, where: str, value_limit: int = MAX_LABEL_VALUE) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise PayloadError(f"{where}: expected an object of string values")
    if len(value) > MAX_LABELS:
        raise PayloadError(f"{where}: more than {MAX_LABELS} entries ({len(value)})")
    for key, item in value.items():
        _bounded(key, MAX_LABEL_NAME, f"{where}: a name")
        _bounded(item, value_limit, f"{where}.{key[:MAX_LABEL_NAME]}")
    return dict(value)


def _fingerprint(labels: dict[str, str]) -> str:
    """Stand-in when a sender omits `fingerprint` (Alertmanager always sends one)."""
    canonical = json.dumps(sorted(labels.items())).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


def parse_webhook(body: bytes) -> list[Alert]:
    """The alerts of one notification, in order."""
    _check_depth(body)
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"body is not JSON: {exc.msg if hasattr(exc, 'msg') else exc}") from None
    except RecursionError:  # unreachable after _check_depth, kept so no input can crash the handler
        raise PayloadError(f"body: nested deeper than {MAX_DEPTH} levels") from None
    if not isinstance(doc, dict):
        raise PayloadError("body: expected a JSON object (Alertmanager webhook payload)")
    version = doc.get("version")
    if version is not None and version != "4":
        raise PayloadError(f'version: expected "4", got {str(version)[:20]!r}')
    raw_alerts = doc.get("alerts")
    if not isinstance(raw_alerts, list):
        raise PayloadError("alerts: expected a list")
    if len(raw_alerts) > MAX_ALERTS:
        raise PayloadError(f"alerts: more than {MAX_ALERTS} alerts in one notification ({len(raw_alerts)})")
    alerts = []
    for i, raw in enumerate(raw_alerts):
        where = f"alerts[{i}]"
        if not isinstance(raw, dict):
            raise PayloadError(f"{where}: expected an object")
        status = raw.get("status")
        if status not in ("firing", "resolved"):
            raise PayloadError(f'{where}.status: expected "firing" or "resolved", got {str(status)[:20]!r}')
        labels = _str_map(raw.get("labels"), f"{where}.labels")
        if not labels:
            raise PayloadError(f"{where}.labels: expected at least one label")
        annotations = _str_map(raw.get("annotations"), f"{where}.annotations", MAX_ANNOTATION)
        fingerprint = raw.get("fingerprint") or _fingerprint(labels)
        if not isinstance(fingerprint, str):
            raise PayloadError(f"{where}.fingerprint: expected a string")
        _bounded(fingerprint, MAX_FINGERPRINT, f"{where}.fingerprint")
        starts_at = raw.get("startsAt", "")
        if not isinstance(starts_at, str):
            raise PayloadError(f"{where}.startsAt: expected a string")
        _bounded(starts_at, MAX_STARTS_AT, f"{where}.startsAt")
        alerts.append(Alert(status, labels, annotations, fingerprint, starts_at))
    return alerts
