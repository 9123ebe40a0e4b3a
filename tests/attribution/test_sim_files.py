"""The attributor reads the files the simulated node writes (sim/procfs.py) as real ones.

This ties the two sides together: if the simulator's renderings of `/proc/<pid>/cgroup`, `environ`,
`/var/log/pods` or the mapping directory drift from what the attributor understands, this fails.
"""

from __future__ import annotations

import itertools

import pytest

from gpulens.exporter.attribution import AttributionConfig, Attributor
from tests.attribution.fakes import GPU0, by_job, proc

sim_procfs = pytest.importorskip("gpulens.sim.procfs")
scenario = pytest.importorskip("gpulens.sim.scenario")
patterns = pytest.importorskip("gpulens.sim.patterns")

_pids = itertools.count(1000)


def spec(job, kind="compute", uid=1000):
    return scenario.ProcessSpec(
        pid=next(_pids),
        gpu=0,
        instance=None,
        kind=kind,
        name="python",
        cmdline=("python", "train.py"),
        user="alice",
        uid=uid,
        job=job,
        start=0.0,
        end=scenario.FOREVER,
        workload=patterns.WorkloadSpec(pattern="constant", memory_bytes=1 << 30, sm=0.5),
    )


def slurm(job_id, cgroup):
    return scenario.SlurmJob(job_id=job_id, user="alice", account="physics", step="0", task=0, cgroup=cgroup)


def pod(name, uid, driver, runtime, qos, cgroup):
    return scenario.KubernetesJob(
        namespace="ml",
        pod=name,
        pod_uid=uid,
        container="main",
        container_id=uid.replace("-", "")[:8] * 8,
        qos=qos,
        driver=driver,
        runtime=runtime,
        cgroup=cgroup,
    )


def test_simulated_slurm_and_kubernetes_processes_are_identified(tmp_path):
    specs = [
        spec(slurm("101", "v1")),
        spec(slurm("102", "v2")),
        spec(pod("a", "11111111-2222-3333-4444-555555555555", "systemd", "containerd", "burstable", "v2")),
        spec(pod("b", "21111111-2222-3333-4444-555555555555", "systemd", "cri-o", "guaranteed", "v1")),
        spec(pod("c", "31111111-2222-3333-4444-555555555555", "cgroupfs", "containerd", "besteffort", "v1")),
        spec(pod("d", "41111111-2222-3333-4444-555555555555", "cgroupfs", "cri-o", "guaranteed", "v2")),
        spec(None, kind="mps_server", uid=0),
    ]
    files = sim_procfs.NodeFiles(tmp_path / "proc", tmp_path / "pods", tmp_path / "mapping")
    views = [sim_procfs.ProcView(spec=s, pid=s.pid, device_uuid=GPU0, hostname="node1") for s in specs]
    files.sync(views, {})
    attributor = Attributor(
        AttributionConfig(
            procfs_root=tmp_path / "proc",
            job_mapping_dir=tmp_path / "mapping",
            pod_resources_socket=None,
            pod_logs_dir=tmp_path / "pods",
        )
    )
    usages = attributor.attribute([proc(s.pid, kind=s.kind) for s in specs])
    jobs = by_job(usages)
    assert set(jobs) == {(0, None, j) for j in ("101", "102", "ml/a", "ml/b", "ml/c", "ml/d", "mps_server")}
    assert jobs[(0, None, "101")].identity.user == "alice"
    assert jobs[(0, None, "102")].identity.namespace == "physics"
    assert jobs[(0, None, "ml/b")].identity.container == "main"


def test_a_simulated_slurm_jobs_name_reaches_its_identity(tmp_path):
    job = scenario.SlurmJob(
        job_id="4711_3", user="alice", account="physics", step="0", task=0, cgroup="v2", name="sweep"
    )
    specs = [spec(job)]
    files = sim_procfs.NodeFiles(tmp_path / "proc", None, tmp_path / "mapping")
    files.sync([sim_procfs.ProcView(spec=specs[0], pid=specs[0].pid, device_uuid=GPU0, hostname="n")], {})
    attributor = Attributor(AttributionConfig(procfs_root=tmp_path / "proc", pod_resources_socket=None))
    [usage] = attributor.attribute([proc(specs[0].pid)])
    assert (usage.identity.job_id, usage.identity.name) == ("4711_3", "sweep")


def test_simulated_mapping_directory_is_read(tmp_path):
    specs = [spec(scenario.MappingJob(job_id="lsf-77"))]
    files = sim_procfs.NodeFiles(tmp_path / "proc", None, tmp_path / "mapping")
    views = [sim_procfs.ProcView(spec=s, pid=s.pid, device_uuid=GPU0, hostname="node1") for s in specs]
    files.sync(views, {"0": ["lsf-77"]})
    attributor = Attributor(
        AttributionConfig(
            procfs_root=tmp_path / "proc",
            job_mapping_dir=tmp_path / "mapping",
            pod_resources_socket=None,
            pod_logs_dir=tmp_path / "pods",
        )
    )
    [usage] = attributor.attribute([proc(specs[0].pid)])
    assert (usage.identity.job_id, usage.identity.source) == ("lsf-77", "mapping")
