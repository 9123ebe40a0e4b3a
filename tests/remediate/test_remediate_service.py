"""`gpulens remediate` over HTTP: authentication, validation, dry-run, idempotency, the breaker,
metrics, and the Slurm and Kubernetes backends against a fake scontrol and an API stand-in."""

from __future__ import annotations

import http.client
import json
import logging
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from gpulens.remediate.kubernetes import (
    LIST_PAGE,
    MAX_PAGE_ANSWER,
    TAINT_KEY,
    KubernetesClient,
    KubernetesIsolator,
)
from gpulens.remediate.slurm import SlurmIsolator
from tests.remediate.remediate_support import (
    TOKEN,
    KubeStandIn,
    alert,
    deliver,
    get,
    kube_api,
    notification,
    path_with,
    post,
    receiver,
    scontrol_calls,
    scontrol_updates,
    write_fake_scontrol,
)
from tests.support.procs import free_port, wait_http


def _state(base: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(get(f"{base}/-/state")[1])
    return doc


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic YW06cHc=", f"Token {TOKEN}"])
def test_callers_without_the_credentials_get_401(scontrol, authorization):
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        status, _body = post(f"{base}/alerts", notification(alert()), authorization=authorization)
    assert status == 401
    assert scontrol_calls(scontrol) == []


def test_bad_payload_gets_a_one_line_400(scontrol):
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        status, body = post(f"{base}/alerts", None, raw=b'{"alerts": [{"status": "firing", "labels": 3}]}')
    assert status == 400
    assert body == "bad payload: alerts[0].labels: expected an object of string values\n"


def test_dry_run_is_the_default_and_logs_the_exact_command(scontrol, caplog):
    caplog.set_level(logging.INFO, logger="gpulens.remediate")
    with receiver(SlurmIsolator()) as (base, _):
        deliver(base, notification(alert(instance="gpu-17:9842", gpu="5")))
        state = _state(base)
    assert scontrol_calls(scontrol) == []
    (action,) = state["actions"]
    assert action["result"] == "dry_run"
    assert action["node"] == "gpu-17"
    expected = "scontrol update NodeName=gpu-17 State=DRAIN 'Reason=gpulens: GPUXidFallenOffBus gpu 5 GPU-5'"
    assert action["detail"] == f"DRY-RUN slurm: {expected}"
    assert expected in caplog.text


def test_apply_drains_the_node_with_scontrol(scontrol):
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        handled = deliver(base, notification(alert(instance="gpu-17:9842", gpu="5")))
    assert [(a["alertname"], a["node"], a["result"]) for a in handled] == [
        ("GPUXidFallenOffBus", "gpu-17", "applied")
    ]
    assert scontrol_calls(scontrol) == [
        ["show", "node", "gpu-17", "--oneliner"],
        ["update", "NodeName=gpu-17", "State=DRAIN", "Reason=gpulens: GPUXidFallenOffBus gpu 5 GPU-5"],
    ]


@pytest.mark.parametrize(
    ("state", "reason", "owner"),
    [
        ("IDLE+DRAIN", "disk replacement", "by someone else"),
        ("MIXED+DRAIN", "gpulens: GPULost gpu 1 GPU-1", "by gpulens"),
        ("DOWN+DRAIN", "", "by someone else"),
    ],
)
def test_a_drained_node_is_left_as_it_is(tmp_path, monkeypatch, state, reason, owner):
    bin_dir, record = write_fake_scontrol(tmp_path, state=state, reason=reason)
    monkeypatch.setenv("PATH", path_with(bin_dir)["PATH"])
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        handled = deliver(base, notification(alert(instance="gpu-17:9842")))
        state_doc = _state(base)
    assert handled[0]["result"] == "already"
    assert state_doc["actions"][0]["detail"] == f"node gpu-17 already drained {owner} (Reason={reason})"
    assert scontrol_updates(record) == []


def test_repeats_of_one_episode_act_once_and_a_new_episode_acts_again(scontrol):
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        deliver(base, notification(alert()))
        handled = deliver(base, notification(alert()))
        assert handled[0]["result"] == "duplicate"
        deliver(base, notification(alert(starts_at="2026-11-30T08:00:00Z")))
    assert len(scontrol_updates(scontrol)) == 2


def test_resolved_never_returns_a_node_to_service(scontrol):
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        deliver(base, notification(alert(status="resolved")))
        state = _state(base)
    assert scontrol_calls(scontrol) == []
    assert state["actions"][0]["result"] == "resolved_ignored"


def test_alerts_without_the_remediate_label_are_ignored(scontrol):
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        handled = deliver(base, notification(alert(alertname="GPUTemperatureHigh", remediate=None)))
    assert handled == []
    assert scontrol_calls(scontrol) == []


def test_a_failed_drain_is_reported_and_retried_on_the_next_repeat(tmp_path, monkeypatch):
    bin_dir, record = write_fake_scontrol(tmp_path, exit_code=1)
    monkeypatch.setenv("PATH", path_with(bin_dir)["PATH"])
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        first = deliver(base, notification(alert()))
        second = deliver(base, notification(alert()))
        state = _state(base)
    assert [b[0]["result"] for b in (first, second)] == ["failed", "failed"]
    assert len(scontrol_updates(record)) == 2
    assert state["actions"][0]["detail"].endswith("slurm_update error: Invalid node name specified")


def test_breaker_stops_isolating_after_max_nodes_until_reset(scontrol):
    with receiver(SlurmIsolator(), dry_run=False, max_nodes=2) as (base, _):
        for node in ("n1", "n2", "n3"):
            deliver(base, notification(alert(instance=f"{node}:9842")))
        metrics = get(f"{base}/metrics")[1]
        state = _state(base)
        assert post(f"{base}/-/breaker/reset", None, authorization=None, raw=b"")[0] == 401
        assert post(f"{base}/-/breaker/reset", None, raw=b"")[0] == 200
        deliver(base, notification(alert(instance="n3:9842", starts_at="later")))
    assert [c[1] for c in scontrol_updates(scontrol)] == ["NodeName=n1", "NodeName=n2", "NodeName=n3"]
    assert [a["result"] for a in state["actions"]] == ["applied", "applied", "breaker_open"]
    assert state["breaker"]["open"] is True and state["breaker"]["refused_node"] == "n3"
    assert "gpulens_remediate_breaker_open 1.0" in metrics
    assert 'gpulens_remediate_actions_total{kind="isolate_node",result="breaker_open"} 1.0' in metrics


def test_metrics_count_actions_and_requests(scontrol):
    with receiver(SlurmIsolator()) as (base, _):
        deliver(base, notification(alert(), alert(gpu="1", remediate="isolate_gpu")))
        post(f"{base}/alerts", notification(alert()), authorization="Bearer nope")
        metrics = get(f"{base}/metrics")[1]
    assert 'gpulens_remediate_actions_total{kind="isolate_node",result="dry_run"} 1.0' in metrics
    assert 'gpulens_remediate_actions_total{kind="isolate_gpu",result="dry_run"} 1.0' in metrics
    assert 'gpulens_remediate_requests_total{code="200"} 1.0' in metrics
    assert 'gpulens_remediate_requests_total{code="401"} 1.0' in metrics
    assert "gpulens_remediate_dry_run 1.0" in metrics
    assert "gpulens_remediate_breaker_open 0.0" in metrics


def _node(
    name: str, taints: list[dict[str, str]] | None = None, unschedulable: bool = False
) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "annotations": {}, "resourceVersion": "7"},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
    }


