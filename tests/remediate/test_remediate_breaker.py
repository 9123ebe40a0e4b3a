"""The circuit breaker cannot be drained, bypassed or reset by a restart, and one slow node never
holds up the others (issue 17, item 4)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.remediate.breaker import (
    Admission,
    BreakerStoreError,
    CircuitBreaker,
    FileStore,
)
from gpulens.remediate.kubernetes import LIST_PAGE, KubernetesClient, KubernetesIsolator
from gpulens.remediate.kubestate import DATA_KEY, ConfigMapStore
from gpulens.remediate.slurm import SlurmIsolator
from tests.remediate.remediate_support import (
    WAIT_S,
    KubeStandIn,
    alert,
    deliver,
    kube_api,
    notification,
    path_with,
    post,
    receiver,
    scontrol_calls,
    scontrol_updates,
    wait_actions,
    write_fake_scontrol,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _results(actions: list[dict[str, Any]]) -> list[str]:
    return [a["result"] for a in actions]


def _node(name: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "resourceVersion": "1"}, "spec": {}}


@pytest.fixture
def known_nodes(tmp_path, monkeypatch):
    """A scontrol that knows gpu-1 .. gpu-4 only, and a node set `gpus` of gpu-1 and gpu-2."""
    nodes = {f"gpu-{i}": {"State": "MIXED"} for i in range(1, 5)}
    bin_dir, record = write_fake_scontrol(
        tmp_path, any_node=False, nodes=nodes, sets={"gpus": ["gpu-1", "gpu-2"]}
    )
    monkeypatch.setenv("PATH", path_with(bin_dir)["PATH"])
    return record


def test_alerts_for_nodes_that_do_not_exist_never_fill_the_window(known_nodes):
    with receiver(SlurmIsolator(), dry_run=False, max_nodes=1) as (base, remediator):
        for ghost in ("ghost-1", "ghost-2", "ghost-3"):
            handled = deliver(base, notification(alert(instance=f"{ghost}:9842")))
            assert _results(handled) == ["failed"]
        handled = deliver(base, notification(alert(instance="gpu-3:9842")))
        state = remediator.breaker.state()
    assert _results(handled) == ["applied"]
    assert (state.open, state.nodes_in_window) == (False, ("gpu-3",))


def test_failed_isolations_never_latch_the_breaker(tmp_path, monkeypatch):
    bin_dir, _ = write_fake_scontrol(tmp_path, exit_code=1)
    monkeypatch.setenv("PATH", path_with(bin_dir)["PATH"])
    with receiver(SlurmIsolator(), dry_run=False, max_nodes=2) as (base, remediator):
        for node in ("n1", "n2", "n3", "n4"):
            handled = deliver(base, notification(alert(instance=f"{node}:9842")))
            assert _results(handled) == ["failed"]
        state = remediator.breaker.state()
    assert (state.open, state.nodes_in_window, state.in_flight) == (False, (), ())


@pytest.mark.parametrize("name", ["ALL", "all", "All"])
def test_slurm_refuses_all_as_a_node_name(known_nodes, name):
    with receiver(SlurmIsolator(), dry_run=False) as (base, remediator):
        handled = deliver(base, notification(alert(instance=f"{name}:9842")))
        state = remediator.state()
    assert _results(handled) == ["rejected"]
    assert "means every node to scontrol" in state["actions"][0]["detail"]
    assert scontrol_calls(known_nodes) == []
    assert state["breaker"]["nodes_in_window"] == []


@pytest.mark.parametrize("name", ["gpu[1-4]", "gpu-1,gpu-2", "gpu-*"])
def test_slurm_refuses_host_lists_and_wildcards(known_nodes, name):
    with receiver(SlurmIsolator(), dry_run=False) as (base, _):
        handled = deliver(base, notification(alert(node=name)))
    assert _results(handled) == ["rejected"]
    assert scontrol_calls(known_nodes) == []


def test_slurm_refuses_a_node_set_name_without_draining_it(known_nodes):
    with receiver(SlurmIsolator(), dry_run=False, max_nodes=1) as (base, remediator):
        handled = deliver(base, notification(alert(instance="gpus:9842")))
        state = remediator.state()
    assert _results(handled) == ["failed"]
    assert "names 2 nodes, not exactly node gpus" in state["actions"][0]["detail"]
    assert scontrol_updates(known_nodes) == []
    assert state["breaker"]["nodes_in_window"] == []


@pytest.mark.parametrize("name", ["GPU-17", "gpu_17", "gpu-17-", "a" * 254])
def test_kubernetes_refuses_names_that_are_not_node_names(name):
    stand_in = KubeStandIn(nodes={})
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url))
        with receiver(isolator, dry_run=False) as (base, _):
            handled = deliver(base, notification(alert(node=name)))
    assert _results(handled) == ["rejected"]
    # nothing but the start's listing of the nodes (no audit log: their episode records)
    assert [r.path for r in stand_in.requests] == [f"/api/v1/nodes?limit={LIST_PAGE}"]


def test_kubernetes_unknown_nodes_never_fill_the_window():
    stand_in = KubeStandIn(nodes={"gpu-1": _node("gpu-1")})
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url))
        with receiver(isolator, dry_run=False, max_nodes=1) as (base, remediator):
            for ghost in ("ghost-1", "ghost-2"):
                deliver(base, notification(alert(instance=f"{ghost}:9842")))
            handled = deliver(base, notification(alert(instance="gpu-1:9842")))
            state = remediator.breaker.state()
    assert _results(handled) == ["applied"]
    assert not state.open


def test_a_slow_node_does_not_hold_up_another_node():
    stand_in = KubeStandIn(nodes={"slow": _node("slow"), "fast": _node("fast")})
    release = threading.Event()
    stand_in.hold["slow"] = release
    with kube_api(stand_in):
        isolator = KubernetesIsolator(KubernetesClient(stand_in.url, timeout_s=30))
        with receiver(isolator, dry_run=False) as (base, _):
            try:
                assert post(f"{base}/alerts", notification(alert(instance="slow:1")))[0] == 200
                assert stand_in.held.wait(WAIT_S), "the slow node's read reached the API"
                assert post(f"{base}/alerts", notification(alert(instance="fast:1")))[0] == 200
                fast = wait_actions(base, "fast")  # acted on while the slow node's read is still held
                slow_still_held = not release.is_set()
            finally:
                release.set()
            slow = wait_actions(base, "slow")
    assert _results(fast) == ["applied"]
    assert slow_still_held
    assert _results(slow) == ["applied"]


def test_an_action_has_a_total_deadline(tmp_path, monkeypatch):
    # every scontrol call takes 2 s: two of them (show, then update) cannot fit in 3 s
    bin_dir, _ = write_fake_scontrol(tmp_path, delay_s=2)
    monkeypatch.setenv("PATH", path_with(bin_dir)["PATH"])
    with receiver(SlurmIsolator(), dry_run=False, action_timeout_s=3) as (base, remediator):
        handled = deliver(base, notification(alert(instance="gpu-1:9842")))
        state = remediator.state()
    assert _results(handled) == ["failed"]
    assert "no answer in" in state["actions"][0]["detail"]
    assert state["breaker"]["nodes_in_window"] == []


def test_breaker_state_survives_a_restart(tmp_path):
    path = tmp_path / "breaker.json"
    first = CircuitBreaker(max_nodes=1, window_s=600, clock=Clock(), store=FileStore(path))
    first.commit(first.reserve("n1"))
    assert first.reserve("n2").admission is Admission.OPEN
    again = CircuitBreaker(max_nodes=1, window_s=600, clock=Clock(), store=FileStore(path))
    state = again.state()
    assert (state.open, state.refused_node, state.nodes_in_window) == (True, "n2", ("n1",))
    assert again.reserve("n3").admission is Admission.OPEN


def test_a_reservation_in_flight_at_a_crash_counts_after_the_restart(tmp_path):
    path = tmp_path / "breaker.json"
    crashed = CircuitBreaker(max_nodes=1, window_s=600, clock=Clock(), store=FileStore(path))
    crashed.reserve("n1")  # the process dies before the action's outcome is known
    restarted = CircuitBreaker(max_nodes=1, window_s=600, clock=Clock(), store=FileStore(path))
    assert restarted.state().nodes_in_window == ("n1",)


def test_a_corrupt_state_file_is_moved_aside_with_one_line(tmp_path, caplog):
    path = tmp_path / "breaker.json"
    path.write_text("{not json")
    breaker = CircuitBreaker(max_nodes=1, window_s=600, store=FileStore(path))  # not fatal
    assert not breaker.state().open
    assert (tmp_path / "breaker.json.corrupt").read_text() == "{not json" and not path.exists()
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith(f"--breaker-state-file {path}: not JSON")
    assert "breaker.json.corrupt" in lines[0]


def test_an_unreadable_state_file_is_one_line_error(tmp_path):
    path = tmp_path / "breaker.json"
    path.mkdir()  # EISDIR: not corrupt, unreadable; the receiver refuses to start
    with pytest.raises(BreakerStoreError) as info:
        CircuitBreaker(max_nodes=1, window_s=600, store=FileStore(path))
    assert str(info.value).startswith(f"--breaker-state-file {path}: ") and "\n" not in str(info.value)


def test_the_state_file_is_replaced_atomically(tmp_path):
    path = tmp_path / "breaker.json"
    breaker = CircuitBreaker(max_nodes=2, window_s=600, clock=Clock(), store=FileStore(path))
    breaker.commit(breaker.reserve("n1"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["breaker.json"]  # no temporary left
    assert json.loads(path.read_text())["nodes"] == {"n1": 1000.0}


def test_breaker_state_in_a_configmap_survives_a_restart():
    stand_in = KubeStandIn()
    with kube_api(stand_in):
        client = KubernetesClient(stand_in.url)
        first = CircuitBreaker(1, 600, clock=Clock(), store=ConfigMapStore(client, "gpulens", "breaker"))
        first.commit(first.reserve("n1"))
        first.reserve("n2")
        again = CircuitBreaker(1, 600, clock=Clock(), store=ConfigMapStore(client, "gpulens", "breaker"))
        assert again.state().open
    saved = json.loads(stand_in.configmaps["gpulens/breaker"]["data"][DATA_KEY])
    assert (saved["nodes"], saved["refused_node"]) == ({"n1": 1000.0}, "n2")
    assert [r.method for r in stand_in.requests][:3] == ["GET", "PATCH", "POST"]  # created on first save


def test_a_newcomer_waits_for_reservations_in_flight_instead_of_latching():
    breaker = CircuitBreaker(max_nodes=1, window_s=600, clock=Clock())
    first = breaker.reserve("n1")
    assert breaker.reserve("n2").admission is Admission.BUSY
    assert not breaker.state().open
    breaker.release(first)  # n1's isolation failed
    assert breaker.reserve("n2").admission is Admission.ADMITTED


OPS = st.lists(
    st.tuples(st.sampled_from(["n1", "n2", "n3", "n4"]), st.sampled_from(["ok", "fail", "crash"])),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(max_nodes=st.integers(1, 3), ops=OPS)
def test_only_succeeded_actions_count_and_the_window_never_overflows(max_nodes, ops):
    breaker = CircuitBreaker(max_nodes=max_nodes, window_s=600, clock=Clock())
    succeeded: set[str] = set()
    for node, how in ops:
        ticket = breaker.reserve(node)
        if ticket.admission is Admission.ADMITTED:
            if how == "ok":
                breaker.commit(ticket)
                succeeded.add(node)
            else:
                breaker.release(ticket)
    state = breaker.state()
    assert set(state.nodes_in_window) == succeeded
    assert len(state.nodes_in_window) <= max_nodes
    if state.open:
        assert len(succeeded) == max_nodes  # only a full window of successes latches it


def test_a_corrupt_breaker_state_in_a_configmap_is_moved_aside_and_never_latches(caplog):
    stand_in = KubeStandIn()
    stand_in.configmaps["gpulens/breaker"] = {
        "metadata": {"name": "breaker", "namespace": "gpulens"},
        "data": {DATA_KEY: '{"version": 1, "opened_at": '},  # cut short
    }
    with kube_api(stand_in):
        client = KubernetesClient(stand_in.url)
        breaker = CircuitBreaker(1, 600, clock=Clock(), store=ConfigMapStore(client, "gpulens", "breaker"))
        assert not breaker.state().open
    data = stand_in.configmaps["gpulens/breaker"]["data"]
    assert DATA_KEY not in data and data[f"{DATA_KEY}.corrupt"] == '{"version": 1, "opened_at": '
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(
        "moved to key breaker.json.corrupt" in w and "configmap gpulens/breaker" in w for w in warnings
    )
