"""Job mapping files: dcgm-exporter and jobstats formats, and hostile files."""

import logging
import os

from hypothesis import given
from hypothesis import strategies as st

from gpulens.exporter.attribution.mapping_dir import (
    MappingEntry,
    MappingFormatError,
    MappingKey,
    parse_mapping_content,
    parse_mapping_name,
)
from tests.attribution.fakes import GPU0, GPU1, MIG_A, by_job, proc


def skipped_lines(caplog):
    return [r.getMessage() for r in caplog.records if "skipping job mapping file" in r.getMessage()]


def test_dcgm_format_file_per_gpu_index(node):
    node.mapping("0", "1234\n")
    node.mapping("1", "5678\n")
    jobs = by_job(node.attributor().attribute([proc(10, gpu=0), proc(11, gpu=1)]))
    assert jobs[(0, None, "1234")].identity.source == "mapping"
    assert (1, None, "5678") in jobs


def test_dcgm_format_mig_instance_file(node):
    node.mapping("0", "1\n")
    node.mapping("0.3", "2\n")
    jobs = by_job(node.attributor().attribute([proc(10, gi=3, mig_uuid=MIG_A), proc(11, gi=5)]))
    assert set(jobs) == {(0, 3, "2"), (0, 5, "1")}  # the instance file wins; the GPU file covers the rest


def test_jobstats_format_named_by_uuid_and_mig_uuid(node):
    node.mapping(GPU1, "777 0\n")
    node.mapping(MIG_A, "888 0\n")
    jobs = by_job(node.attributor().attribute([proc(10, gpu=1), proc(11, gpu=0, gi=1, mig_uuid=MIG_A)]))
    assert jobs[(1, None, "777")].identity.user == "root"
    assert (0, 1, "888") in jobs


def test_jobstats_format_named_by_index(node):
    node.mapping("0", "4242 0\n")
    [usage] = node.attributor().attribute([proc(10)])
    assert (usage.identity.job_id, usage.identity.user) == ("4242", "root")


def test_several_jobs_on_a_gpu_are_told_apart_by_process_uid(node):
    node.mapping("0", "100 1000\n200 2000\n")
    node.process(10, uid=1000)
    node.process(11, uid=2000)
    jobs = by_job(node.attributor().attribute([proc(10), proc(11)]))
    assert set(jobs) == {(0, None, "100"), (0, None, "200")}


def test_several_dcgm_jobs_on_a_gpu_without_uids_stay_unknown(node):
    node.mapping("0", "100\n200\n")
    [usage] = node.attributor().attribute([proc(10)])
    assert usage.identity.job_id == "unknown"


def test_process_identity_wins_over_mapping_file(node):
    node.mapping("0", "1\n")
    node.process(10, "0::/system.slice/slurmstepd.scope/job_2/step_0\n")
    [usage] = node.attributor().attribute([proc(10)])
    assert usage.identity.job_id == "2"


def test_blank_lines_and_comments_are_ignored():
    assert parse_mapping_content(b"# written by prolog\n\n  42  \n") == (MappingEntry("42"),)


def test_file_names():
    assert parse_mapping_name("3") == MappingKey(gpu=3)
    assert parse_mapping_name("3.7") == MappingKey(gpu=3, gpu_instance=7)
    assert parse_mapping_name(GPU0) == MappingKey(uuid=GPU0)
    assert parse_mapping_name("notes.txt") is None
    assert parse_mapping_name("3.") is None


def test_malformed_file_is_skipped_with_one_line_and_the_rest_still_attributed(node, caplog):
    node.mapping("0", "1234\nthis is not a job\n")
    node.mapping("1", "5678\n")
    attributor = node.attributor()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            jobs = by_job(attributor.attribute([proc(10, gpu=0), proc(11, gpu=1)]))
    assert set(jobs) == {(0, None, "unknown"), (1, None, "5678")}
    [line] = skipped_lines(caplog)
    assert str(node.mapping_dir / "0") in line and "line 2" in line


