"""The receiver acknowledges a notification once it is queued and acts on it afterwards: the answer
never waits on the orchestrator, the queue survives a restart and is bounded, a hung node holds up
only itself, and a notification acted on twice is a `duplicate`.

Waits are on events and on the queue draining; their timeouts only guard against a hang."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, cast

from gpulens.httpclient import Deadline
from gpulens.remediate.breaker import CircuitBreaker
from gpulens.remediate.dispatch import Dispatcher
from gpulens.remediate.episodes import Episode
from gpulens.remediate.model import Alert, IsolationRequest, Outcome
from gpulens.remediate.payload import parse_webhook
from gpulens.remediate.plan import node_of
from gpulens.remediate.queue import NotificationQueue, QueueLimits
from gpulens.remediate.recovery import Backend, Recorded
from gpulens.remediate.service import Remediator
from tests.remediate.remediate_support import (
    TOKEN,
    WAIT_S,
    alert,
    deliver,
    notification,
    path_with,
    post,
    receiver,
    scontrol_updates,
    state,
    wait_actions,
    wait_drained,
    write_fake_scontrol,
)
from tests.support.procs import free_port, wait_http


class FakeIsolator:
    """A backend that records each isolation; on the nodes in `hold` it waits until `release` is
    set (a hung API or `scontrol`), after setting `entered`."""

    backend = "fake"

    def __init__(self, hold: tuple[str, ...] = ()) -> None:
        self.hold = set(hold)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls: list[str] = []

    def check_node(self, node: str) -> str | None:
        return None

    def describe(self, request: IsolationRequest, now: float) -> str:
        return f"isolate {request.node}"

    def isolate(self, request: IsolationRequest, now: float, deadline: Deadline) -> Outcome:
        self.calls.append(request.node)
        if request.node in self.hold:
            self.entered.set()
            self.release.wait(WAIT_S)
        return Outcome("applied", f"isolated {request.node}")

    def record(self, episode: Episode, deadline: Deadline) -> None:
        pass

    def recorded(self, deadline: Deadline) -> Recorded:
        return Recorded([], {})


def _alerts(*raw: dict[str, Any]) -> list[Alert]:
    return parse_webhook(json.dumps(notification(*raw)).encode())


def _remediator(isolator: FakeIsolator, state_dir: Path) -> Remediator:
    """A receiver's service on `state_dir`, as `--apply --state-dir` builds it (no HTTP)."""
    return Remediator(
        cast(Backend, isolator),  # the isolation half of a backend: these tests end before recovery
        CircuitBreaker(10, 3600),
        dry_run=False,
        audit_log=state_dir / "audit.jsonl",
        queue=NotificationQueue(state_dir / "queue.jsonl"),
    )


def _acted_on(remediator: Remediator) -> list[tuple[str, str]]:
    remediator.start()
    try:
        assert remediator.drain(WAIT_S)
    finally:
        remediator.stop()
    return [(a["node"], a["result"]) for a in remediator.state()["actions"]]


def test_the_answer_comes_before_a_backend_call_that_blocks():
    isolator = FakeIsolator(hold=("gpu-1",))
    with receiver(isolator, dry_run=False) as (base, _):
        try:
            status, answer = post(f"{base}/alerts", notification(alert(instance="gpu-1:9842")))
            assert isolator.entered.wait(WAIT_S), "the isolation started"
            blocked = state(base)
        finally:
            isolator.release.set()
        after = wait_drained(base)
    assert status == 200
    assert json.loads(answer) == {"queued": 1, "id": "1"}
    assert (blocked["queue"]["pending"], blocked["actions"]) == (1, [])
    assert [(a["node"], a["result"]) for a in after["actions"]] == [("gpu-1", "applied")]


def test_a_queued_notification_survives_a_restart(tmp_path):
    first = _remediator(FakeIsolator(), tmp_path)
    first.submit(_alerts(alert(instance="gpu-1:9842")))  # acknowledged; the receiver dies before acting
    isolator = FakeIsolator()
    second = _remediator(isolator, tmp_path)
    assert second.queue.recovered == 1
    assert _acted_on(second) == [("gpu-1", "applied")]
    assert isolator.calls == ["gpu-1"]
    assert NotificationQueue(tmp_path / "queue.jsonl").recovered == 0, "marked done in the file"


