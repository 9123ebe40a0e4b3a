"""Payload validation, node-name mapping and the circuit breaker of `gpulens remediate`."""

from __future__ import annotations

import json

import pytest

from gpulens.remediate.auth import AuthConfigError, Authenticator
from gpulens.remediate.breaker import Admission, CircuitBreaker
from gpulens.remediate.model import Alert
from gpulens.remediate.payload import PayloadError, parse_webhook
from gpulens.remediate.plan import PlanError, node_name, plan
from tests.remediate.remediate_support import alert, notification


def test_parses_an_alertmanager_notification():
    (parsed,) = parse_webhook(json.dumps(notification(alert())).encode())
    assert parsed.status == "firing"
    assert parsed.labels["alertname"] == "GPUXidFallenOffBus"
    assert parsed.fingerprint == "fp-GPUXidFallenOffBus-n1:9842-0"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "body is not JSON"),
        (b"[]", "body: expected a JSON object"),
        (json.dumps({"version": "3", "alerts": []}).encode(), 'version: expected "4"'),
        (json.dumps({"version": "4"}).encode(), "alerts: expected a list"),
        (
            json.dumps({"alerts": [{"status": "pending", "labels": {"a": "b"}}]}).encode(),
            "alerts[0].status: expected",
        ),
        (
            json.dumps({"alerts": [{"status": "firing", "labels": {"gpu": 0}}]}).encode(),
            "alerts[0].labels: expected an object of string values",
        ),
        (
            json.dumps({"alerts": [{"status": "firing", "labels": {}}]}).encode(),
            "alerts[0].labels: expected at least one label",
        ),
    ],
)
def test_rejects_a_bad_payload_with_one_line(body, message):
    with pytest.raises(PayloadError) as info:
        parse_webhook(body)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_missing_fingerprint_is_derived_from_the_labels():
    body = {"alerts": [{"status": "firing", "labels": {"alertname": "A", "instance": "n1:1"}}]}
    first = parse_webhook(json.dumps(body).encode())[0].fingerprint
    assert first == parse_webhook(json.dumps(body).encode())[0].fingerprint
    body["alerts"][0]["labels"]["instance"] = "n2:1"
    assert parse_webhook(json.dumps(body).encode())[0].fingerprint != first


@pytest.mark.parametrize(
    ("labels", "node"),
    [
        ({"instance": "gpu-17.dc1:9842"}, "gpu-17.dc1"),
        ({"instance": "gpu-17"}, "gpu-17"),
        ({"instance": "10.0.0.7:9842"}, "10.0.0.7"),
        ({"instance": "10.0.0.7:9842", "node": "gpu-17"}, "gpu-17"),
    ],
)
def test_node_is_the_node_label_or_the_instance_without_port(labels, node):
    assert node_name(labels) == node


@pytest.mark.parametrize("labels", [{}, {"instance": "a b:9842"}, {"node": "n1;reboot"}, {"node": "-x"}])
def test_unusable_node_names_are_refused(labels):
    with pytest.raises(PlanError):
        node_name(labels)


def _alert(**labels: str) -> Alert:
    return Alert("firing", {"alertname": "GPULost", "instance": "n1:9842", **labels}, {}, "fp", "t0")


def test_plan_only_for_alerts_labelled_remediate():
    assert plan(_alert()) is None
    request = plan(_alert(remediate="isolate_gpu", gpu="3", uuid="GPU-3"))
    assert (request.kind, request.node, request.gpu, request.episode) == ("isolate_gpu", "n1", "3", "fp@t0")
    assert request.reason == "gpulens: GPULost gpu 3 GPU-3"


def test_plan_refuses_an_unknown_remediation_kind():
    with pytest.raises(PlanError, match="remediate='reboot'"):
        plan(_alert(remediate="reboot"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _act(breaker: CircuitBreaker, node: str, succeeded: bool = True) -> Admission:
    """One action on `node` through the breaker, succeeding or failing."""
    ticket = breaker.reserve(node)
    if succeeded:
        breaker.commit(ticket)
    else:
        breaker.release(ticket)
    return ticket.admission


def test_breaker_admits_up_to_max_nodes_then_opens():
    breaker = CircuitBreaker(max_nodes=2, window_s=600, clock=Clock())
    assert _act(breaker, "n1") is _act(breaker, "n2") is Admission.ADMITTED
    assert _act(breaker, "n3") is Admission.OPEN
    state = breaker.state()
    assert state.open and state.refused_node == "n3"


def test_breaker_counts_a_node_once():
    breaker = CircuitBreaker(max_nodes=1, window_s=600, clock=Clock())
    assert _act(breaker, "n1") is Admission.ADMITTED
    assert _act(breaker, "n1") is Admission.COUNTED
    assert not breaker.state().open


def test_breaker_window_slides_while_closed():
    clock = Clock()
    breaker = CircuitBreaker(max_nodes=1, window_s=600, clock=clock)
    _act(breaker, "n1")
    clock.now += 601
    assert _act(breaker, "n2") is Admission.ADMITTED
    assert breaker.state().nodes_in_window == ("n2",)


def test_open_breaker_stays_open_until_reset():
    clock = Clock()
    breaker = CircuitBreaker(max_nodes=1, window_s=600, clock=clock)
    _act(breaker, "n1")
    assert _act(breaker, "n2") is Admission.OPEN
    clock.now += 10_000
    assert _act(breaker, "n3") is Admission.OPEN, "latched: the window passing does not close it"
    breaker.reset()
    assert _act(breaker, "n3") is Admission.ADMITTED


def test_authenticator_accepts_only_its_credentials():
    auth = Authenticator(token="t0k", username="am", password="pw")
    assert auth.allows("Bearer t0k")
    assert not auth.allows("Bearer t0k2")
    assert auth.allows("Basic YW06cHc=")  # am:pw
    assert not auth.allows("Basic YW06eHg=")  # am:xx
    assert not auth.allows("Basic !!!")
    assert not auth.allows(None)


def test_authenticator_needs_credentials():
    with pytest.raises(AuthConfigError):
        Authenticator()
