"""Identity of GPU processes from procfs: Slurm cgroups/env, Kubernetes pods, vanished pids."""

import logging
import os
import shutil

import pytest

from gpulens.exporter.attribution import JobIdentity
from gpulens.exporter.attribution.logonce import LogOnce
from gpulens.exporter.attribution.procfs import EnvironRead, ProcfsReader
from gpulens.exporter.collectors import jobs
from gpulens.exporter.collectors.base import CollectorOptions
from gpulens.exporter.snapshot import NodeSnapshot
from tests.attribution.fakes import (
    CID_A,
    CID_B,
    POD_UID_A,
    POD_UID_B,
    by_job,
    kube_cgroupfs,
    kube_systemd,
    proc,
    slurm_v1,
    slurm_v2,
)

SLURM_ENV = {"SLURM_JOB_ID": "1234", "SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "physics"}


def test_slurm_v1_cgroup_with_env_gives_job_user_and_account(node):
    node.process(100, slurm_v1("1234"), SLURM_ENV)
    [usage] = node.attributor().attribute([proc(100)])
    assert usage.identity == JobIdentity("1234", "slurm", user="alice", namespace="physics")


def test_slurm_v2_cgroup_with_env(node):
    node.process(100, slurm_v2("1234"), SLURM_ENV)
    [usage] = node.attributor().attribute([proc(100)])
    assert (usage.identity.job_id, usage.identity.source, usage.identity.user) == ("1234", "slurm", "alice")


def test_slurm_cgroup_wins_over_a_forged_env_job_id(node):
    node.process(100, slurm_v2("1234"), {**SLURM_ENV, "SLURM_JOB_ID": "9999"})
    [usage] = node.attributor().attribute([proc(100)])
    assert usage.identity.job_id == "1234"


def test_slurm_env_alone_identifies_the_job(node):
    node.process(100, "0::/user.slice\n", SLURM_ENV)
    [usage] = node.attributor().attribute([proc(100)])
    assert (usage.identity.job_id, usage.identity.source) == ("1234", "slurm")


def test_slurm_user_falls_back_to_the_cgroup_uid(node):
    node.process(100, slurm_v1("55", uid=0), {})
    [usage] = node.attributor().attribute([proc(100)])
    assert usage.identity.user == "root"


def test_kubernetes_systemd_containerd_pod_named_from_log_dirs(node):
    node.pod("ml", "trainer-0", POD_UID_A, {"main": CID_A, "sidecar": CID_B})
    node.process(100, kube_systemd(POD_UID_A, CID_A))
    [usage] = node.attributor().attribute([proc(100)])
    assert usage.identity == JobIdentity(
        "ml/trainer-0", "kubernetes", namespace="ml", pod="trainer-0", container="main"
    )


def test_kubernetes_crio_and_docker_scopes(node):
    node.pod("a", "p1", POD_UID_A, {"c1": CID_A})
    node.pod("b", "p2", POD_UID_B, {"c2": CID_B})
    node.process(100, kube_systemd(POD_UID_A, CID_A, runtime="crio"))
    node.process(101, kube_systemd(POD_UID_B, CID_B, runtime="docker", qos="besteffort"))
    jobs = by_job(node.attributor().attribute([proc(100, gpu=0), proc(101, gpu=1)]))
    assert jobs[(0, None, "a/p1")].identity.container == "c1"
    assert jobs[(1, None, "b/p2")].identity.container == "c2"


def test_kubernetes_cgroupfs_pod(node):
    node.pod("default", "infer", POD_UID_B, {"server": CID_B})
    node.process(100, kube_cgroupfs(POD_UID_B, CID_B))
    [usage] = node.attributor().attribute([proc(100)])
    assert (usage.identity.namespace, usage.identity.pod, usage.identity.container) == (
        "default",
        "infer",
        "server",
    )


def test_pod_without_log_dir_is_identified_by_uid(node):
    node.process(100, kube_systemd(POD_UID_A, CID_A))
    [usage] = node.attributor().attribute([proc(100)])
    assert (usage.identity.job_id, usage.identity.source, usage.identity.pod) == (POD_UID_A, "kubernetes", "")


def test_pod_created_after_the_first_sample_gets_its_name(node, monkeypatch):
    attributor = node.attributor()
    node.process(100, kube_systemd(POD_UID_A, CID_A))
    assert attributor.attribute([proc(100)])[0].identity.job_id == POD_UID_A
    node.pod("ml", "late", POD_UID_A, {"main": CID_A})
    attributor._pods._loaded_at -= 10  # the directory may be re-listed on a miss after 2 s
    attributor._procfs._cache.clear()  # the pid cache would otherwise keep the first answer for 30 s
    assert attributor.attribute([proc(100)])[0].identity.job_id == "ml/late"


def test_vanished_pid_is_counted_as_unknown_not_dropped(node):
    node.process(100, slurm_v2("1"), {})
    node.process(101, slurm_v2("2"), {})
    attributor = node.attributor()
    shutil.rmtree(node.procfs / "101")  # exited between NVML listing it and procfs being read
    jobs = by_job(attributor.attribute([proc(100, memory=10), proc(101, memory=20)]))
    assert jobs[(0, None, "unknown")].memory_used_bytes == 20
    assert jobs[(0, None, "unknown")].identity.source == "unknown"
    assert jobs[(0, None, "1")].memory_used_bytes == 10


def test_pid_directory_present_but_files_gone(node):
    (node.procfs / "100").mkdir(parents=True)
    [usage] = node.attributor().attribute([proc(100)])
    assert usage.identity.job_id == "unknown"


def test_unreadable_environ_is_logged_once_and_cgroup_still_used(node, caplog):
    if os.geteuid() == 0:
        # root reads mode-000 files anyway; emulate the denial with a directory in its place
        node.process(100, slurm_v2("7"), {})
        (node.procfs / "100" / "environ").unlink()
        (node.procfs / "100" / "environ").mkdir()
    else:
        node.process(100, slurm_v2("7"), {})
        (node.procfs / "100" / "environ").chmod(0)
    attributor = node.attributor()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            attributor._procfs._cache.clear()
            assert attributor.attribute([proc(100)])[0].identity.job_id == "7"
    lines = [r for r in caplog.records if "cannot read" in r.getMessage()]
    assert len(lines) == 1


def test_procfs_disabled_ignores_cgroups(node):
    node.process(100, slurm_v2("7"), SLURM_ENV)
    [usage] = node.attributor(enable_procfs=False).attribute([proc(100)])
    assert usage.identity.job_id == "unknown"


def test_ended_job_disappears_at_the_next_sample(node):
    node.process(100, slurm_v2("1"), {})
    node.process(101, slurm_v2("2"), {})
    attributor = node.attributor()
    assert {u.identity.job_id for u in attributor.attribute([proc(100), proc(101)])} == {"1", "2"}
    assert {u.identity.job_id for u in attributor.attribute([proc(100)])} == {"1"}
    node.process(101, slurm_v2("3"), {})  # its pid reused at once, well inside the pid cache's 30 s
    assert {u.identity.job_id for u in attributor.attribute([proc(100), proc(101)])} == {"1", "3"}


def test_a_pid_reused_by_another_job_after_leaving_is_identified_afresh(node):
    node.process(100, slurm_v2("1"), {})
    attributor = node.attributor()
    assert [u.identity.job_id for u in attributor.attribute([proc(100)])] == ["1"]
    assert attributor.attribute([]) == []  # the process ended
    node.process(100, slurm_v2("2"), {})  # its pid now belongs to a process of another job
    assert [u.identity.job_id for u in attributor.attribute([proc(100)])] == ["2"]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _reader(node, clock: _Clock) -> ProcfsReader:
    node.procfs.mkdir(parents=True, exist_ok=True)
    return ProcfsReader(node.procfs, LogOnce(logging.getLogger("tests.attribution")), ttl_s=30.0, clock=clock)


def _listed_without_entry(reader: ProcfsReader, clock: _Clock, seconds: int) -> None:
    """NVML lists pid 100 every second for `seconds` while procfs shows no entry for it."""
    for _ in range(seconds):
        reader.read(100)
        clock.now += 1.0


def test_a_pid_without_a_procfs_entry_is_looked_up_again_at_the_next_sample(node):
    clock = _Clock()
    reader = _reader(node, clock)
    assert reader.read(100).cgroup.slurm_job_id is None  # vanished between NVML's list and our read
    clock.now += 1.0
    node.process(100, slurm_v2("1"), {})  # a transient miss: the entry is back
    assert reader.read(100).cgroup.slurm_job_id == "1"


def test_a_pid_missing_for_long_is_looked_up_less_often_and_found_within_as_long_as_it_was_missing(node):
    clock = _Clock()
    reader = _reader(node, clock)
    _listed_without_entry(reader, clock, seconds=20)  # e.g. a process of another pid namespace
    node.process(100, slurm_v2("1"), {})
    assert reader.read(100).cgroup.slurm_job_id is None  # within the back-off: not asked again yet
    found_after = 0.0
    while reader.read(100).cgroup.slurm_job_id != "1":
        clock.now += 1.0
        found_after += 1.0
    assert found_after <= 20.0


def test_a_pid_missing_for_ever_is_looked_up_at_least_every_ttl(node):
    clock = _Clock()
    reader = _reader(node, clock)
    _listed_without_entry(reader, clock, seconds=600)
    node.process(100, slurm_v2("1"), {})
    for _ in range(31):
        clock.now += 1.0
        if reader.read(100).cgroup.slurm_job_id == "1":
            return
    raise AssertionError("not looked up again within the TTL")


def test_a_pid_no_longer_listed_is_forgotten_with_its_back_off(node):
    clock = _Clock()
    reader = _reader(node, clock)
    _listed_without_entry(reader, clock, seconds=20)
    reader.retain([])  # the process ended; its pid is reused by a new process of job 2
    node.process(100, slurm_v2("2"), {})
    assert reader.read(100).cgroup.slurm_job_id == "2"


def test_after_the_ttl_an_unchanged_job_cgroup_keeps_the_identity_without_rereading_the_rest(node):
    clock = _Clock()
    reader = _reader(node, clock)
    node.process(100, slurm_v2("1"), {"SLURM_JOB_USER": "alice"})
    first = reader.read(100)
    (node.procfs / "100" / "environ").unlink()  # would read as no Slurm env if it were read again
    clock.now += 31.0
    assert reader.read(100) is first


def test_after_the_ttl_a_changed_cgroup_is_read_afresh(node):
    clock = _Clock()
    reader = _reader(node, clock)
    node.process(100, slurm_v2("1"), {})
    assert reader.read(100).cgroup.slurm_job_id == "1"
    node.process(100, slurm_v2("2"), {"SLURM_JOB_USER": "bob"})  # moved to another job's cgroup
    clock.now += 31.0
    info = reader.read(100)
    assert (info.cgroup.slurm_job_id, info.slurm_env.get("SLURM_JOB_USER")) == ("2", "bob")


def test_after_the_ttl_a_process_without_a_job_cgroup_rereads_its_environment(node):
    clock = _Clock()
    reader = _reader(node, clock)
    node.process(100, "0::/user.slice\n", {})
    assert reader.read(100).slurm_env == {}
    node.process(100, "0::/user.slice\n", {"SLURM_JOB_ID": "7"})  # identity only from the env
    clock.now += 31.0
    assert reader.read(100).slurm_env == {"SLURM_JOB_ID": "7"}


def _two_clients(node):
    """A client busy all the time under a 30 % cap beside an uncapped one busy a fifth of the time."""
    node.process(100, slurm_v2("1234"), {**SLURM_ENV, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"})
    node.process(101, slurm_v2("1235"), SLURM_ENV | {"SLURM_JOB_ID": "1235"})
    return [proc(100, sm=1.0, kind="mps_client"), proc(101, sm=0.2, kind="mps_client")]


def test_an_mps_clients_own_thread_percentage_is_its_jobs_cap(node):
    usages = by_job(node.attributor().attribute(_two_clients(node), {(0, None): 0.5}, {0: 1.0}, {0}))
    assert usages[(0, None, "1234")].mps_thread_ratio == 0.3
    assert usages[(0, None, "1235")].mps_thread_ratio is None


def test_capped_clients_on_a_gpu_with_sm_activity_are_weighed_by_what_their_caps_let_them_add(node):
    usages = by_job(node.attributor().attribute(_two_clients(node), {(0, None): 0.5}, {0: 1.0}, {0}))
    assert usages[(0, None, "1234")].sm_utilization_ratio == pytest.approx(0.3)  # not 0.5 / 1.2
    assert usages[(0, None, "1235")].sm_utilization_ratio == pytest.approx(0.2)


def test_capped_clients_on_a_gpu_without_sm_activity_split_its_utilization_by_time(node):
    # NVML utilization is a time, as the clients' own figures are: a thread cap does not bound it
    usages = by_job(node.attributor().attribute(_two_clients(node), {(0, None): 0.5}, {0: 1.0}))
    assert usages[(0, None, "1234")].sm_utilization_ratio == pytest.approx(0.5 / 1.2)


def test_a_thread_percentage_cuda_would_reject_is_no_cap(node):
    for pid, value in ((100, "0"), (101, "250"), (102, "thirty"), (103, "nan")):
        node.process(pid, slurm_v2(str(pid)), {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": value})
    usages = node.attributor().attribute([proc(p, sm=0.5, kind="mps_client") for p in (100, 101, 102, 103)])
    assert [u.mps_thread_ratio for u in usages] == [None, None, None, None]


def test_a_thread_percentage_outside_mps_is_not_published_as_a_cap(node):
    node.process(100, slurm_v2("1234"), {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"})
    [usage] = node.attributor().attribute([proc(100, sm=1.0)], {(0, None): 0.9})
    assert usage.mps_thread_ratio is None
    assert usage.sm_utilization_ratio == 0.9


def test_the_jobs_cap_is_published_beside_its_share_and_only_where_it_has_one(node):
    usages = node.attributor().attribute(_two_clients(node), {(0, None): 0.5}, {0: 1.0}, {0})
    snapshot = NodeSnapshot(timestamp=1.0, duration_seconds=0.0, nvml_up=True, jobs=tuple(usages))
    [family] = [
        m for m in jobs.collect(snapshot, CollectorOptions()) if m.name == "gpu_job_mps_active_thread_ratio"
    ]
    assert [(s.labels["job_id"], s.value) for s in family.samples] == [("1234", 0.3)]


def test_a_jobs_duty_cycle_is_its_processes_time_summed_and_at_most_one(node):
    node.process(100, slurm_v2("1234"), SLURM_ENV)
    node.process(101, slurm_v2("1234"), SLURM_ENV)
    node.process(102, slurm_v2("1235"), SLURM_ENV | {"SLURM_JOB_ID": "1235"})
    procs = [proc(100, sm=0.7, kind="mps_client"), proc(101, sm=0.6, kind="mps_client"), proc(102, sm=0.2)]
    usages = by_job(node.attributor().attribute(procs, {(0, None): 0.5}, {0: 1.0}, {0}))
    assert usages[(0, None, "1234")].duty_cycle_ratio == 1.0
    assert usages[(0, None, "1235")].duty_cycle_ratio == pytest.approx(0.2)


def test_a_capped_clients_duty_cycle_is_published_beside_its_share(node):
    # share 0.3 = duty 1.0 x cap 0.3: the cap held the job whenever it ran
    usages = node.attributor().attribute(_two_clients(node), {(0, None): 0.5}, {0: 1.0}, {0})
    snapshot = NodeSnapshot(timestamp=1.0, duration_seconds=0.0, nvml_up=True, jobs=tuple(usages))
    [family] = [m for m in jobs.collect(snapshot, CollectorOptions()) if m.name == "gpu_job_duty_cycle_ratio"]
    assert sorted((s.labels["job_id"], s.value) for s in family.samples) == [("1234", 1.0), ("1235", 0.2)]


def test_an_mps_clients_pipe_directory_is_kept(node):
    node.process(100, env={"CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe"})
    reader = ProcfsReader(node.procfs, LogOnce(logging.getLogger("t")))
    assert reader.read(100).mps_pipe_dir == "/mps/nvidia.com/gpu/pipe"


@pytest.mark.parametrize("value", ["relative/pipe", "/mps/../../etc", "/tmp/a\nb", "/" + "p" * 256, ""])
def test_a_pipe_directory_that_is_not_a_sane_absolute_path_is_the_default(node, value):
    node.process(100, env={"CUDA_MPS_PIPE_DIRECTORY": value})
    reader = ProcfsReader(node.procfs, LogOnce(logging.getLogger("t")))
    assert reader.read(100).mps_pipe_dir is None


@pytest.mark.parametrize(
    ("env", "refused", "read"),
    [({}, False, EnvironRead.READ), ({"CUDA_MPS_PIPE_DIRECTORY": "/p"}, True, EnvironRead.UNREADABLE)],
)
def test_an_unreadable_environment_is_told_apart_from_one_without_a_pipe_directory(node, env, refused, read):
    # an MPS client's pipe directory is then unknown rather than the default (mps_control.py)
    node.process(100, env=env)
    if refused:
        node.refuse_environ(100)
    info = ProcfsReader(node.procfs, LogOnce(logging.getLogger("t"))).read(100)
    assert (info.environ, info.mps_pipe_dir) == (read, None)


def test_a_pid_without_an_entry_is_neither_read_nor_unreadable(node):
    node.procfs.mkdir(parents=True, exist_ok=True)
    assert (
        ProcfsReader(node.procfs, LogOnce(logging.getLogger("t"))).read(999).environ is EnvironRead.NO_ENTRY
    )
