"""Every way out of a simulator process removes what it made (issue 17 item 9).

SIGTERM, SIGHUP and SIGINT, sent to the real processes: `gpulens-exporter --simulate` (its node's
temporary directory), `gpulens sim run` (its site directory, after the program it runs was given
the same signal) and `gpulens simulate` (its node's directory and the half-built history beside
`--out`, while the previous history stays whole).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpulens import atomicfile
from gpulens.analyzer.history import read_history, write_history
from tests.analyzer import synth
from tests.support.procs import free_port, wait_http

pytestmark = pytest.mark.slow

GPULENS = [sys.executable, "-m", "gpulens.cli"]
SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]


def default_signals() -> None:
    """In the child: the signals' default dispositions, whatever the test runner ignores (a runner
    started under nohup ignores SIGHUP, and an ignored signal is inherited across exec)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def wait_for(
    found: Callable[[], object],
    what: str,
    proc: subprocess.Popen[bytes] | subprocess.Popen[str],
    timeout: float = 60,
) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) before {what}")
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout} s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: signal.Signals(s).name)
def test_the_exporter_removes_the_simulator_directory_on_a_signal(tmp_path: Path, sig: int) -> None:
    port = free_port()
    proc = subprocess.Popen[bytes](
        [
            sys.executable,
            "-m",
            "gpulens.exporter.cli",
            "--simulate",
            "seed-case",
            "--web.listen-address",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        preexec_fn=default_signals,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=60, proc=proc)
        assert len(list(tmp_path.glob("gpulens-sim-*"))) == 1
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert list(tmp_path.glob("gpulens-sim-*")) == []


# the child prints the simulator's files it was handed (site directory; the native driver's
# published node), then waits to be signalled
CHILD = (
    "import os, sys, time; print(os.environ['PYTHONPATH'].split(os.pathsep)[0], flush=True); "
    "print(os.environ.get('GPULENS_SIM_SHM', ''), flush=True); time.sleep(120)"
)


@pytest.mark.parametrize("driver", ["python", "native"])
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_sim_run_passes_the_signal_on_and_removes_its_files(tmp_path: Path, sig: int, driver: str) -> None:
    if driver == "native":
        from gpulens.sim.native.build import NativeBuildError, library_dir

        try:
            library_dir()
        except NativeBuildError as error:
            pytest.skip(f"native driver unavailable: {error}")
    proc = subprocess.Popen[bytes](
        [*GPULENS, "sim", "run", "seed-case", "--driver", driver, "--", sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=default_signals,
    )
    try:
        assert proc.stdout is not None
        site = Path(proc.stdout.readline().strip())
        published = proc.stdout.readline().strip()
        made = [site, *([Path(published)] if published else [])]
        assert site.name.startswith("gpulens-sim-") and all(path.exists() for path in made)
        assert bool(published) == (driver == "native")
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 128 + sig  # the program died of the signal passed on (Python re-raises SIGINT)
    assert [path for path in made if path.exists()] == []


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_simulate_leaves_the_previous_history_and_nothing_else(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "out" / "history"
    write_history(out, synth.frame(synth.seed_case(4)), {"source": "previous", "step_s": 60.0})
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen[bytes](
        [*GPULENS, "simulate", "seed-case", "--duration", "60d", "--step", "60s", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
        preexec_fn=default_signals,
    )
    try:
        wait_for(
            lambda: list(out.parent.glob(f".history{atomicfile.TEMP_MARK}*")), "history being built", proc
        )
        assert list(tmp.glob("gpulens-simulate-*"))
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 128 + sig
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    assert list(tmp.iterdir()) == []
    assert sorted(p.name for p in out.parent.iterdir()) == ["history"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert read_history(out).meta["source"] == "previous"


# a command's shape: install the handlers, then Ctrl-C lands inside code run from a string (what
# a lazy import's @dataclass does), is caught, and the command chooses its status
CTRL_C_IN_EXEC = """\
import sys
from gpulens import exits
exits.install()
try:
    exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(1000):\\n    pass")
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_ctrl_c_inside_code_run_from_a_string_still_exits_130_under_python_m(tmp_path: Path) -> None:
    (tmp_path / "ctrl_c_probe.py").write_text(CTRL_C_IN_EXEC)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "ctrl_c_probe"],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": path},
        preexec_fn=default_signals,
        timeout=60,
    )
    assert proc.returncode == 130, proc.stderr
