"""Atomic writes (issue 17 item 7): a history, a report or a textfile is replaced whole or not at all.

The disk fills at an arbitrary byte (fault injection at `gpulens.atomicfile._create`, the one place
every output file is created, so the budget is shared by all files of a write as on a real disk),
or for real in a subprocess under RLIMIT_FSIZE (the kernel refuses writes past N bytes with EFBIG:
the same path a full disk takes through every layer, pyarrow's included). Afterwards the previous
output is byte-identical, nothing 0-byte or temporary is left, and the error is one line naming
the file and the cause.
"""

from __future__ import annotations

import errno
import io
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens import atomicfile
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import HistoryWriter, read_history, write_history
from gpulens.analyzer.importers import import_trace
from gpulens.analyzer.pipeline import analyze_history
from gpulens.analyzer.publish import write_textfile
from gpulens.analyzer.report import write_report
from gpulens.analyzer.thresholds import load_thresholds
from tests.analyzer import synth

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ENOSPC = os.strerror(errno.ENOSPC)


class FullDisk:
    """A disk with `budget` bytes free for every file created through `atomicfile._create`."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.written = 0

    def create(self, path: Path) -> BinaryIO:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        return _Limited(os.fdopen(fd, "wb"), self)  # type: ignore[return-value]


class _Limited(io.RawIOBase):
    def __init__(self, handle: BinaryIO, disk: FullDisk) -> None:
        self.handle, self.disk = handle, disk

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        data = bytes(data)
        left = None if self.disk.budget is None else self.disk.budget - self.disk.written
        if left is not None and len(data) > left:
            self.handle.write(data[: max(left, 0)])  # what fitted, as a real short write
            self.disk.written += max(left, 0)
            raise OSError(errno.ENOSPC, ENOSPC)
        self.disk.written += len(data)
        return self.handle.write(data)

    def fileno(self) -> int:
        return self.handle.fileno()

    def flush(self) -> None:
        self.handle.flush()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.handle.close()


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Callable[[int | None], FullDisk]:
    def install(budget: int | None) -> FullDisk:
        full = FullDisk(budget)
        monkeypatch.setattr(atomicfile, "_create", full.create)
        return full

    return install


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` (relative name -> content)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    """Temporary or empty files anywhere under `parent`."""
    found = [str(p) for p in parent.rglob("*") if atomicfile.TEMP_MARK in p.name]
    return found + [str(p) for p in parent.rglob("*") if p.is_file() and p.stat().st_size == 0]


def pods_trace(src: Path, pods: int, seed: int) -> Path:
    """A small alibaba-gpu-v2023 pod list (the columns the importer reads)."""
    src.mkdir(parents=True, exist_ok=True)
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time"]
    for i in range(pods):
        gpus, milli, start = 1 + i % 2, 250 * (1 + i % 4), 60 * i
        rows.append(f"pod-{seed}-{i},1000,4096,{gpus},{milli},,LS,Running,{start},{start + 3600 + seed}")
    (src / "openb_pod_list_default.csv").write_text("\n".join(rows) + "\n")
    return src


@pytest.fixture
def old_history(tmp_path: Path) -> Path:
    out = tmp_path / "out" / "history"
    import_trace("alibaba-gpu-v2023", pods_trace(tmp_path / "old", 40, seed=1), out, None)
    return out


def one_line(message: str) -> str:
    assert "\n" not in message, message
    return message


def test_reimport_replaces_the_history_as_a_unit(tmp_path: Path, old_history: Path) -> None:
    before = tree(old_history)
    import_trace("alibaba-gpu-v2023", pods_trace(tmp_path / "new", 70, seed=2), old_history, None)
    after = read_history(old_history)
    assert after.meta["trace"]["pods"] == 70
    assert tree(old_history).keys() == before.keys()
    assert leftovers(tmp_path / "out") == []


@FUZZ
@given(fraction=st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
def test_a_full_disk_at_any_byte_keeps_the_previous_history(
    tmp_path: Path, old_history: Path, disk: Callable[[int | None], FullDisk], bad_input: Any, fraction: float
) -> None:
    src = pods_trace(tmp_path / "new", 70, seed=2)
    before = tree(old_history)
    needed = disk(None)
    scratch = tmp_path / "scratch" / f"h{int(fraction * 1e9)}"
    import_trace("alibaba-gpu-v2023", src, scratch, None)  # how many bytes the new history takes
    disk(int(needed.written * fraction))
    with pytest.raises(AnalyzerError) as failed:
        import_trace("alibaba-gpu-v2023", src, old_history, None)
    bad_input("atomic write: full disk (history)")
    message = one_line(str(failed.value))
    assert message.startswith(str(old_history) + "/") and message.endswith(f"cannot write: {ENOSPC}")
    assert tree(old_history) == before
    assert leftovers(tmp_path / "out") == []


def test_a_failed_swap_keeps_the_previous_history(
    tmp_path: Path, old_history: Path, monkeypatch: pytest.MonkeyPatch, bad_input: Any
) -> None:
    def broken(a: Path, b: Path) -> bool:
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(b))

    monkeypatch.setattr(atomicfile, "_exchange", broken)
    before = tree(old_history)
    with pytest.raises(AnalyzerError, match=f"^{old_history}: cannot write: {os.strerror(errno.EIO)}$"):
        import_trace("alibaba-gpu-v2023", pods_trace(tmp_path / "new", 70, seed=2), old_history, None)
    bad_input("atomic write: failed rename (history)")
    assert tree(old_history) == before
    assert leftovers(tmp_path / "out") == []


def test_without_an_exchange_the_history_is_still_replaced(
    tmp_path: Path, old_history: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(atomicfile, "_exchange", lambda a, b: False)  # a filesystem without it
    import_trace("alibaba-gpu-v2023", pods_trace(tmp_path / "new", 70, seed=2), old_history, None)
    assert read_history(old_history).meta["trace"]["pods"] == 70
    assert leftovers(tmp_path / "out") == []


def test_an_exception_while_writing_keeps_the_previous_history(tmp_path: Path, old_history: Path) -> None:
    before = tree(old_history)
    with pytest.raises(KeyboardInterrupt), HistoryWriter(old_history, {"step_s": 60.0}) as writer:
        for k in range(10):
            writer.add(1000.0 + k, "gpu_utilization_ratio", 0.5, {"uuid": "GPU-0"})
        raise KeyboardInterrupt  # Ctrl-C in the middle of `gpulens simulate`
    assert tree(old_history) == before
    assert leftovers(tmp_path / "out") == []


def test_a_directory_holding_other_files_is_refused_not_replaced(tmp_path: Path, bad_input: Any) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("keep me")
    with pytest.raises(AnalyzerError) as failed:
        write_history(home, synth.frame(synth.seed_case(3)), {"step_s": 60.0})
    bad_input("atomic write: --out holds other files")
    assert "notes.txt" in one_line(str(failed.value))
    assert tree(home) == {"notes.txt": b"keep me"}
    assert leftovers(tmp_path) == []


def test_a_mount_point_is_refused_with_a_directory_inside_suggested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad_input: Any
) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == volume)
    with pytest.raises(AnalyzerError) as failed:
        write_history(volume, synth.frame(synth.seed_case(3)), {"step_s": 60.0})
    bad_input("atomic write: --out is a mount point")
    assert "is a mount point" in one_line(str(failed.value)) and f"{volume}/history" in str(failed.value)
    assert list(volume.iterdir()) == [] and leftovers(tmp_path) == []


def test_an_empty_directory_becomes_the_history_with_its_permissions(tmp_path: Path) -> None:
    out = tmp_path / "h"
    out.mkdir(mode=0o750)
    out.chmod(0o750)
    write_history(out, synth.frame(synth.seed_case(3)), {"step_s": 60.0})
    assert read_history(out).meta["samples"] > 0
    assert out.stat().st_mode & 0o777 == 0o750


@pytest.fixture(scope="module")
def analysis(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("seed") / "h"
    write_history(path, synth.frame(synth.seed_case(30)), {"source": "test", "step_s": synth.STEP})
    return analyze_history(read_history(path), load_thresholds())


@pytest.mark.parametrize("budget", [0, 1, 5_000, 60_000, -1])
def test_a_full_disk_keeps_the_previous_report(
    tmp_path: Path, analysis: Any, disk: Callable[[int | None], FullDisk], bad_input: Any, budget: int
) -> None:
    out = tmp_path / "report"
    needed = disk(None)
    write_report(analysis, out)
    (out / "README").write_text("not the report's")
    before = tree(out)
    disk(needed.written - 1 if budget < 0 else budget)
    with pytest.raises(AnalyzerError) as failed:
        write_report(analysis, out)
    bad_input("atomic write: full disk (report)")
    message = one_line(str(failed.value))
    assert message.startswith(str(out) + "/") and message.endswith(f"cannot write: {ENOSPC}")
    assert tree(out) == before
    assert leftovers(tmp_path) == []


def test_a_full_disk_keeps_the_previous_textfile(
    tmp_path: Path, analysis: Any, disk: Callable[[int | None], FullDisk], bad_input: Any
) -> None:
    target = tmp_path / "gpulens.prom"
    write_textfile(analysis, target)
    before = target.read_bytes()
    disk(100)
    with pytest.raises(AnalyzerError, match=f"^{target}: cannot write: {ENOSPC}$"):
        write_textfile(analysis, target)
    bad_input("atomic write: full disk (textfile)")
    assert target.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_a_replaced_file_keeps_its_permissions(tmp_path: Path) -> None:
    target = tmp_path / "x.prom"
    target.write_text("old\n")
    target.chmod(0o640)
    atomicfile.write_text(target, "new\n")
    assert target.read_text() == "new\n"
    assert target.stat().st_mode & 0o777 == 0o640


# -- for real: the kernel refuses writes past RLIMIT_FSIZE bytes (EFBIG), through every layer ------


def gpulens_limited(limit: int, *argv: str) -> subprocess.CompletedProcess[str]:
    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "gpulens.cli", *argv],
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=limit_file_size,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def cli_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("gpulens: error: ")
    return lines[0]


@pytest.mark.slow
def test_reimport_on_a_full_disk_via_the_cli_keeps_the_history(
    tmp_path: Path, old_history: Path, bad_input: Any
) -> None:
    before = tree(old_history)
    src = pods_trace(tmp_path / "new", 3000, seed=2)
    result = gpulens_limited(4096, "import-trace", "alibaba-gpu-v2023", str(src), "--out", str(old_history))
    bad_input("atomic write: file size limit via the CLI")
    line = cli_error(result)
    assert f"{old_history}/" in line and os.strerror(errno.EFBIG) in line
    assert tree(old_history) == before
    assert leftovers(tmp_path / "out") == []


@pytest.mark.slow
def test_report_on_a_full_disk_via_the_cli_keeps_the_report(tmp_path: Path, bad_input: Any) -> None:
    history = tmp_path / "h"
    write_history(history, synth.frame(synth.seed_case(30)), {"source": "test", "step_s": synth.STEP})
    out = tmp_path / "report"
    first = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "report", "--history", str(history), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert first.returncode == 0, first.stderr
    before = tree(out)
    result = gpulens_limited(8192, "report", "--history", str(history), "--out", str(out))
    bad_input("atomic write: file size limit via the CLI")
    line = cli_error(result)
    assert f"{out}/" in line and os.strerror(errno.EFBIG) in line
    assert tree(out) == before
    assert leftovers(tmp_path) == []


# -- a report swapped in as a whole (issue 34 item 8) ----------------------------------------------
#
# Before: report.html, summary.md, jobs.csv, jobs.json and plan.json were renamed one by one, so a
# kill between two renames left report.html new beside old JSON files (and `.tmp-` files). Now the
# set is a version directory made current by one rename of `.report-current`; the user-facing
# paths are symlinks through it. Every rename of a report write goes through `atomicfile._rename`:
# the tests kill the writer (a forked child, `os._exit` before step k: nothing after runs, as with
# SIGKILL) or make the rename fail (EIO) at every step k, and check that every path reads the old
# report or every path the new one, and that the next run leaves nothing of the killed one.


@pytest.fixture(scope="module")
def other_analysis(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Another report: every file differs from `analysis`'s, and it emits no config/ files."""
    path = tmp_path_factory.mktemp("seed") / "h"
    write_history(path, synth.frame(synth.seed_case(5)), {"source": "test", "step_s": synth.STEP})
    return analyze_history(read_history(path), load_thresholds())


