"""A job's workload: the same across restarts and rollouts (issue 30 item 5)."""

from __future__ import annotations

import pytest

from gpulens.analyzer.workload import pod_owner, workload_of


@pytest.mark.parametrize(
    ("pod", "owner"),
    [
        ("chat-api-7d9f8c6b5-x2kqp", "chat-api"),  # Deployment: pod-template-hash + suffix
        ("triton-resnet-5c8d7f9b4-8wq2n", "triton-resnet"),
        ("embed-job-7-xk2p9", "embed-job-7"),  # Job: suffix only
        ("nightly-eval-29412345-zt6lq", "nightly-eval"),  # CronJob: run's minutes + suffix
        ("jupyter-jane-0", "jupyter-jane-0"),  # StatefulSet: the ordinal is the identity
        ("feature-stream-0", "feature-stream-0"),
        ("trainer", "trainer"),  # a bare pod
        ("model-abcde", "model-abcde"),  # vowels: no generated suffix looks like this
    ],
)
def test_a_pods_generated_parts_are_stripped_and_chosen_names_kept(pod, owner):
    assert pod_owner(pod) == owner


def test_two_pods_of_one_deployment_before_and_after_a_rollout_are_one_workload():
    before = {"job_id": "ml/chat-api-7d9f8c6b5-x2kqp", "job_source": "kubernetes", "job_namespace": "ml"}
    after = {"job_id": "ml/chat-api-5f6b8d9c47-q8wzt", "job_source": "kubernetes", "job_namespace": "ml"}
    before["job_pod"] = "chat-api-7d9f8c6b5-x2kqp"
    after["job_pod"] = "chat-api-5f6b8d9c47-q8wzt"
    assert workload_of(before) == workload_of(after) == "ml/chat-api"


def test_the_same_name_in_two_namespaces_is_two_workloads():
    a = {
        "job_id": "a",
        "job_source": "kubernetes",
        "job_namespace": "team-a",
        "job_pod": "svc-7d9f8c6b5-x2kqp",
    }
    b = {**a, "job_namespace": "team-b"}
    assert workload_of(a) != workload_of(b)


def test_slurm_array_tasks_share_their_arrays_workload_and_a_plain_job_is_its_own():
    assert workload_of({"job_id": "4242_7", "job_source": "slurm"}) == "slurm array 4242"
    assert workload_of({"job_id": "4242_8", "job_source": "slurm"}) == "slurm array 4242"
    assert workload_of({"job_id": "5101", "job_source": "slurm"}) == "5101"


def _slurm(job_id: str, user: str = "alice", name: str = "") -> dict[str, str]:
    return {"job_id": job_id, "job_source": "slurm", "job_user": user, "job_name": name}


def test_a_named_slurm_job_resubmitted_under_a_new_id_is_the_same_workload():
    assert workload_of(_slurm("5101", name="vit-b16")) == workload_of(_slurm("6230", name="vit-b16"))
    assert workload_of(_slurm("5101", name="vit-b16")) == "slurm alice/vit-b16"


def test_the_same_job_name_of_two_users_is_two_workloads():
    assert workload_of(_slurm("1", "alice", "train")) != workload_of(_slurm("2", "bob", "train"))


def test_each_task_of_a_named_array_follows_its_own_task_of_the_resubmitted_array():
    assert workload_of(_slurm("4242_7", name="sweep")) == workload_of(_slurm("5000_7", name="sweep"))
    assert workload_of(_slurm("4242_7", name="sweep")) == "slurm alice/sweep[7]"
    assert workload_of(_slurm("4242_7", name="sweep")) != workload_of(_slurm("4242_8", name="sweep"))


def test_a_slurm_job_without_a_name_keeps_its_id_based_identity():
    assert workload_of(_slurm("5101")) == "5101"
    assert workload_of(_slurm("4242_7")) == "slurm array 4242"


def test_a_name_missing_from_older_data_reads_as_no_name():
    assert workload_of({"job_id": "5101", "job_source": "slurm", "job_name": float("nan")}) == "5101"


def test_a_job_name_on_a_non_slurm_job_does_not_change_its_workload():
    row = {"job_id": "lsf-77", "job_source": "mapping", "job_name": "x"}
    assert workload_of(row) == "lsf-77"