def _pod(name: str, node: str, owner: str = "ReplicaSet", phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "ownerReferences": [{"kind": owner, "name": "o"}]},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


@pytest.fixture
def kube(tmp_path):
    state = KubeStandIn(
        nodes={
            "gpu-1": _node(
                "gpu-1", taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
            ),
            "gpu-2": _node(
                "gpu-2",
                taints=[{"key": TAINT_KEY, "value": "GPULost", "effect": "NoSchedule"}],
                unschedulable=True,
            ),
        },
        pods=[
            _pod("train-0", "gpu-1"),
            _pod("dcgm", "gpu-1", owner="DaemonSet"),
            _pod("done", "gpu-1", phase="Succeeded"),
            _pod("guarded", "gpu-1"),
            _pod("other", "gpu-2"),
        ],
        pdb_blocked={"guarded"},
    )
    token_file = tmp_path / "kube-token"
    token_file.write_text("kube-sa-token\n")
    with kube_api(state):
        state.client = KubernetesClient(state.url, token_file=token_file)
        yield state


def test_kubernetes_isolate_gpu_cordons_and_taints_without_evicting(kube):
    with receiver(KubernetesIsolator(kube.client, drain=True), dry_run=False) as (base, _):
        handled = deliver(
            base,
            notification(
                alert(alertname="GPURowRemapPending", instance="gpu-1:9842", gpu="3", remediate="isolate_gpu")
            ),
        )
    assert handled[0]["result"] == "applied"
    (patch,) = kube.isolation_patches()
    assert patch.path == "/api/v1/nodes/gpu-1"
    assert patch.content_type == "application/merge-patch+json"
    assert patch.authorization == "Bearer kube-sa-token"
    assert patch.body["spec"]["unschedulable"] is True
    assert patch.body["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": TAINT_KEY, "value": "GPURowRemapPending", "effect": "NoSchedule"},
    ]
    annotations = patch.body["metadata"]["annotations"]
    assert annotations["gpulens.io/isolation-reason"] == "gpulens: GPURowRemapPending gpu 3 GPU-3"
    assert time.strptime(annotations["gpulens.io/isolated-at"], "%Y-%m-%dT%H:%M:%SZ")
    assert annotations["gpulens.io/alert-fingerprint"] == "fp-GPURowRemapPending-gpu-1:9842-3"
    assert kube.of("POST") == []