@pytest.fixture(params=["fewer files", "more files"])
def two_reports(request: pytest.FixtureRequest, analysis: Any, other_analysis: Any) -> tuple[Any, Any]:
    """(previous, next): the next report drops the config/ files, or adds them."""
    return (analysis, other_analysis) if request.param == "fewer files" else (other_analysis, analysis)


def report_texts(analysis: Any, scratch: Path) -> dict[str, str]:
    """What write_report writes (relative path -> text), read back from a scratch directory."""
    written = write_report(analysis, scratch)
    return {str(path.relative_to(scratch)): path.read_text() for path in written.values()}


def view(out: Path, names: list[str]) -> dict[str, str]:
    """The report as a reader sees it through the user-facing paths (absent paths left out)."""
    return {name: (out / name).read_text() for name in names if (out / name).is_file()}


def no_leftovers(out: Path) -> None:
    """Nothing a killed or failed write leaves: temporary names, stale versions, dangling links."""
    everything = list(out.rglob("*"))
    assert [p for p in everything if atomicfile.TEMP_MARK in p.name] == []
    versions = [
        p.name for p in out.iterdir() if p.name.startswith(".report-") and p.name != ".report-current"
    ]
    assert len(versions) <= 1, versions
    assert [p for p in everything if p.is_symlink() and not p.exists()] == []


