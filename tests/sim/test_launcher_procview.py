"""The process view: psutil sees the simulated node's processes as host processes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpulens.sim._site.procview import ProcView, simulated_processes
from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import ScenarioNode, build_node
from gpulens.sim.scenariofile import load_scenario
from tests.sim.test_launcher import gpulens


@pytest.fixture(name="view")
def _view(tmp_path: Path) -> Iterator[tuple[ScenarioNode, ProcView]]:
    clock = ManualClock(time.time())
    node = build_node(load_scenario("dgx-h100"), seed=1, clock=clock, procfs_root=tmp_path / "engine")
    view = ProcView(tmp_path / "view", node, tmp_path / "engine")
    view.refresh()
    previous = psutil.PROCFS_PATH
    psutil.PROCFS_PATH = str(view.root)
    try:
        yield node, view
    finally:
        psutil.PROCFS_PATH = previous
        node.close()


def test_a_simulated_process_has_command_user_and_start_time(view) -> None:
    node, view_ = view
    proc = simulated_processes(node)[213101]
    host = psutil.Process(213101)
    assert host.cmdline()[:2] == ["python", "pretrain.py"]
    assert host.uids().real > 0
    # a process cannot predate the host's boot: earlier scenario starts show as the boot time
    assert host.create_time() == pytest.approx(max(proc.start_time, view_.boot), abs=1.0)
    assert host.memory_info().rss > 0


def test_real_processes_and_system_files_are_still_there(view) -> None:
    assert psutil.Process(os.getpid()).cmdline() == psutil.Process().cmdline() != []
    assert psutil.virtual_memory().total > 0
    assert psutil.boot_time() > 0


def test_pids_lists_real_and_simulated_processes(view) -> None:
    pids = set(psutil.pids())
    assert {213101, os.getpid()} <= pids


def test_an_ended_process_leaves_the_view(view) -> None:
    node, view_ = view
    node.remove_process(213101)
    node.clock.advance(1)
    view_.refresh()
    entry = view_.root / "213101"
    # gone, or (should the host have a real process with that pid) the mirror of the real one
    assert not entry.exists() or os.readlink(entry) == "/proc/213101"


def test_real_processes_are_mirrored_as_links(view) -> None:
    _, view_ = view
    entry = view_.root / str(os.getpid())
    assert entry.is_symlink()
    assert os.readlink(entry) == f"/proc/{os.getpid()}"


def test_run_shows_simulated_processes_to_psutil_by_default() -> None:
    code = "import psutil; print(psutil.Process(213101).cmdline()[1])"
    result = gpulens("sim", "run", "dgx-h100", "--", sys.executable, "-c", code)
    assert result.stdout == "pretrain.py\n", result.stderr


def test_no_procview_leaves_psutil_on_the_real_proc() -> None:
    code = "import psutil; print(psutil.PROCFS_PATH)"
    result = gpulens("sim", "run", "dgx-h100", "--no-procview", "--", sys.executable, "-c", code)
    assert result.stdout == "/proc\n"
