"""`gpu_job_info{job_name}`: a Slurm job's name from SLURM_JOB_NAME, the identity a resubmission keeps.

The analyzer follows a job across resubmissions by (user, name) (analyzer/workload.py), so the
label must be one value per job, length-capped like every label, and empty where nothing says it.
"""

from __future__ import annotations

from gpulens.exporter.attribution.labels import MAX_LABEL_LENGTH
from gpulens.exporter.collectors import jobs
from gpulens.exporter.collectors.base import CollectorOptions
from gpulens.exporter.snapshot import NodeSnapshot
from tests.attribution.fakes import CID_A, POD_UID_A, kube_systemd, proc, slurm_v2

ENV = {"SLURM_JOB_ID": "1234", "SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "physics"}


def _job_info(usages) -> list[dict[str, str]]:
    snapshot = NodeSnapshot(timestamp=1.0, duration_seconds=0.0, nvml_up=True, jobs=tuple(usages))
    [family] = [m for m in jobs.collect(snapshot, CollectorOptions()) if m.name == "gpu_job_info"]
    return [s.labels for s in family.samples]


def test_a_slurm_jobs_name_comes_from_its_environment(node):
    node.process(100, slurm_v2("1234"), {**ENV, "SLURM_JOB_NAME": "vit-b16"})
    [labels] = _job_info(node.attributor().attribute([proc(100)]))
    assert (labels["job_id"], labels["job_user"], labels["job_name"]) == ("1234", "alice", "vit-b16")


def test_a_job_without_a_name_has_an_empty_job_name(node):
    node.process(100, slurm_v2("1234"), ENV)
    [labels] = _job_info(node.attributor().attribute([proc(100)]))
    assert labels["job_name"] == ""


def test_a_long_or_unprintable_name_is_capped_and_cleaned_like_every_label(node):
    node.process(100, slurm_v2("1"), {**ENV, "SLURM_JOB_NAME": "x" * 500})
    node.process(101, slurm_v2("2"), {**ENV, "SLURM_JOB_NAME": 'a"b\tc'})
    names = {u.identity.job_id: u.identity.name for u in node.attributor().attribute([proc(100), proc(101)])}
    assert len(names["1"]) == MAX_LABEL_LENGTH and names["1"].endswith("~")
    assert names["2"] == "a_b_c"


def test_steps_of_one_job_with_different_names_give_the_job_one_name(node):
    node.process(100, slurm_v2("1234"), {**ENV, "SLURM_JOB_NAME": "train"})
    node.process(101, slurm_v2("1234"), {**ENV, "SLURM_JOB_NAME": "eval"})  # `srun -J eval` inside it
    info = _job_info(node.attributor().attribute([proc(100), proc(101)]))
    assert [labels["job_name"] for labels in info] == ["eval"]


def test_a_kubernetes_pod_has_an_empty_job_name(node):
    node.pod("ml", "trainer-0", POD_UID_A, {"main": CID_A})
    node.process(100, kube_systemd(POD_UID_A, CID_A), {"SLURM_JOB_NAME": "stray"})
    [labels] = _job_info(node.attributor().attribute([proc(100)]))
    assert (labels["job_id"], labels["job_name"]) == ("ml/trainer-0", "")
