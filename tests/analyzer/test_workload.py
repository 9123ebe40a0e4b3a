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