def test_huge_file_is_skipped(node, caplog):
    node.mapping("0", "1\n" * 100_000)
    node.mapping("1", "5678\n")
    with caplog.at_level(logging.WARNING):
        jobs = by_job(node.attributor().attribute([proc(10, gpu=0), proc(11, gpu=1)]))
    assert (0, None, "unknown") in jobs and (1, None, "5678") in jobs
    [line] = skipped_lines(caplog)
    assert "limit" in line and str(node.mapping_dir / "0") in line


def test_binary_file_is_skipped(node, caplog):
    node.mapping("0", b"\x7fELF\x00\x01\x02")
    node.mapping("1", b"\xff\xfe12\n")
    with caplog.at_level(logging.WARNING):
        jobs = by_job(node.attributor().attribute([proc(10, gpu=0), proc(11, gpu=1)]))
    assert set(jobs) == {(0, None, "unknown"), (1, None, "unknown")}
    lines = skipped_lines(caplog)
    assert (
        len(lines) == 2 and any("binary" in line for line in lines) and any("UTF-8" in line for line in lines)
    )


def test_symlink_out_of_the_directory_is_not_followed(node, tmp_path, caplog):
    secret = tmp_path / "secret"
    secret.write_text("666\n")
    node.mapping("1", "5678\n")
    os.symlink(secret, node.mapping_dir / "0")
    with caplog.at_level(logging.WARNING):
        jobs = by_job(node.attributor().attribute([proc(10, gpu=0), proc(11, gpu=1)]))
    assert set(jobs) == {(0, None, "unknown"), (1, None, "5678")}
    [line] = skipped_lines(caplog)
    assert "outside the mapping directory" in line


def test_symlink_inside_the_directory_is_followed(node):
    node.mapping(GPU0, "1234 0\n")
    os.symlink(node.mapping_dir / GPU0, node.mapping_dir / "0")
    node.mapping_dir.joinpath(GPU0).unlink()
    node.mapping("GPU-real", "1234 0\n")
    os.symlink(node.mapping_dir / "GPU-real", node.mapping_dir / GPU0)
    [usage] = node.attributor().attribute([proc(10)])
    assert usage.identity.job_id == "1234"


def test_fifo_does_not_block_and_is_skipped(node, caplog):
    node.mapping_dir.mkdir(parents=True)
    os.mkfifo(node.mapping_dir / "0")
    with caplog.at_level(logging.WARNING):
        [usage] = node.attributor().attribute([proc(10)])
    assert usage.identity.job_id == "unknown"
    assert "not a regular file" in skipped_lines(caplog)[0]


def test_rewritten_file_is_reread(node):
    path = node.mapping("0", "1\n")
    attributor = node.attributor()
    assert attributor.attribute([proc(10)])[0].identity.job_id == "1"
    path.write_text("22\n")
    os.utime(path, ns=(1, 1))
    assert attributor.attribute([proc(10)])[0].identity.job_id == "22"


def test_removed_file_stops_attributing(node):
    path = node.mapping("0", "1\n")
    attributor = node.attributor()
    assert attributor.attribute([proc(10)])[0].identity.job_id == "1"
    path.unlink()
    assert attributor.attribute([proc(10)])[0].identity.job_id == "unknown"


def test_missing_directory_is_logged_once(node, caplog):
    attributor = node.attributor()
    with caplog.at_level(logging.WARNING):
        attributor.attribute([proc(10)])
        attributor.attribute([proc(10)])
    assert sum("mapping directory" in r.getMessage() for r in caplog.records) == 1


_job = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)


@given(st.lists(st.tuples(_job, st.one_of(st.none(), st.integers(0, 2**31))), max_size=10))
def test_written_entries_parse_back(entries):
    text = "".join(f"{job}\n" if uid is None else f"{job} {uid}\n" for job, uid in entries)
    assert parse_mapping_content(text.encode()) == tuple(MappingEntry(job, uid) for job, uid in entries)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_either_parse_or_raise_a_format_error(data):
    try:
        entries = parse_mapping_content(data)
    except MappingFormatError as exc:
        assert str(exc)
    else:
        for entry in entries:
            assert entry.job_id.isprintable() and " " not in entry.job_id
