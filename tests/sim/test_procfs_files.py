"""The files simulated processes leave behind use the real formats, and follow processes in time."""

from __future__ import annotations

import dataclasses

import pytest

from gpulens.sim import procfs
from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.patterns import WorkloadSpec
from gpulens.sim.scenario import FOREVER, KubernetesJob, MappingJob, ProcessSpec, SlurmJob
from gpulens.sim.scenariofile import load_scenario, parse_scenario

T0 = 1_750_000_000.0
UID = "3f1c2a9e-5b7d-4e21-9a0c-1d2e3f405162"
CID = "ab" * 32


def spec(job=None, **kw) -> ProcessSpec:
    base = ProcessSpec(
        pid=4242,
        gpu=0,
        instance=None,
        kind="compute",
        name="python",
        cmdline=("python", "train.py", "--lr", "0.1"),
        user="alice",
        uid=1001,
        job=job,
        start=0.0,
        end=FOREVER,
        workload=WorkloadSpec("constant", 1 << 30, 0.5),
    )
    return dataclasses.replace(base, **kw)


def slurm(cgroup: str = "v2", **kw) -> SlurmJob:
    return SlurmJob(
        **{
            "job_id": "5101",
            "user": "alice",
            "account": "vision",
            "step": "0",
            "task": 0,
            "cgroup": cgroup,
            **kw,
        }
    )


def pod(**kw) -> KubernetesJob:
    fields = {"namespace": "ml", "pod": "trainer-0", "pod_uid": UID, "container": "main", "container_id": CID}
    fields |= {"qos": "burstable", "driver": "systemd", "runtime": "containerd", "cgroup": "v2"}
    return KubernetesJob(**(fields | kw))


def test_slurm_cgroup_v2_path() -> None:
    assert procfs.cgroup(spec(slurm())) == "0::/system.slice/slurmstepd.scope/job_5101/step_0/user/task_0\n"


def test_slurm_cgroup_v1_has_one_line_per_hierarchy() -> None:
    lines = procfs.cgroup(spec(slurm("v1", step="batch", task=2))).splitlines()
    assert "10:memory:/slurm/uid_1001/job_5101/step_batch/task_2" in lines
    assert "8:cpuset:/slurm/uid_1001/job_5101/step_batch" in lines
    assert lines[-1] == "1:name=systemd:/system.slice/slurmd.service"
    assert all(line.count(":") >= 2 for line in lines)


@pytest.mark.parametrize(
    ("job", "path"),
    [
        (
            pod(),
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope",
        ),
        (
            pod(qos="guaranteed", runtime="cri-o"),
            f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope",
        ),
        (pod(driver="cgroupfs", qos="besteffort"), f"/kubepods/besteffort/pod{UID}/{CID}"),
        (pod(driver="cgroupfs", qos="guaranteed", runtime="cri-o"), f"/kubepods/pod{UID}/crio-{CID}"),
    ],
)
def test_kubernetes_cgroup_paths_follow_driver_runtime_and_qos(job: KubernetesJob, path: str) -> None:
    assert procfs.cgroup(spec(job)) == f"0::{path}\n"


def test_kubernetes_cgroup_v1_repeats_the_path_per_hierarchy() -> None:
    lines = procfs.cgroup(spec(pod(cgroup="v1"))).splitlines()
    assert len(lines) > 5 and all(line.endswith(f"cri-containerd-{CID}.scope") for line in lines)


def test_processes_without_a_job_live_in_a_user_session() -> None:
    assert procfs.cgroup(spec()).startswith("0::/user.slice/user-1001.slice/session-")


def test_environ_is_nul_separated_with_the_slurm_variables() -> None:
    view = procfs.ProcView(spec(slurm(), environ=(("OMP_NUM_THREADS", "8"),)), 4242, "GPU-x", "dgx-01")
    raw = procfs.environ(view)
    assert raw.endswith(b"\0")
    env = dict(item.split("=", 1) for item in raw.decode().split("\0") if item)
    assert env["SLURM_JOB_ID"] == "5101" and env["SLURM_JOB_USER"] == "alice"
    assert env["SLURM_JOB_ACCOUNT"] == "vision" and env["SLURMD_NODENAME"] == "dgx-01"
    assert env["OMP_NUM_THREADS"] == "8"


def _env(job: SlurmJob) -> dict[str, str]:
    raw = procfs.environ(procfs.ProcView(spec(job), 4242, "GPU-x", "dgx-01"))
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if item)


def test_a_named_slurm_job_has_its_name_in_the_environ() -> None:
    assert _env(slurm(name="vit-b16"))["SLURM_JOB_NAME"] == "vit-b16"


def test_a_slurm_job_without_a_name_has_no_name_variable() -> None:
    assert "SLURM_JOB_NAME" not in _env(slurm())


def test_an_array_task_has_the_array_variables_and_a_plain_job_none() -> None:
    env = _env(slurm(job_id="4711_3"))
    assert (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) == ("4711", "3")
    assert "SLURM_ARRAY_JOB_ID" not in _env(slurm()) and "SLURM_ARRAY_TASK_ID" not in _env(slurm())


def test_kubernetes_environ_names_the_pod_and_the_visible_device() -> None:
    view = procfs.ProcView(spec(pod()), 4242, "MIG-1234", "node")
    env = dict(item.split("=", 1) for item in procfs.environ(view).decode().split("\0") if item)
    assert env["HOSTNAME"] == "trainer-0" and env["NVIDIA_VISIBLE_DEVICES"] == "MIG-1234"
    assert "KUBERNETES_SERVICE_HOST" in env and "SLURM_JOB_ID" not in env