class Steps:
    """`atomicfile._rename` counting its calls; `at` makes call number `at` fail or kill."""

    def __init__(self, at: int | None = None, kill: bool = False) -> None:
        self.at, self.kill, self.done = at, kill, 0

    def __call__(self, src: Path, dst: Path) -> None:
        self.done += 1
        if self.done == self.at:
            if self.kill:
                os._exit(0)  # killed before this step: no finally, no cleanup
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(dst))
        os.replace(src, dst)


def previous_report(out: Path, layout: str, old: dict[str, str]) -> None:
    """`out` holding the previous report as a run of `layout` left it, beside a user's file."""
    out.mkdir()
    (out / "README").write_text("not the report's")
    if layout == "swapped":  # written by this code
        atomicfile.write_set(out, old)
    elif layout == "plain files":  # written by the code before (FileSet), killed once mid-write
        for name, text in old.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
        (out / ".report.html.tmp-0badf00d").write_text("half")
        (out / ".jobs.json.tmp-0badf00d").write_text("")


LAYOUTS = ["swapped", "plain files", "none"]


def count_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, old: dict[str, Any], new: dict[str, Any]
) -> int:
    previous_report(tmp_path / "count", layout, old)
    steps = Steps()
    monkeypatch.setattr(atomicfile, "_rename", steps)
    atomicfile.write_set(tmp_path / "count", new)
    monkeypatch.undo()
    assert steps.done >= 1
    return steps.done


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_report_killed_at_any_rename_reads_whole_and_the_next_run_cleans_up(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    two_reports: tuple[Any, Any],
    bad_input: Any,
    layout: str,
) -> None:
    previous, following = two_reports
    old = report_texts(previous, tmp_path / "old")
    new = report_texts(following, tmp_path / "new")
    names = sorted(set(old) | set(new))
    assert all(old[n] != new[n] for n in set(old) & set(new)), "the two reports must differ in every file"
    before = {} if layout == "none" else view_of(old, names)
    steps = count_steps(tmp_path, monkeypatch, layout, old, new)
    for k in range(1, steps + 1):
        out = tmp_path / f"kill-{k}"
        previous_report(out, layout, old)
        monkeypatch.setattr(atomicfile, "_rename", Steps(at=k, kill=True))
        pid = os.fork()
        if pid == 0:  # the writer, killed at step k
            try:
                atomicfile.write_set(out, new)
            finally:
                os._exit(3)  # not killed: the step count was wrong
        monkeypatch.undo()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"the writer was not killed at step {k}"
        bad_input("atomic write: killed between report renames")
        seen = view(out, names)
        assert seen in (before, view_of(new, names)), f"a mix after a kill at step {k} of {steps}"
        assert (out / "README").read_text() == "not the report's"
        if k == 1:
            write_report(following, out)  # the next run
        else:  # the same, without rendering the report again
            atomicfile.write_set(out, new)
        assert_next(out, layout, old, new)
        no_leftovers(out)
        assert (out / "README").read_text() == "not the report's"


