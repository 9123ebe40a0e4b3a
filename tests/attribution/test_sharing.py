"""Per-job usage sums and the sharing mode derived from what runs on each GPU / MIG instance."""

import logging

import pytest

from gpulens.exporter.attribution import Attributor
from gpulens.exporter.attribution.attributor import dedupe_processes
from tests.attribution.fakes import (
    CID_A,
    CID_B,
    MIG_A,
    MIG_B,
    POD_UID_A,
    POD_UID_B,
    by_job,
    kube_systemd,
    proc,
    slurm_v2,
)

GiB = 1 << 30


def test_mps_clients_of_different_jobs_on_one_gpu(node):
    node.process(10, slurm_v2("900"), {})  # the MPS server runs in some job's cgroup, yet is not the job's
    node.process(11, slurm_v2("1"), {})
    node.process(12, slurm_v2("2"), {})
    usages = node.attributor().attribute(
        [
            proc(10, memory=300 << 20, kind="mps_server"),
            proc(11, memory=2 * GiB, sm=0.3, kind="mps_client"),
            proc(12, memory=5 * GiB, sm=0.5, kind="mps_client"),
        ]
    )
    jobs = by_job(usages)
    assert set(jobs) == {(0, None, "1"), (0, None, "2"), (0, None, "mps_server")}
    assert jobs[(0, None, "1")].memory_used_bytes == 2 * GiB
    assert jobs[(0, None, "2")].memory_used_bytes == 5 * GiB
    assert jobs[(0, None, "mps_server")].memory_used_bytes == 300 << 20
    assert jobs[(0, None, "mps_server")].identity.source == "system"
    assert {u.sharing for u in usages} == {"mps"}
    assert jobs[(0, None, "2")].sm_utilization_ratio == pytest.approx(0.5)


def test_mig_instances_of_different_jobs(node):
    node.process(11, slurm_v2("1"), {})
    node.process(12, slurm_v2("2"), {})
    usages = node.attributor().attribute(
        [proc(11, gi=1, mig_uuid=MIG_A, memory=GiB), proc(12, gi=2, mig_uuid=MIG_B, memory=3 * GiB)],
        instance_sm_active={(0, 1): 0.25, (0, 2): 0.75},
    )
    jobs = by_job(usages)
    assert jobs[(0, 1, "1")].sharing == jobs[(0, 2, "2")].sharing == "mig"
    assert jobs[(0, 1, "1")].sm_utilization_ratio == pytest.approx(0.25)
    assert jobs[(0, 2, "2")].sm_utilization_ratio == pytest.approx(0.75)
    assert jobs[(0, 2, "2")].memory_used_bytes == 3 * GiB


def test_mig_instance_shared_by_two_jobs_has_no_instance_sm_value(node):
    node.process(11, slurm_v2("1"), {})
    node.process(12, slurm_v2("2"), {})
    usages = node.attributor().attribute(
        [proc(11, gi=1, mig_uuid=MIG_A), proc(12, gi=1, mig_uuid=MIG_A)], instance_sm_active={(0, 1): 0.9}
    )
    assert [u.sm_utilization_ratio for u in usages] == [None, None]


def test_time_sliced_pods_on_one_gpu(node):
    node.pod("ml", "a", POD_UID_A, {"main": CID_A})
    node.pod("ml", "b", POD_UID_B, {"main": CID_B})
    node.process(11, kube_systemd(POD_UID_A, CID_A))
    node.process(12, kube_systemd(POD_UID_B, CID_B))
    usages = node.attributor().attribute([proc(11, sm=0.2), proc(12, sm=0.4)])
    assert {u.identity.job_id: u.sharing for u in usages} == {"ml/a": "time_slicing", "ml/b": "time_slicing"}


def test_single_job_with_many_processes_is_exclusive(node):
    for pid in (11, 12, 13):
        node.process(pid, slurm_v2("5"), {})
    [usage] = node.attributor().attribute([proc(11, sm=0.5), proc(12, sm=0.4), proc(13, sm=0.3)])
    assert (usage.sharing, usage.processes) == ("exclusive", 3)
    assert usage.sm_utilization_ratio == 1.0  # sum capped at 1