def test_status_comm_and_cmdline_formats() -> None:
    view = procfs.ProcView(spec(name="a-very-long-process-name"), 4242, "GPU-x", "n")
    status = procfs.status(view)
    assert "Uid:\t1001\t1001\t1001\t1001\n" in status and "Pid:\t4242\n" in status
    assert procfs.comm(view.spec) == "a-very-long-pro\n"
    assert procfs.cmdline(view.spec) == b"python\0train.py\0--lr\x000.1\0"


def test_node_files_add_and_remove_only_their_own_entries(tmp_path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "1").mkdir()  # someone else's
    files = procfs.NodeFiles(tmp_path / "proc", tmp_path / "pods", tmp_path / "map")
    a = procfs.ProcView(spec(pod()), 10, "GPU-x", "n")
    b = procfs.ProcView(spec(slurm(), pid=11), 11, "GPU-x", "n")
    files.sync([a, b], {"0": ["5101"], "1.9": ["7", "6"]})
    assert sorted(p.name for p in (tmp_path / "proc").iterdir()) == [".root", "1", "10", "11"]
    assert (tmp_path / "pods" / f"ml_trainer-0_{UID}" / "main" / "0.log").is_file()
    assert (tmp_path / "map" / "1.9").read_text() == "6\n7\n"
    files.sync([b], {"0": ["5101"]})
    assert sorted(p.name for p in (tmp_path / "proc").iterdir()) == [".root", "1", "11"]
    assert list((tmp_path / "pods").iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "map").iterdir()) == ["0"]
    files.clear()
    assert [p.name for p in (tmp_path / "proc").iterdir()] == ["1"]


def test_the_node_writes_procfs_and_mapping_files_for_dgx_h100(tmp_path) -> None:
    node = build_node(
        load_scenario("dgx-h100"),
        clock=ManualClock(T0),
        procfs_root=tmp_path / "proc",
        job_mapping_dir=tmp_path / "map",
    )
    assert (
        (tmp_path / "proc" / "210101" / "cgroup")
        .read_text()
        .startswith("0::/system.slice/slurmstepd.scope/job_5101/")
    )
    assert (tmp_path / "proc" / "3100" / "comm").read_text() == "nvidia-cuda-mps\n"
    mapping = {p.name: p.read_text() for p in (tmp_path / "map").iterdir()}
    assert mapping["0.2"] == "5101\n" and mapping["3"] == "5110\n"
    assert mapping["2"] == "5107\n5108\n5109\n"
    assert "7" not in mapping  # the idle GPU
    node.close()
    assert list((tmp_path / "proc").iterdir()) == []


def test_files_follow_processes_starting_and_ending(tmp_path) -> None:
    scenario = parse_scenario(
        {
            "gpus": [{"model": "A100-80GB"}],
            "processes": [
                {
                    "pid": 900,
                    "gpu": 0,
                    "start": "10s",
                    "end": "20s",
                    "job": {"mapping": {"id": "lsf-1"}},
                    "workload": {"pattern": "constant", "memory": "1GiB"},
                }
            ],
        },
        "t.yaml",
    )
    clock = ManualClock(T0)
    node = build_node(scenario, clock=clock, procfs_root=tmp_path / "proc", job_mapping_dir=tmp_path / "map")
    assert not (tmp_path / "proc" / "900").exists()
    clock.set(T0 + 15)
    node.gpu_state(0)
    assert (tmp_path / "proc" / "900" / "environ").is_file()
    assert (tmp_path / "map" / "0").read_text() == "lsf-1\n"
    clock.set(T0 + 25)
    node.gpu_state(0)
    assert not (tmp_path / "proc" / "900").exists() and not (tmp_path / "map" / "0").exists()
    assert isinstance(scenario.processes[0].job, MappingJob)


def test_kubernetes_pods_get_log_dirs(tmp_path) -> None:
    build_node(load_scenario("k8s-a100-mixed"), clock=ManualClock(T0), pods_root=tmp_path / "pods")
    names = {p.name.split("_")[1] for p in (tmp_path / "pods").iterdir()}
    assert {"chat-api-7d9f8c6b5-x2kqp", "jupyter-jane-0", "pretrain-llm-0"} <= names


def test_node_kubernetes_defaults_shape_every_pod_cgroup(tmp_path) -> None:
    scenario = parse_scenario(
        {
            "node": {"kubernetes": {"driver": "cgroupfs", "runtime": "cri-o", "cgroup": "v1"}},
            "gpus": [{"model": "A100-80GB"}],
            "processes": [
                {
                    "pid": 321,
                    "gpu": 0,
                    "job": {"kubernetes": {"namespace": "ml", "pod": "p-0", "uid": UID, "container_id": CID}},
                    "workload": {"pattern": "constant", "memory": "1GiB"},
                }
            ],
        },
        "t.yaml",
    )
    build_node(scenario, clock=ManualClock(T0), procfs_root=tmp_path)
    lines = (tmp_path / "321" / "cgroup").read_text().splitlines()
    assert len(lines) > 1 and all(line.endswith(f"/kubepods/burstable/pod{UID}/crio-{CID}") for line in lines)
