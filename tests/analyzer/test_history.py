"""The history format: round trip, OpenMetrics that promtool accepts, clear errors."""

from __future__ import annotations

import json
import math
import subprocess

import pandas as pd
import pytest

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import format_value, read_history, write_history
from tests.analyzer import synth
from tests.support.procs import find_binary


def test_round_trip_keeps_samples_and_meta(tmp_path):
    frame = synth.frame(synth.seed_case(5))
    write_history(tmp_path / "h", frame, {"source": "test", "step_s": 60.0})
    history = read_history(tmp_path / "h")
    assert len(history.samples) == len(frame)
    assert history.step_s == 60.0
    assert history.meta["format"] == "gpulens-history"
    assert set(history.meta["families"]) == set(frame["metric"])
    assert history.meta["start"] == frame["timestamp"].min()


def test_openmetrics_is_grouped_by_family_and_ends_with_eof(tmp_path):
    write_history(tmp_path / "h", synth.frame(synth.seed_case(3)), {"step_s": 60.0})
    text = (tmp_path / "h" / "metrics.om").read_text().splitlines()
    assert text[-1] == "# EOF"
    families = [line.split()[2] for line in text if line.startswith("# TYPE")]
    assert len(families) == len(set(families))
    assert 'gpu_job_info{instance="node-1",gpu="0",uuid="GPU-seed-0000",job_id="seed-0"' in "\n".join(text)


def test_promtool_backfills_the_openmetrics_file(tmp_path):
    promtool = find_binary("promtool")
    frame = synth.frame(synth.seed_case(4))
    frame.loc[frame.index[5], "value"] = math.nan
    write_history(tmp_path / "h", frame, {"step_s": 60.0})
    result = subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(tmp_path / "h" / "metrics.om"),
            str(tmp_path / "db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "db").iterdir())


def test_format_value_spells_special_floats_as_openmetrics_does():
    assert format_value(math.nan) == "NaN"
    assert format_value(math.inf) == "+Inf"
    assert format_value(2.0) == "2"
    assert format_value(0.25) == "0.25"


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "history directory not found"),
        (lambda d: d.mkdir(), "meta.json: missing"),
        (lambda d: (d.mkdir(), (d / "meta.json").write_text("{nope")), "not valid JSON"),
        (
            lambda d: (d.mkdir(), (d / "meta.json").write_text(json.dumps({"format": "x"}))),
            'expected "format": "gpulens-history"',
        ),
        (
            lambda d: (
                d.mkdir(),
                (d / "meta.json").write_text(
                    json.dumps({"format": "gpulens-history", "version": 1, "step_s": 60})
                ),
                (d / "samples.parquet").write_bytes(b"not parquet at all"),
            ),
            "not a readable Parquet file",
        ),
    ],
)
def test_bad_history_directories_give_one_line_errors(tmp_path, setup, message):
    target = tmp_path / "h"
    setup(target)
    with pytest.raises(AnalyzerError) as err:
        read_history(target)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("keep", ["metrics.om", "samples.csv"])
def test_csv_or_openmetrics_alone_read_like_parquet(tmp_path, keep, th):
    from gpulens.analyzer.profile import profiles_from_samples

    frame = synth.frame(synth.seed_case(12))
    write_history(tmp_path / "h", frame, {"step_s": 60.0})
    expected = profiles_from_samples(read_history(tmp_path / "h").samples, 60.0, th)
    if keep == "samples.csv":
        read_history(tmp_path / "h").samples.to_csv(tmp_path / "h" / "samples.csv", index=False)
    (tmp_path / "h" / "samples.parquet").unlink()
    got = profiles_from_samples(read_history(tmp_path / "h").samples, 60.0, th)
    pd.testing.assert_frame_equal(
        expected.drop(columns=["uuids"]), got.drop(columns=["uuids"]), check_dtype=False
    )


def test_a_history_without_samples_is_an_error(tmp_path):
    write_history(tmp_path / "h", synth.frame(synth.seed_case(3)), {"step_s": 60.0})
    for name in ("samples.parquet", "metrics.om"):
        (tmp_path / "h" / name).unlink()
    with pytest.raises(AnalyzerError, match=r"no samples\.parquet, samples\.csv or metrics\.om"):
        read_history(tmp_path / "h")


@pytest.mark.parametrize("window", [None, (30.0, 3000.0)])
def test_row_groups_of_one_family_read_like_mixed_ones(tmp_path, window):
    """A writer that writes a family at a time (the bench, importers) leaves row groups whose
    footer names one family; they are read by that footer and give the same frames."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpulens.analyzer.history import SAMPLES_FILE, SCHEMA
    from gpulens.analyzer.profile import family_columns

    frame = synth.frame(synth.seed_case(6))
    write_history(tmp_path / "mixed", frame, {"step_s": 60.0})
    write_history(tmp_path / "split", frame, {"step_s": 60.0})
    samples = read_history(tmp_path / "mixed").samples.astype({"metric": str})
    with pq.ParquetWriter(tmp_path / "split" / SAMPLES_FILE, SCHEMA) as writer:
        for _, rows in samples.groupby("metric", sort=True):
            writer.write_table(
                pa.Table.from_pandas(
                    rows.astype(str).astype({"timestamp": float, "value": float}),
                    schema=SCHEMA,
                    preserve_index=False,
                )
            )
    assert pq.ParquetFile(tmp_path / "split" / SAMPLES_FILE).num_row_groups > 1
    start, end = window or (None, None)
    mixed = read_history(tmp_path / "mixed", start, end, families=family_columns()).families
    split = read_history(tmp_path / "split", start, end, families=family_columns()).families
    assert mixed is not None and split is not None and sorted(mixed) == sorted(split)
    for family, got in split.items():
        pd.testing.assert_frame_equal(got.astype(str), mixed[family].astype(str), obj=family)


def test_the_file_path_reads_each_mps_clients_running_cap_from_a_written_history(tmp_path, th):
    """The history keeps gpu_job_mps_active_thread_ratio, and the file path's window decides
    which sample is the last: the cap in force at the window's end."""
    from gpulens.analyzer.sources import files

    caps = synth.flat(12, 0.2)
    caps[6:] = 0.5
    job = synth.SynthJob(
        "a", "GPU-s", synth.flat(12, 0.2), synth.flat(12, 1e9), sharing="mps", thread_cap=caps
    )
    write_history(tmp_path / "h", synth.frame([job]), {"step_s": synth.STEP})
    whole = files.profiles(files.load(str(tmp_path / "h")), th).set_index("job_id")
    assert whole.loc["a", "mps_thread_cap_now_pct"] == pytest.approx(50.0)
    early = files.load(str(tmp_path / "h"), window_s=6 * synth.STEP, end=synth.START + 5 * synth.STEP)
    assert files.profiles(early, th).set_index("job_id").loc["a", "mps_thread_cap_now_pct"] == pytest.approx(
        20.0
    )