def test_kubernetes_isolate_node_with_drain_evicts_through_the_eviction_api(kube):
    with receiver(KubernetesIsolator(kube.client, drain=True), dry_run=False) as (base, _):
        handled = deliver(base, notification(alert(instance="gpu-1:9842")))
    assert handled[0]["result"] == "applied"
    evictions = kube.of("POST")
    assert [e.path for e in evictions] == [
        "/api/v1/namespaces/ml/pods/train-0/eviction",
        "/api/v1/namespaces/ml/pods/guarded/eviction",
    ]
    assert evictions[0].body == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "train-0", "namespace": "ml"},
    }


def test_kubernetes_drain_reports_pods_blocked_by_disruption_budgets(kube):
    with receiver(KubernetesIsolator(kube.client, drain=True), dry_run=False) as (base, _):
        deliver(base, notification(alert(instance="gpu-1:9842")))
        state = _state(base)
    assert state["actions"][0]["detail"].endswith(
        "drain: 1 evicted, 1 blocked by disruption budgets, 0 failed"
    )


def test_kubernetes_node_already_isolated_is_not_patched_again(kube):
    with receiver(KubernetesIsolator(kube.client), dry_run=False) as (base, _):
        handled = deliver(base, notification(alert(instance="gpu-2:9842")))
    assert handled[0]["result"] == "already"
    assert kube.isolation_patches() == []


def test_kubernetes_unknown_node_fails_without_patching(kube):
    with receiver(KubernetesIsolator(kube.client), dry_run=False) as (base, _):
        handled = deliver(base, notification(alert(instance="gpu-9:9842")))
        state = _state(base)
    assert handled[0]["result"] == "failed"
    assert state["actions"][0]["detail"] == 'GET node gpu-9: HTTP 404 nodes "gpu-9" not found'
    assert kube.of("PATCH") == []


def test_kubernetes_dry_run_touches_nothing_and_describes_the_patch(kube):
    with receiver(KubernetesIsolator(kube.client, drain=True)) as (base, _):
        deliver(base, notification(alert(instance="gpu-1:9842")))
        state = _state(base)
    assert kube.requests == []
    detail = state["actions"][0]["detail"]
    assert detail.startswith(f"DRY-RUN kubernetes: PATCH {kube.url}/api/v1/nodes/gpu-1 ")
    assert '"unschedulable": true' in detail and TAINT_KEY in detail
    assert detail.endswith("evict every non-DaemonSet pod on gpu-1 via the Eviction API")


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "remediate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_cli_refuses_to_start_without_caller_credentials():
    result = _cli("--backend", "slurm")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "gpulens: error: no credentials: give --token-file, or basic_auth_users in --web.config.file "
        "(or the deprecated --basic-auth-user with --basic-auth-password-file)"
    ]


