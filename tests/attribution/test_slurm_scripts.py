"""deploy/slurm prolog/epilog write mapping files that the exporter's parser reads back."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpulens.exporter.attribution.mapping_dir import MappingEntry, MappingKey, parse_mapping_content
from tests.attribution.fakes import GPU1, MIG_A, by_job, proc

SCRIPTS = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def run(script: str, mapping_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "GPULENS_JOB_MAPPING_DIR": str(mapping_dir)}
    return subprocess.run(
        ["bash", str(SCRIPTS / script)], env={**base, **env}, capture_output=True, text=True, timeout=30
    )


def entries(path: Path) -> tuple[MappingEntry, ...]:
    return parse_mapping_content(path.read_bytes())


def test_prolog_writes_one_jobstats_line_per_gpu(tmp_path):
    result = run(
        "prolog.sh", tmp_path / "jobs", SLURM_JOB_ID="1234", SLURM_JOB_UID="1000", SLURM_JOB_GPUS="0,2"
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "jobs").iterdir() if not p.name.startswith(".")) == ["0", "2"]
    assert entries(tmp_path / "jobs" / "0") == (MappingEntry("1234", 1000),)


def test_prolog_falls_back_to_cuda_visible_devices_and_handles_uuids(tmp_path):
    run("prolog.sh", tmp_path, SLURM_JOB_ID="7", SLURM_JOB_UID="0", CUDA_VISIBLE_DEVICES=f"{MIG_A},{GPU1}")
    assert entries(tmp_path / MIG_A) == entries(tmp_path / GPU1) == (MappingEntry("7", 0),)


def test_dcgm_format_writes_bare_job_ids(tmp_path):
    run("prolog.sh", tmp_path, SLURM_JOB_ID="8", SLURM_JOB_GPUS="1", GPULENS_MAPPING_FORMAT="dcgm")
    assert (tmp_path / "1").read_text() == "8\n"


def test_jobs_sharing_a_gpu_get_a_line_each_and_epilog_removes_only_its_own(tmp_path):
    run("prolog.sh", tmp_path, SLURM_JOB_ID="1", SLURM_JOB_UID="1000", SLURM_JOB_GPUS="0,1")
    run("prolog.sh", tmp_path, SLURM_JOB_ID="2", SLURM_JOB_UID="2000", SLURM_JOB_GPUS="1")
    run("prolog.sh", tmp_path, SLURM_JOB_ID="2", SLURM_JOB_UID="2000", SLURM_JOB_GPUS="1")  # requeue: no dup
    assert entries(tmp_path / "1") == (MappingEntry("1", 1000), MappingEntry("2", 2000))
    result = run("epilog.sh", tmp_path, SLURM_JOB_ID="1")  # no GPU list needed in the epilog
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "0").exists()
    assert entries(tmp_path / "1") == (MappingEntry("2", 2000),)
    run("epilog.sh", tmp_path, SLURM_JOB_ID="2")
    assert not (tmp_path / "1").exists()


def test_epilog_does_not_remove_a_job_whose_id_is_a_prefix(tmp_path):
    run("prolog.sh", tmp_path, SLURM_JOB_ID="12", SLURM_JOB_UID="1", SLURM_JOB_GPUS="0")
    run("prolog.sh", tmp_path, SLURM_JOB_ID="123", SLURM_JOB_UID="1", SLURM_JOB_GPUS="0")
    run("epilog.sh", tmp_path, SLURM_JOB_ID="12")
    assert entries(tmp_path / "0") == (MappingEntry("123", 1),)


@pytest.mark.parametrize(
    "env",
    [
        {"SLURM_JOB_ID": "12; rm -rf /", "SLURM_JOB_GPUS": "0"},
        {"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "../../etc/passwd"},
        {"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "0", "GPULENS_MAPPING_FORMAT": "xml"},
    ],
)
def test_bad_input_writes_nothing_and_never_fails_the_job(tmp_path, env):
    result = run("prolog.sh", tmp_path / "jobs", **env)
    assert result.returncode == 0 and "gpulens prolog:" in result.stderr
    written = [p for p in (tmp_path / "jobs").glob("*")] if (tmp_path / "jobs").exists() else []
    assert [p.name for p in written if not p.name.startswith(".")] == []


def test_job_without_gpus_writes_nothing(tmp_path):
    result = run("prolog.sh", tmp_path / "jobs", SLURM_JOB_ID="5")
    assert result.returncode == 0 and not (tmp_path / "jobs").exists()


def test_exporter_attributes_from_what_the_prolog_wrote(node):
    run("prolog.sh", node.mapping_dir, SLURM_JOB_ID="31", SLURM_JOB_UID="0", SLURM_JOB_GPUS="0")
    run("prolog.sh", node.mapping_dir, SLURM_JOB_ID="32", SLURM_JOB_UID="0", CUDA_VISIBLE_DEVICES=MIG_A)
    jobs = by_job(node.attributor().attribute([proc(10, gpu=0), proc(11, gpu=1, gi=2, mig_uuid=MIG_A)]))
    assert jobs[(0, None, "31")].identity.user == "root"
    assert (1, 2, "32") in jobs
    run("epilog.sh", node.mapping_dir, SLURM_JOB_ID="31")
    assert MappingKey(gpu=0) not in node.attributor()._mapping.refresh()


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_scripts_are_shellcheck_clean():
    result = subprocess.run(
        ["shellcheck", str(SCRIPTS / "prolog.sh"), str(SCRIPTS / "epilog.sh")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout
