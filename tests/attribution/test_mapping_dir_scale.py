"""A job-mapping directory that scales and speaks (issue 17): incremental refresh, bounded logs,
rejected content never logged, a time budget per refresh and a limit on the entries read."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulens.exporter.attribution.logonce import LogOnce
from gpulens.exporter.attribution.mapping_dir import (
    REPEAT_SECONDS,
    FileState,
    MappingDirectory,
    MappingKey,
    RejectReason,
)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lines() -> Iterator[Lines]:
    logger = logging.getLogger("tests.attribution.mapping_scale")
    logger.setLevel(logging.INFO)
    handler = Lines()
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def logonce(clock: Clock | None = None, capacity: int = 256) -> LogOnce:
    logger = logging.getLogger("tests.attribution.mapping_scale")
    return LogOnce(logger, capacity=capacity, clock=clock or Clock())


def write(directory: Path, name: str, content: bytes | str, mtime_ns: int | None = None) -> Path:
    """Write like a prolog script; `mtime_ns` pins the timestamp (old enough not to be racy)."""
    path = directory / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    os.utime(path, ns=(mtime_ns or 10**18, mtime_ns or 10**18))
    return path


def many(directory: Path, count: int, name: str = "GPU-{:08d}", content: bytes = b"4242 1000\n") -> None:
    for i in range(count):
        fd = os.open(directory / name.format(i), os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, content)
        os.close(fd)


def skipped(lines: Lines) -> list[str]:
    return [line for line in lines.lines if "skipping job mapping file" in line]


def test_unchanged_files_are_not_opened_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for gpu in range(8):
        write(tmp_path, str(gpu), f"{gpu}00\n")
    mapping = MappingDirectory(tmp_path, logonce())
    mapping.refresh()
    opened: list[str] = []
    real_open = os.open

    def recording_open(path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    entries = mapping.refresh()
    assert opened == []
    assert entries[MappingKey(gpu=3)][0].job_id == "300"


def test_a_rewritten_file_is_read_again_even_with_the_same_size_and_mtime(tmp_path: Path) -> None:
    path = write(tmp_path, "0", "111\n", mtime_ns=5 * 10**17)
    mapping = MappingDirectory(tmp_path, logonce())
    assert mapping.refresh()[MappingKey(gpu=0)][0].job_id == "111"
    replacement = write(tmp_path, ".0.tmp", "222\n", mtime_ns=5 * 10**17)
    replacement.rename(path)  # what an atomic prolog does: same size, same mtime, new inode
    assert mapping.refresh()[MappingKey(gpu=0)][0].job_id == "222"


def test_a_file_read_within_a_tick_of_its_last_write_is_read_once_more(tmp_path: Path) -> None:
    path = tmp_path / "0"
    path.write_text("111\n")
    first = path.stat().st_mtime_ns
    mapping = MappingDirectory(tmp_path, logonce())
    mapping.refresh()
    reads = mapping.stats.reads
    path.write_text("222\n")  # within the same timestamp tick: same inode, size and mtime
    os.utime(path, ns=(first, first))
    assert mapping.refresh()[MappingKey(gpu=0)][0].job_id == "222"
    assert mapping.stats.reads == reads + 1


def test_deleted_files_leave_no_entries_and_no_log_keys(tmp_path: Path, lines: Lines) -> None:
    log = logonce()
    for gpu in range(50):
        write(tmp_path, str(gpu), "not a job id line\n")
    for i in range(50):
        write(tmp_path, f"junk-{i}.txt", "x")
    write(tmp_path, "GPU-keep", "7 0\n")
    mapping = MappingDirectory(tmp_path, log)
    mapping.refresh()
    assert len(log) == 100
    for path in tmp_path.iterdir():
        if path.name != "GPU-keep":
            path.unlink()
    entries = mapping.refresh()
    assert len(log) == 0
    assert list(entries) == [MappingKey(uuid="GPU-keep")]
    assert mapping.stats.files[FileState.USED] == 1 and mapping.stats.listed == 1


def test_30000_junk_names_give_a_bounded_number_of_lines_and_log_keys(tmp_path: Path, lines: Lines) -> None:
    many(tmp_path, 30_000, name="junk-{}.txt", content=b"")
    log = logonce(capacity=256)
    mapping = MappingDirectory(tmp_path, log, max_files=50_000)
    for _ in range(3):
        mapping.refresh()
    ignored = [line for line in lines.lines if "ignoring" in line]
    summaries = [line for line in lines.lines if "more job mapping files" in line]
    assert len(ignored) == 256
    assert len(summaries) == 1 and "29744 more" in summaries[0]
    assert len(log) == 256
    assert mapping.stats.files[FileState.IGNORED] == 30_000


def test_a_bad_file_that_keeps_changing_is_logged_once_and_counted_each_time(
    tmp_path: Path, lines: Lines
) -> None:
    mapping = MappingDirectory(tmp_path, logonce())
    for n in range(10):
        write(tmp_path, "0", f"bad line {n}\n" * (n + 1), mtime_ns=10**18 + n)
        mapping.refresh()
    assert len(skipped(lines)) == 1
    assert mapping.stats.rejected[RejectReason.MALFORMED] == 10
    assert mapping.stats.files[FileState.REJECTED] == 1


def test_a_file_flipping_between_bad_and_good_is_logged_once_per_repeat_window(
    tmp_path: Path, lines: Lines
) -> None:
    clock = Clock()
    mapping = MappingDirectory(tmp_path, logonce(clock))
    for n in range(6):
        write(tmp_path, "0", "bad line\n" if n % 2 == 0 else "42\n", mtime_ns=10**18 + n)
        mapping.refresh()
    assert len(skipped(lines)) == 1
    clock.now += REPEAT_SECONDS + 1
    write(tmp_path, "0", "still bad\n", mtime_ns=10**18 + 99)
    mapping.refresh()
    assert len(skipped(lines)) == 2


def test_rejected_content_is_never_logged(tmp_path: Path, lines: Lines) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root password is hunter2\n")
    directory = tmp_path / "map"
    directory.mkdir()
    os.link(secret, directory / "0")  # a hard link stays inside the directory
    write(directory, "1", b"token=hunter2\xff\xfe\n")
    write(directory, "2", b"hunter2\x00binary\n")
    MappingDirectory(directory, logonce()).refresh()
    assert len(skipped(lines)) == 3
    assert not any("hunter2" in line or "password" in line for line in lines.lines)
    first = next(
        line
        for line in skipped(lines)
        if line.startswith(f"attribution: skipping job mapping file {directory}/0")
    )
    assert "(25 bytes)" in first and "malformed" in first


def test_control_characters_in_a_name_do_not_forge_log_lines(tmp_path: Path, lines: Lines) -> None:
    write(tmp_path, "x\nlevel=error msg=forged", "")
    MappingDirectory(tmp_path, logonce()).refresh()
    assert all("\n" not in line for line in lines.lines)
    assert any("x\\nlevel=error" in line for line in lines.lines)


def test_past_max_files_one_line_names_the_flag_and_the_rest_is_used(tmp_path: Path, lines: Lines) -> None:
    many(tmp_path, 20, name="{}")
    mapping = MappingDirectory(tmp_path, logonce(), max_files=10)
    for _ in range(3):
        entries = mapping.refresh()
    [line] = [line for line in lines.lines if "--job-mapping-max-files" in line]
    assert "more than 10 entries" in line
    assert len(entries) == 10
    assert mapping.stats.truncated and mapping.stats.listed == 10


def test_a_refresh_stops_at_its_budget_and_the_next_ones_go_on(tmp_path: Path) -> None:
    many(tmp_path, 2000)
    mapping = MappingDirectory(tmp_path, logonce(), budget=0.0)  # only the minimum per refresh
    mapping.refresh()
    first = mapping.stats.files
    assert first[FileState.USED] < 2000 and first[FileState.PENDING] == 2000 - first[FileState.USED]
    refreshes = 1
    while mapping.stats.files[FileState.PENDING]:
        mapping.refresh()
        refreshes += 1
        assert refreshes < 2000
    assert len(mapping.entries) == 2000


def test_a_change_is_found_by_the_round_robin_when_the_budget_is_small(tmp_path: Path) -> None:
    many(tmp_path, 1000)
    mapping = MappingDirectory(tmp_path, logonce(), budget=0.0)
    while mapping.stats.files.get(FileState.PENDING, 1):
        mapping.refresh()
    write(tmp_path, "GPU-00000999", "777 0\n")
    for _ in range(1000 // 64 + 1):
        entries = mapping.refresh()
    assert entries[MappingKey(uuid="GPU-00000999")][0].job_id == "777"


@pytest.mark.slow
def test_100000_files_are_all_read_and_then_refreshed_without_reading(tmp_path: Path) -> None:
    many(tmp_path, 100_000)
    mapping = MappingDirectory(tmp_path, logonce(), max_files=100_000, budget=0.25)
    mapping.refresh()
    assert mapping.stats.files[FileState.PENDING] > 0  # spread over several refreshes
    for _ in range(200):
        if not mapping.stats.files[FileState.PENDING]:
            break
        mapping.refresh()
    assert mapping.stats.files[FileState.USED] == 100_000
    reads = mapping.stats.reads
    mapping.refresh()
    assert mapping.stats.reads == reads
    assert len(mapping.entries) == 100_000


def test_a_directory_full_of_junk_does_not_mute_the_attributors_other_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gpulens.exporter.attribution import AttributionConfig, Attributor, ProcessRef
    from gpulens.exporter.attribution.model import ProcessKind

    directory = tmp_path / "mapping"
    directory.mkdir()
    many(directory, 1000, name="junk-{}", content=b"")
    config = AttributionConfig(
        procfs_root=tmp_path, job_mapping_dir=directory, pod_resources_socket=None, enable_procfs=False
    )
    attributor = Attributor(config, logger=logging.getLogger("tests.attribution.crowded"))
    process = ProcessRef(
        pid=1,
        gpu=0,
        uuid="GPU-x",
        gpu_instance=None,
        mig_uuid=None,
        kind=ProcessKind.COMPUTE,
        used_memory_bytes=None,
        sm_util_ratio=None,
    )
    with caplog.at_level(logging.INFO, logger="tests.attribution.crowded"):
        attributor.attribute([process])
    assert any("NVML reports no used memory" in r.getMessage() for r in caplog.records)