def test_cli_names_an_unreadable_token_file(tmp_path):
    result = _cli("--backend", "slurm", "--token-file", str(tmp_path / "missing"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpulens: error: --token-file {tmp_path / 'missing'}: ")


def test_cli_apply_with_basic_auth_drains_through_scontrol_on_path(tmp_path):
    bin_dir, record = write_fake_scontrol(tmp_path)
    password = tmp_path / "password"
    password.write_text("pw\n")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "remediate",
            "--backend",
            "slurm",
            "--apply",
            "--web.listen-address",  # exporter-toolkit's name (--listen, the older one, elsewhere)
            f"127.0.0.1:{port}",
            "--log.level",
            "info",
            "--basic-auth-user",
            "am",
            "--basic-auth-password-file",
            str(password),
        ],
        env=path_with(bin_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/-/healthy", timeout=20, proc=proc)
        deliver(
            f"http://127.0.0.1:{port}",
            notification(alert(instance="gpu-3:9842")),
            authorization="Basic YW06cHc=",
        )
    finally:
        proc.terminate()
        output = proc.communicate(timeout=10)[0]
    assert scontrol_updates(record) == [
        ["update", "NodeName=gpu-3", "State=DRAIN", "Reason=gpulens: GPUXidFallenOffBus gpu 0 GPU-0"]
    ]
    assert "applied GPUXidFallenOffBus node=gpu-3" in output


def test_kubernetes_unreadable_api_token_fails_with_one_line(kube, tmp_path):
    client = KubernetesClient(kube.url, token_file=tmp_path / "gone")
    with receiver(KubernetesIsolator(client), dry_run=False) as (base, _):
        handled = deliver(base, notification(alert(instance="gpu-1:9842")))
        state = _state(base)
    assert handled[0]["result"] == "failed"
    assert (
        state["actions"][0]["detail"] == f"--kube-token-file {tmp_path / 'gone'}: No such file or directory"
    )
    assert kube.requests == []


def test_unreachable_kubernetes_api_fails_and_is_retried(scontrol):
    client = KubernetesClient(f"http://127.0.0.1:{free_port()}")
    with receiver(KubernetesIsolator(client), dry_run=False) as (base, _):
        first = deliver(base, notification(alert(instance="gpu-1:9842")))
        second = deliver(base, notification(alert(instance="gpu-1:9842")))
        state = _state(base)
    assert [b[0]["result"] for b in (first, second)] == ["failed", "failed"]
    assert state["actions"][0]["detail"].startswith("GET /api/v1/nodes/gpu-1: ")


def test_kubernetes_patch_is_conditional_and_retried_after_a_conflict(kube):
    kube.conflicts = 1
    with receiver(KubernetesIsolator(kube.client), dry_run=False) as (base, _):
        handled = deliver(base, notification(alert(instance="gpu-1:9842", remediate="isolate_gpu")))
    assert handled[0]["result"] == "applied"
    first, second = kube.isolation_patches()
    assert first.body["metadata"]["resourceVersion"] == "7"  # refused: the node moved on to 8
    assert second.body["metadata"]["resourceVersion"] == "8"
    assert len([r for r in kube.of("GET") if r.path == "/api/v1/nodes/gpu-1"]) == 2


def test_kubernetes_gives_up_after_repeated_conflicts(kube):
    kube.conflicts = 10
    with receiver(KubernetesIsolator(kube.client), dry_run=False) as (base, _):
        handled = deliver(base, notification(alert(instance="gpu-1:9842", remediate="isolate_gpu")))
        state = _state(base)
    assert handled[0]["result"] == "failed"
    assert state["actions"][0]["detail"] == "PATCH node gpu-1: still conflicting after 3 tries"


def test_oversized_or_unsized_bodies_are_refused(scontrol):
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        too_big = post(f"{base}/alerts", None, raw=b" " * ((1 << 20) + 1))
        connection = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=10)
        connection.putrequest("POST", "/alerts")
        connection.putheader("Authorization", f"Bearer {TOKEN}")
        connection.endheaders()  # no Content-Length
        unsized = connection.getresponse().status
        connection.close()
    assert too_big == (413, f"body larger than {1 << 20} bytes\n")
    assert unsized == 411
    assert scontrol_calls(scontrol) == []


def test_cli_kubernetes_dry_run_needs_no_cluster(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    port = free_port()
    env = {k: v for k, v in path_with(tmp_path).items() if not k.startswith("KUBERNETES_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "remediate",
            "--backend",
            "kubernetes",
            "--drain",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--token-file",
            str(token),
            "--kube-token-file",
            str(tmp_path / "none"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/-/healthy", timeout=20, proc=proc)
        deliver(base, notification(alert(instance="gpu-5:9842")))
        state = _state(base)
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    (action,) = state["actions"]
    assert action["result"] == "dry_run"
    assert action["detail"].startswith(
        "DRY-RUN kubernetes: PATCH https://kubernetes.default.svc/api/v1/nodes/gpu-5 "
    )


def test_cli_kubernetes_apply_outside_a_cluster_needs_an_api_url(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {k: v for k, v in path_with(tmp_path).items() if not k.startswith("KUBERNETES_")}
    result = _cli("--backend", "kubernetes", "--apply", "--token-file", str(token), env=env)
    assert result.returncode == 2
    assert result.stderr == "gpulens: error: --kube-api-url is required outside a Kubernetes pod\n"


def test_cli_slurm_requeue_is_refused_for_kubernetes_where_the_drain_evicts(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    result = _cli("--backend", "kubernetes", "--slurm-requeue", "--token-file", str(token))
    assert result.returncode == 2
    assert result.stderr == (
        "gpulens: error: --slurm-requeue is for --backend slurm (on Kubernetes, --drain evicts the pods)\n"
    )


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Token {TOKEN}"])
def test_state_needs_the_credentials_and_health_and_metrics_stay_open(authorization):
    """/-/state names nodes and recent actions: behind the write endpoints' credentials (401 with
    the challenge); the probes' /-/healthy and Prometheus' /metrics stay open."""
    with receiver(SlurmIsolator()) as (base, _):
        request = urllib.request.Request(
            f"{base}/-/state", headers={"Authorization": authorization} if authorization else {}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401
        assert "Bearer" in refused.value.headers["WWW-Authenticate"]
        assert b"queue" not in refused.value.read()
        assert get(f"{base}/-/healthy", None) == (200, "OK\n")
        assert get(f"{base}/metrics", None)[0] == 200
        assert "queue" in json.loads(get(f"{base}/-/state")[1])


def test_a_node_with_many_pods_is_drained_a_page_at_a_time(kube):
    kube.pods += [_pod(f"worker-{i}", "gpu-1") for i in range(3 * LIST_PAGE)]
    with receiver(KubernetesIsolator(kube.client, drain=True), dry_run=False) as (base, _):
        deliver(base, notification(alert(instance="gpu-1:9842")))
    lists = [r.path for r in kube.of("GET") if r.path.startswith("/api/v1/pods?")]
    assert len(lists) >= 3 and all(f"limit={LIST_PAGE}" in p for p in lists)
    evicted = {e.path.split("/")[-2] for e in kube.of("POST")}
    assert {f"worker-{i}" for i in range(3 * LIST_PAGE)} <= evicted


def test_a_page_of_pods_over_its_byte_bound_fails_the_drain_in_one_line(kube):
    huge = _pod("huge", "gpu-1")
    huge["metadata"]["annotations"] = {"blob": "x" * (MAX_PAGE_ANSWER + 1)}
    kube.pods.append(huge)
    with receiver(KubernetesIsolator(kube.client, drain=True), dry_run=False) as (base, _):
        deliver(base, notification(alert(instance="gpu-1:9842")))
        state = _state(base)
    detail = state["actions"][0]["detail"]
    assert "drain failed" in detail and "\n" not in detail
