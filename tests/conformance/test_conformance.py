"""The conformance script's simulator half and diff logic (the GPU half runs on a borrowed GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpulens.devtools.conformance.diff import compare_records, compare_values
from gpulens.devtools.conformance.exporter_check import check_exposition, parse_exposition
from gpulens.devtools.conformance.record import describe

DATA = Path(__file__).resolve().parents[1] / "data"
FACTS = DATA / "nvml-reference-facts.json"
# records the simulator must match exactly: documented behaviour, then every real GPU run
REPLAYED = {
    "documented": FACTS,
    "real-h200": DATA / "real-h200.json",  # 2026-12-04: H200, driver 580.159.04, VM without NVLink
}


def _record(probes: dict[str, Any], mig: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"version": 1, "system": {}, "gpus": [{"index": 0, "probes": probes, "mig": mig or []}]}


def test_identical_records_have_no_differences():
    probes = {"nvmlDeviceGetName": {"type": "str", "value": "NVIDIA H200"}}
    assert compare_records(_record(probes), _record(probes)) == []


def test_an_error_on_one_side_only_is_a_difference():
    real = _record({"nvmlDeviceGetUtilizationRates": {"error": "NVMLError_NotSupported", "code": 3}})
    sim = _record({"nvmlDeviceGetUtilizationRates": {"type": "struct.c_nvmlUtilization_t", "fields": {}}})
    [mismatch] = compare_records(real, sim)
    assert "real raises NVMLError_NotSupported(3)" in mismatch.detail
    assert mismatch.where == "gpu0"


def test_a_struct_field_missing_in_the_simulator_is_reported():
    real = {"type": "struct.x", "fields": {"a": {"type": "int"}, "b": {"type": "int"}}}
    sim = {"type": "struct.x", "fields": {"a": {"type": "int"}}}
    assert compare_values(real, sim) == [".b: missing in simulator"]


def test_list_item_types_are_compared_but_lengths_are_not():
    real = {"type": "list", "len": 3, "items": [{"type": "int"}]}
    assert compare_values(real, {"type": "list", "len": 1, "items": [{"type": "int"}]}) == []
    assert compare_values(real, {"type": "list", "len": 1, "items": [{"type": "str"}]}) == [
        "[0]: type real int vs simulator str"
    ]


def test_tuple_arity_matters():
    real = {"type": "tuple", "len": 4, "items": [{"type": "int"}]}
    sim = {"type": "tuple", "len": 3, "items": [{"type": "int"}]}
    assert compare_values(real, sim) == ["result: tuple length real 4 vs simulator 3"]


def test_describe_keeps_ctypes_scalar_types_apart_from_ints():
    import ctypes

    assert describe(ctypes.c_uint(1)) == {"type": "ctypes.c_uint", "value": 1}
    assert describe(float("nan"))["nan"] is True


def test_missing_mig_devices_in_the_simulator_are_reported():
    real = _record({}, mig=[{"slot": 0, "probes": {}}])
    [mismatch] = compare_records(real, _record({}))
    assert mismatch.where == "gpu0/mig0"


@pytest.mark.parametrize("record", REPLAYED.values(), ids=REPLAYED.keys())
def test_simulator_matches_the_replayed_record(record):
    """Replays a committed record (tests/data) against today's simulator."""
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "conformance", "diff", str(record), "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no differences" in result.stdout


def test_every_fact_names_its_source():
    facts = json.loads(FACTS.read_text())
    sections = [facts["system"], facts["gpus"][0]["probes"], *[m["probes"] for m in facts["gpus"][0]["mig"]]]
    for section in sections:
        for name, probe in section.items():
            assert probe.get("source", "").startswith("§"), name


def test_a_bad_record_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "real.json"
    bad.write_text("{not json")
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "conformance", "diff", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and str(bad) in result.stderr


def test_a_real_gpu_without_nvlink_is_simulated_without_nvlink():
    from gpulens.devtools.conformance.cli import _real_shape

    shape = _real_shape(json.loads(REPLAYED["real-h200"].read_text()))
    assert (shape.model, shape.mig_profiles, shape.nvlink) == ("H200-141GB", (), False)


def test_a_real_gpu_with_nvlink_is_simulated_with_it():
    from gpulens.devtools.conformance.cli import _real_shape

    probes = {
        "nvmlDeviceGetName": {"type": "str", "value": "NVIDIA H200"},
        "nvmlDeviceGetNvLinkState(0)": {"type": "int", "value": 1},
    }
    assert _real_shape(_record(probes)).nvlink is True


EXPOSITION = """# HELP gpu_up x
# TYPE gpu_up gauge
gpu_up{gpu="0",uuid="GPU-1"} 1
gpu_temperature_celsius{gpu="0",uuid="GPU-1"} 250
"""


def test_exposition_parser_reads_values_per_family():
    assert parse_exposition(EXPOSITION) == {"gpu_up": [1.0], "gpu_temperature_celsius": [250.0]}


def test_exporter_check_flags_missing_and_implausible_families():
    problems = check_exposition(EXPOSITION, hopper=True, mig=False)
    assert any(p.startswith("gpu_temperature_celsius: values") for p in problems)
    assert "gpu_sm_active_ratio: missing" in problems
    assert "gpu_up: missing" not in problems


@pytest.mark.slow
def test_exporter_check_passes_on_the_simulated_h100_node(tmp_path):
    from gpulens.devtools.conformance.exporter_check import run_exporter_check

    report = run_exporter_check(["--simulate", "dgx-h100"], seconds=3, hopper=True, mig=False)
    assert report.problems == [], report.problems
