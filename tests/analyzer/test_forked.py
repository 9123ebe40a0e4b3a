"""A pure call in a forked child: its value comes back, and where a fork is not safe or the
child fails the parent computes it itself."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from gpulens.analyzer import forked, packing
from tests.analyzer import synth
from tests.analyzer.test_plan_emit import plan_for


@pytest.fixture
def alone(monkeypatch):
    """This thread taken as the only one: earlier tests of the suite leave daemon threads (servers)
    behind, which make `start` run calls here (tested below) instead of forking."""
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)


def test_the_childs_value_comes_back(alone):
    parent = os.getpid()
    pending = forked.start(lambda: (os.getpid(), [1.5, {"a": (2, None)}]))
    assert pending.pid
    child, value = pending.result()
    assert child != parent and value == [1.5, {"a": (2, None)}]


def test_with_another_thread_running_the_call_is_made_here():
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        pending = forked.start(os.getpid)
    finally:
        stop.set()
        other.join()
    assert pending.pid == 0 and pending.result() == os.getpid()


def test_a_call_that_fails_in_the_child_raises_here_with_its_own_error(alone):
    def fails() -> None:
        raise ValueError("no fit")

    with pytest.raises(ValueError, match="no fit"):
        forked.start(fails).result()


def test_an_answer_that_cannot_be_pickled_is_computed_here(alone):
    parent = os.getpid()
    value = forked.start(lambda: (os.getpid(), lambda: None)).result()
    assert value[0] == parent


def test_a_child_whose_answer_is_not_taken_is_stopped(alone):
    with forked.start(lambda: time.sleep(60)) as pending:
        child = pending.pid
        assert child
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)  # stopped and reaped
    assert pending.fd == -1


def test_the_answer_comes_back_where_children_are_reaped_by_the_system(alone):
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # as some host programs set it
    try:
        assert forked.start(lambda: [1, 2]).result() == [1, 2]
    finally:
        signal.signal(signal.SIGCHLD, previous)


def test_not_forking_when_told_not_to():
    assert forked.start(os.getpid, fork=False).result() == os.getpid()


def test_a_plan_packed_in_a_child_is_the_plan_packed_here(th, monkeypatch, alone):
    jobs = synth.seed_case()
    _, here = plan_for(jobs, th)
    monkeypatch.setattr(packing, "FORK_MIN_ITEMS", 0)
    _, beside = plan_for(jobs, th)
    assert beside.as_dict() == here.as_dict()