def assert_next(out: Path, layout: str, old: dict[str, str], new: dict[str, str]) -> None:
    """After the next run: the new report; a file only the old report had is gone, except plain
    files of the old layout, which are left alone as the old code left them (it never knew them)."""
    assert view(out, list(new)) == new
    gone = [name for name in old if name not in new]
    assert view(out, gone) == (view_of(old, gone) if layout == "plain files" else {})


def view_of(texts: dict[str, str], names: list[str]) -> dict[str, str]:
    return {name: texts[name] for name in names if name in texts}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_report_rename_failing_at_any_step_keeps_the_previous_report(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    two_reports: tuple[Any, Any],
    bad_input: Any,
    layout: str,
) -> None:
    previous, following = two_reports
    old = report_texts(previous, tmp_path / "old")
    new = report_texts(following, tmp_path / "new")
    names = sorted(set(old) | set(new))
    before = {} if layout == "none" else view_of(old, names)
    steps = count_steps(tmp_path, monkeypatch, layout, old, new)
    for k in range(1, steps + 1):
        out = tmp_path / f"fail-{k}"
        previous_report(out, layout, old)
        monkeypatch.setattr(atomicfile, "_rename", Steps(at=k))
        with pytest.raises((AnalyzerError, atomicfile.WriteFailed)) as failed:
            if k == 1:
                write_report(following, out)  # as `gpulens report` does
            else:  # its writer, without rendering the report again
                atomicfile.write_set(out, new)
        monkeypatch.undo()
        bad_input("atomic write: failed report rename")
        message = one_line(str(failed.value))
        assert message.startswith(f"{out}/") and message.endswith(f"cannot write: {os.strerror(errno.EIO)}")
        assert view(out, names) == before, f"not the previous report after a failure at step {k}"
        assert [p for p in out.rglob("*") if atomicfile.TEMP_MARK in p.name and "badf00d" not in p.name] == []
        atomicfile.write_set(out, new)  # the next run
        assert_next(out, layout, old, new)
        no_leftovers(out)


def test_the_report_paths_lead_through_one_current_version(tmp_path: Path, analysis: Any) -> None:
    out = tmp_path / "r"
    written = write_report(analysis, out)
    assert os.readlink(out / ".report-current").startswith(".report-")
    for path in written.values():
        rel = path.relative_to(out)
        assert path.is_symlink() and os.readlink(path).endswith(f".report-current/{rel}")
        assert path.read_text()
    write_report(analysis, out)
    no_leftovers(out)
