"""The exporter speaks about its job attribution (issue 17): a missed deadline is logged once per
outage with the mapping directory's size, the mapping directory's own series say what it holds,
and a directory of 100,000 files neither fails the jobs collector nor the other metrics."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulens.exporter.app import Exporter
from gpulens.exporter.snapshot import NodeSnapshot
from tests.exporter.conftest import make_exporter
from tests.exporter.expo import samples, value
from tests.sim.static_node import StaticNode


def text_of(exporter: Exporter) -> str:
    return exporter.render(exporter.sample_once()).text.decode()


def late_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "did not finish within" in r.getMessage()]


@pytest.fixture
def mapping(tmp_path: Path) -> Path:
    directory = tmp_path / "mapping"
    directory.mkdir()
    return directory


@pytest.fixture
def mapped(node: StaticNode, mapping: Path) -> Iterator[Exporter]:
    ex = make_exporter(node, job_mapping_dir=mapping)
    try:
        yield ex
    finally:
        ex.close()


def test_a_missed_deadline_is_logged_once_per_outage_with_the_directory_size(
    mapped: Exporter, mapping: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for gpu in range(3):
        (mapping / str(gpu)).write_text(f"{gpu}00\n")
    fast = mapped.sampler.attribute
    assert fast is not None
    mapped.sample_once()
    deadline = mapped.config.read_deadline()

    def slow(snapshot: NodeSnapshot) -> tuple[Any, ...]:
        time.sleep(deadline * 1.5)
        return fast(snapshot)

    with caplog.at_level(logging.INFO):
        mapped.sampler.attribute = slow
        for _ in range(3):  # late, then still running (the worker is busy), then late again
            mapped.sample_once()
        time.sleep(deadline * 2)
        mapped.sampler.attribute = fast
        recovered = mapped.sample_once()
        mapped.sampler.attribute = slow
        mapped.sample_once()
        time.sleep(deadline * 2)
    lines = late_lines(caplog)
    assert len(lines) == 2, lines
    assert "job mapping directory: 3 entries" in lines[0]
    assert any("within its" in r.getMessage() and "again" in r.getMessage() for r in caplog.records)
    assert recovered.areas["jobs"].success
    assert recovered.attribution is not None and recovered.attribution.deadline_misses >= 3


def test_deadline_misses_are_counted_in_the_exporters_own_series(mapped: Exporter) -> None:
    fast = mapped.sampler.attribute
    assert fast is not None
    deadline = mapped.config.read_deadline()
    assert value(text_of(mapped), "gpulens_attribution_deadline_misses_total") == 0

    def slow(snapshot: NodeSnapshot) -> tuple[Any, ...]:
        time.sleep(deadline * 1.5)
        return fast(snapshot)

    mapped.sampler.attribute = slow
    text = text_of(mapped)
    time.sleep(deadline)
    assert value(text, "gpulens_attribution_deadline_misses_total") == 1
    assert value(text, "gpulens_collector_success", collector="jobs") == 0


def test_the_mapping_directory_series_count_files_by_state_and_rejections_by_reason(
    mapped: Exporter, mapping: Path
) -> None:
    (mapping / "0").write_text("1234\n")
    (mapping / "1").write_text("# between jobs\n")
    (mapping / "2").write_text("not a job line\n")
    (mapping / "3").write_bytes(b"\x00\x01")
    (mapping / "notes.txt").write_text("hello")
    text = text_of(mapped)
    files = {s.labels["state"]: s.value for s in samples(text, "gpulens_job_mapping_files")}
    assert files == {"used": 1, "empty": 1, "rejected": 2, "ignored": 1, "pending": 0}
    rejected = {s.labels["reason"]: s.value for s in samples(text, "gpulens_job_mapping_rejected_total")}
    assert rejected["malformed"] == 1 and rejected["binary"] == 1 and sum(rejected.values()) == 2
    assert value(text, "gpulens_job_mapping_reads_total") == 4
    assert value(text, "gpulens_job_mapping_files_max") == 10_000
    assert value(text, "gpulens_job_mapping_refresh_duration_seconds") is not None


def test_the_mapping_series_labels_stay_fixed_whatever_the_directory_holds(
    mapped: Exporter, mapping: Path
) -> None:
    for i in range(200):
        (mapping / f"junk-{i}").write_text("x")
        (mapping / str(i)).write_bytes(os.urandom(8) + b"\x00")
    text = text_of(mapped)
    assert len(samples(text, "gpulens_job_mapping_files")) == 5
    assert len(samples(text, "gpulens_job_mapping_rejected_total")) == 7


def test_without_a_mapping_directory_there_are_no_mapping_series(exporter: Exporter) -> None:
    text = text_of(exporter)
    assert not samples(text, "gpulens_job_mapping_files")
    assert value(text, "gpulens_attribution_deadline_misses_total") == 0


@pytest.fixture(scope="module")
def huge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("huge") / "mapping"
    directory.mkdir()
    for i in range(100_000):
        fd = os.open(directory / f"GPU-{i:08d}", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"4242 1000\n")
        os.close(fd)
    return directory


@pytest.mark.slow
def test_100000_files_past_the_default_limit_give_one_line_and_every_other_metric(
    node: StaticNode, huge: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ex = make_exporter(node, job_mapping_dir=huge, interval=5.0, nvml_timeout=2.0)
    try:
        with caplog.at_level(logging.WARNING):
            texts = [text_of(ex) for _ in range(3)]
    finally:
        ex.close()
    [line] = [r.getMessage() for r in caplog.records if "--job-mapping-max-files" in r.getMessage()]
    assert "more than 10000 entries" in line
    assert not late_lines(caplog)
    for text in texts:
        assert value(text, "gpulens_collector_success", collector="jobs") == 1
        assert value(text, "gpu_up", gpu="0") == 1
    assert sum(s.value for s in samples(texts[-1], "gpulens_job_mapping_files")) == 10_000


@pytest.mark.slow
def test_100000_files_within_a_raised_limit_are_all_read_over_a_few_samples(
    node: StaticNode, huge: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ex = make_exporter(
        node, job_mapping_dir=huge, job_mapping_max_files=100_000, interval=5.0, nvml_timeout=2.0
    )
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(100):
                text = text_of(ex)
                if value(text, "gpulens_job_mapping_files", state="pending") == 0:
                    break
            time.sleep(ex.config.read_deadline())  # the sample that read the last ones may still run
            final = text_of(ex)
    finally:
        ex.close()
    assert value(final, "gpulens_job_mapping_files", state="used") == 100_000
    assert value(final, "gpulens_collector_success", collector="jobs") == 1
    assert value(final, "gpu_up", gpu="0") == 1
    assert not any("--job-mapping-max-files" in r.getMessage() for r in caplog.records)