def test_job_memory_sums_to_process_memory_and_none_counts_as_zero(node, caplog):
    node.process(11, slurm_v2("5"), {})
    node.process(12, slurm_v2("5"), {})
    with caplog.at_level(logging.INFO):
        [usage] = node.attributor().attribute([proc(11, memory=7), proc(12, memory=None)])
    assert usage.memory_used_bytes == 7
    assert any("no used memory" in r.getMessage() for r in caplog.records)


def test_sm_ratio_is_none_when_no_process_reports_one(node):
    node.process(11, slurm_v2("5"), {})
    [usage] = node.attributor().attribute([proc(11, sm=None)])
    assert usage.sm_utilization_ratio is None


def test_total_memory_per_gpu_adds_up_across_jobs(node):
    procs = [proc(pid, gpu=pid % 2, memory=pid * 1000) for pid in range(20, 40)]
    for p in procs:
        node.process(p.pid, slurm_v2(str(p.pid % 5)), {})
    usages = node.attributor().attribute(procs)
    for gpu in (0, 1):
        assert sum(u.memory_used_bytes for u in usages if u.gpu == gpu) == sum(
            p.used_memory_bytes for p in procs if p.gpu == gpu
        )


def test_process_listed_as_compute_and_graphics_counts_once():
    both = dedupe_processes([proc(11, memory=5, kind="graphics"), proc(11, memory=5, kind="compute")])
    assert len(both) == 1 and both[0].kind == "compute" and both[0].used_memory_bytes == 5


def test_jobs_beyond_the_cap_are_summed_into_other(node, caplog):
    procs = [proc(pid, memory=pid) for pid in range(100, 110)]
    for p in procs:
        node.process(p.pid, slurm_v2(str(p.pid)), {})
    with caplog.at_level(logging.WARNING):
        attributor = Attributor(node.config(), logger=node.logger, max_jobs_per_device=4)
        usages = attributor.attribute(procs)
    jobs = {u.identity.job_id: u for u in usages}
    assert set(jobs) == {"109", "108", "107", "other"}
    assert jobs["other"].memory_used_bytes == sum(range(100, 107))
    assert jobs["other"].processes == 7 and jobs["other"].identity.source == "other"
    assert sum(u.memory_used_bytes for u in usages) == sum(p.used_memory_bytes for p in procs)
    assert sum("exceed the cap" in r.getMessage() for r in caplog.records) == 1


def test_label_values_are_sanitised(node):
    node.process(11, "0::/user.slice\n", {"SLURM_JOB_ID": 'x"\n\\y' + "z" * 300, "SLURM_JOB_USER": "bob\t"})
    [usage] = node.attributor().attribute([proc(11)])
    assert usage.identity.job_id.startswith("x___y")
    assert len(usage.identity.job_id) == 128 and usage.identity.job_id.endswith("~")
    assert usage.identity.user == "bob"


def test_job_id_that_sanitises_to_nothing_is_unknown(node):
    node.process(11, "0::/user.slice\n", {"SLURM_JOB_ID": "   "})
    [usage] = node.attributor().attribute([proc(11)])
    assert usage.identity.job_id == "unknown"


def test_a_job_named_other_is_not_lost_when_the_cap_applies(node):
    procs = [proc(pid, memory=1000 - pid) for pid in range(100, 106)]
    names = ["other", "a", "b", "c", "d", "e"]
    for p, name in zip(procs, names, strict=True):
        node.process(p.pid, "0::/user.slice\n", {"SLURM_JOB_ID": name})
    usages = Attributor(node.config(), logger=node.logger, max_jobs_per_device=3).attribute(procs)
    assert sum(u.memory_used_bytes for u in usages) == sum(p.used_memory_bytes for p in procs)
    job_ids = [u.identity.job_id for u in usages]
    assert len(set(job_ids)) == len(job_ids) <= 3 and "other" in job_ids


def test_two_containers_of_one_pod_on_a_gpu_give_one_row(node):
    node.pod("ml", "p", POD_UID_A, {"main": CID_A, "helper": CID_B})
    node.process(11, kube_systemd(POD_UID_A, CID_A))
    node.process(12, kube_systemd(POD_UID_A, CID_B))
    [usage] = node.attributor().attribute([proc(11, memory=1), proc(12, memory=2)])
    assert usage.identity.container == "helper,main"
    assert (usage.memory_used_bytes, usage.sharing) == (3, "exclusive")