def test_a_corrupt_queue_file_is_moved_aside_with_a_warning_and_the_receiver_starts(tmp_path):
    (tmp_path / "queue-dry-run.jsonl").write_text('{"seq": 1, "alerts": [{"status": "firing"\nnot json\n')
    (tmp_path / "token").write_text(TOKEN)
    port = free_port()
    command = [sys.executable, "-m", "gpulens.cli", "remediate", "--backend", "slurm"]
    command += ["--web.listen-address", f"127.0.0.1:{port}", "--state-dir", str(tmp_path)]
    command += ["--token-file", str(tmp_path / "token")]
    proc = subprocess.Popen(
        command, env=path_with(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/-/healthy", timeout=WAIT_S, proc=proc)
        handled = deliver(base, notification(alert(instance="gpu-1:9842")))
    finally:
        proc.terminate()
        output = proc.communicate(timeout=WAIT_S)[0]
    warnings = [line for line in output.splitlines() if " level=warning " in line]
    assert len(warnings) == 1 and "queue-dry-run.jsonl line 1 is not a queued notification" in warnings[0]
    assert "moved to queue-dry-run.jsonl.corrupt" in warnings[0]
    assert (tmp_path / "queue-dry-run.jsonl.corrupt").read_text().endswith("not json\n")
    assert [a["result"] for a in handled] == ["dry_run"]
    assert proc.returncode == 0


def test_a_full_queue_answers_503_until_there_is_room_again():
    isolator = FakeIsolator(hold=("gpu-1", "gpu-2"))
    queue = NotificationQueue(limits=QueueLimits(max_entries=2))
    with receiver(isolator, dry_run=False, queue=queue) as (base, _):
        try:
            answers = [post(f"{base}/alerts", notification(alert(instance=f"gpu-{i}:1")))[0] for i in (1, 2)]
            refused = post(f"{base}/alerts", notification(alert(instance="gpu-3:1")))
        finally:
            isolator.release.set()
        wait_drained(base)
        again = post(f"{base}/alerts", notification(alert(instance="gpu-3:1")))[0]
    assert answers == [200, 200]
    assert refused == (503, "queue full: 2 notifications waiting (at most 2); retry later\n")
    assert again == 200


def test_a_notification_larger_than_the_queue_s_bytes_answers_503():
    queue = NotificationQueue(limits=QueueLimits(max_bytes=100))
    with receiver(FakeIsolator(), queue=queue) as (base, _):
        status, body = post(f"{base}/alerts", notification(alert(instance="gpu-1:1")))
        queued = state(base)["queue"]
    assert status == 503
    assert body.startswith("queue full: 0 bytes of notifications waiting, this one ")
    assert body.endswith(" (at most 100); retry later\n") and body.count("\n") == 1
    assert queued["pending"] == 0


def test_a_hung_node_does_not_delay_another_node_s_notification():
    isolator = FakeIsolator(hold=("hung",))
    with receiver(isolator, dry_run=False) as (base, _):
        try:
            assert post(f"{base}/alerts", notification(alert(instance="hung:1")))[0] == 200
            assert isolator.entered.wait(WAIT_S)
            assert post(f"{base}/alerts", notification(alert(instance="fine:1")))[0] == 200
            fine = wait_actions(base, "fine")
            hung_still_held = not isolator.release.is_set()
        finally:
            isolator.release.set()
        hung = wait_actions(base, "hung")
    assert [a["result"] for a in fine] == ["applied"]
    assert hung_still_held
    assert [a["result"] for a in hung] == ["applied"]


def test_one_node_s_notifications_are_acted_on_in_the_order_they_came():
    """While node a's first notification hangs, b's is handled and a's second waits behind a's first."""
    queue = NotificationQueue()
    release, b_handled = threading.Event(), threading.Event()
    calls: list[str] = []

    def handle(alerts: list[Alert]) -> None:
        (one,) = alerts
        calls.append(one.name)
        if one.name == "first-a":
            release.wait(WAIT_S)
        if one.name == "b":
            b_handled.set()

    dispatcher = Dispatcher(queue, handle, node_of)
    dispatcher.start()
    try:
        for name, node in (("first-a", "a"), ("second-a", "a"), ("b", "b")):
            queue.put(_alerts(alert(alertname=name, instance=f"{node}:1")))
        assert b_handled.wait(WAIT_S)
        while_a_hangs = list(calls)
        release.set()
        assert queue.drain(WAIT_S)
    finally:
        release.set()
        dispatcher.stop(WAIT_S)
    assert while_a_hangs == ["first-a", "b"]
    assert calls == ["first-a", "b", "second-a"]


def test_a_notification_acted_on_again_after_a_crash_is_a_duplicate(tmp_path):
    first = _remediator(FakeIsolator(), tmp_path)
    first.submit(_alerts(alert(instance="gpu-1:9842")))
    acknowledged = tmp_path / "acknowledged.jsonl"
    shutil.copy(tmp_path / "queue.jsonl", acknowledged)
    assert _acted_on(first) == [("gpu-1", "applied")]
    # killed after acting, before the notification was marked done: it is still in the queue
    shutil.copy(acknowledged, tmp_path / "queue.jsonl")
    (tmp_path / "queue.jsonl.done").unlink()
    isolator = FakeIsolator()
    again = _remediator(isolator, tmp_path)
    assert again.queue.recovered == 1
    assert _acted_on(again) == [("gpu-1", "duplicate")]
    assert isolator.calls == []


def test_a_receiver_without_a_state_dir_says_its_queue_is_in_memory(tmp_path):
    (tmp_path / "token").write_text(TOKEN)
    port = free_port()
    command = [sys.executable, "-m", "gpulens.cli", "remediate", "--backend", "slurm", "--apply"]
    command += ["--web.listen-address", f"127.0.0.1:{port}", "--token-file", str(tmp_path / "token")]
    proc = subprocess.Popen(
        command, env=path_with(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/-/healthy", timeout=WAIT_S, proc=proc)
    finally:
        proc.terminate()
        output = proc.communicate(timeout=WAIT_S)[0]
    (line,) = [line for line in output.splitlines() if "notification queue" in line]
    assert " level=warning " in line and "kept in memory only" in line and "(pass --state-dir)" in line


def test_sigterm_lets_the_action_in_progress_end_and_leaves_the_rest_queued_for_the_next_start(tmp_path):
    bin_dir, record = write_fake_scontrol(tmp_path, delay_s=1)  # each scontrol call takes a second
    (tmp_path / "token").write_text(TOKEN)
    state_dir = tmp_path / "state"
    state_dir.mkdir()

    def start() -> tuple[subprocess.Popen, str]:
        port = free_port()
        command = [sys.executable, "-m", "gpulens.cli", "remediate", "--backend", "slurm", "--apply"]
        command += ["--web.listen-address", f"127.0.0.1:{port}", "--state-dir", str(state_dir)]
        command += ["--token-file", str(tmp_path / "token")]
        proc = subprocess.Popen(
            command, env=path_with(bin_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        wait_http(f"http://127.0.0.1:{port}/-/healthy", timeout=WAIT_S, proc=proc)
        return proc, f"http://127.0.0.1:{port}"

    names = ("GPULost", "GPUXidFallenOffBus", "GPUCountDropped")  # one node: acted on one after another
    proc, base = start()
    try:
        for name in names:
            assert (
                post(f"{base}/alerts", notification(alert(alertname=name, instance="gpu-1:9842")))[0] == 200
            )
    finally:
        proc.terminate()
        first_exit = proc.wait(timeout=WAIT_S)
    drained_before_exit = len(scontrol_updates(record))
    proc, base = start()
    try:
        after = wait_drained(base)
    finally:
        proc.terminate()
        output = proc.communicate(timeout=WAIT_S)[0]
    left = len(names) - drained_before_exit
    assert first_exit == 0
    assert 1 <= drained_before_exit < len(names), "the action in progress ended, the rest stayed queued"
    assert f"{left} notification(s) acknowledged by the last run queued again" in output
    assert [a["result"] for a in after["actions"]] == ["applied"] * left
    assert len(scontrol_updates(record)) == len(names), "each alert drained the node exactly once"
