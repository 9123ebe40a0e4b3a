"""Authenticated input is still bounded and escaped (issue 17, item 6): metric labels come from an
allow-list, control characters never reach the log raw, nesting, sizes and kept state are bounded."""

from __future__ import annotations

import json
import logging
import re

import pytest

from gpulens.remediate import service
from gpulens.remediate.kubernetes import KubernetesClient, KubernetesIsolator, taint_value
from gpulens.remediate.payload import MAX_DEPTH, PayloadError, parse_webhook
from gpulens.remediate.slurm import SlurmIsolator
from tests.remediate.remediate_support import (
    KubeStandIn,
    alert,
    deliver,
    get,
    kube_api,
    notification,
    post,
    receiver,
    scontrol_updates,
)


def test_a_caller_chosen_remediate_value_never_becomes_a_metric_label(scontrol):
    with receiver(SlurmIsolator()) as (base, _):
        for i in range(5):
            deliver(base, notification(alert(remediate=f"evil-{i}", fingerprint=f"f{i}")))
        metrics = get(f"{base}/metrics")[1]
    assert "evil" not in metrics
    assert 'gpulens_remediate_actions_total{kind="invalid",result="rejected"} 5.0' in metrics


def test_a_newline_in_an_alert_name_cannot_forge_a_log_line(scontrol, caplog):
    caplog.set_level(logging.INFO, logger="gpulens.remediate")
    forged = "GPULost\n2026-12-01 20:00:00 INFO gpulens.remediate: applied FAKE node=n9"
    with receiver(SlurmIsolator()) as (base, _):
        deliver(base, notification(alert(alertname=forged, instance="gpu-1:9842", fingerprint="f1")))
    logged = [
        r.getMessage() for r in caplog.records if r.name == "gpulens.remediate" and "gpu-1" in r.getMessage()
    ]
    assert logged and all("\n" not in line for line in logged)
    assert all("GPULost\\n2026-12-01" in line for line in logged)


def test_control_characters_never_reach_the_scontrol_reason(scontrol):
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        post(
            f"{base}/alerts",
            notification(alert(alertname="GPULost\r\n\x1b[2J", instance="gpu-1:9842", fingerprint="f1")),
        )
    ((*_, reason),) = scontrol_updates(scontrol)
    assert reason == "Reason=gpulens: GPULost\\r\\n\\x1b[2J gpu 0 GPU-0"


def test_a_hostile_alert_name_still_makes_a_valid_taint():
    stand_in = KubeStandIn(nodes={"gpu-1": {"metadata": {"resourceVersion": "1"}, "spec": {}}})
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url))
        with receiver(isolator, dry_run=False) as (base, _):
            handled = deliver(
                base, notification(alert(alertname="-x y/" + "z" * 99, instance="gpu-1:1", fingerprint="f1"))
            )
    assert handled[0]["result"] == "applied"
    (patch,) = stand_in.isolation_patches()
    # the API's rule for taint values: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends
    assert re.fullmatch(
        r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", patch.body["spec"]["taints"][0]["value"]
    )


@pytest.mark.parametrize(
    ("name", "value"), [("GPULost", "GPULost"), ("-x y/z", "x_y_z"), ("", "unknown"), ("a" * 80, "a" * 63)]
)
def test_taint_values_follow_the_api_rules(name, value):
    assert taint_value(name) == value


def test_deeply_nested_json_is_a_one_line_400(scontrol):
    deep = b'{"alerts": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with receiver(SlurmIsolator()) as (base, _):
        status, body = post(f"{base}/alerts", None, raw=deep)
    assert (status, body) == (400, f"bad payload: body: nested deeper than {MAX_DEPTH} levels\n")


def test_brackets_inside_strings_do_not_count_as_nesting():
    labels = {"alertname": "A", "instance": "n1:1", "note": "[" * 100 + "{" * 100}
    (parsed,) = parse_webhook(json.dumps({"alerts": [{"status": "firing", "labels": labels}]}).encode())
    assert parsed.labels["note"].startswith("[[[")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("fingerprint", "f" * 65, "alerts[0].fingerprint: longer than 64 characters (65)"),
        ("startsAt", "2" * 100, "alerts[0].startsAt: longer than 64 characters (100)"),
    ],
)
def test_long_idempotency_keys_are_refused(field, value, message):
    raw = alert()
    raw[field] = value
    with pytest.raises(PayloadError) as info:
        parse_webhook(json.dumps(notification(raw)).encode())
    assert str(info.value) == message


def test_label_values_and_counts_are_bounded():
    raw = alert(note="v" * 1025)
    with pytest.raises(PayloadError, match=r"alerts\[0\].labels.note: longer than 1024 characters"):
        parse_webhook(json.dumps(notification(raw)).encode())
    raw = alert(**{f"l{i}": "v" for i in range(64)})
    with pytest.raises(PayloadError, match="more than 64 entries"):
        parse_webhook(json.dumps(notification(raw)).encode())


def test_alerts_per_notification_are_bounded():
    body = notification(*[alert(fingerprint=f"f{i}") for i in range(1001)])
    with pytest.raises(PayloadError, match="more than 1000 alerts"):
        parse_webhook(json.dumps(body).encode())


def test_remembered_episodes_are_bounded(scontrol, monkeypatch):
    monkeypatch.setattr(service, "MAX_EPISODES", 5)
    with receiver(SlurmIsolator()) as (base, remediator):
        for i in range(12):
            deliver(base, notification(alert(fingerprint=f"fp{i:02d}")))
        kept = list(remediator._episodes)
    assert kept == [f"fp{i:02d}@2026-11-29T21:00:00Z" for i in range(7, 12)]
