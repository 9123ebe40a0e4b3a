"""Parsing `/proc/<pid>/cgroup` into Slurm job / Kubernetes pod identity."""

from hypothesis import given
from hypothesis import strategies as st

from gpulens.exporter.attribution.cgroup import CgroupIdentity, parse_cgroup
from tests.attribution.fakes import CID_A, POD_UID_A, kube_cgroupfs, kube_systemd, slurm_v1, slurm_v2


def test_slurm_cgroup_v1_gives_job_uid_and_step():
    ident = parse_cgroup(slurm_v1("1234", uid=1001))
    assert (ident.slurm_job_id, ident.slurm_uid, ident.slurm_step) == ("1234", 1001, "0")


def test_slurm_cgroup_v1_with_node_suffixed_root():
    ident = parse_cgroup("7:devices:/slurm_node17/uid_5/job_99/step_batch/task_0\n")
    assert (ident.slurm_job_id, ident.slurm_uid, ident.slurm_step) == ("99", 5, "batch")


def test_slurm_cgroup_v2_gives_job_and_step():
    ident = parse_cgroup(slurm_v2("4321"))
    assert (ident.slurm_job_id, ident.slurm_uid, ident.slurm_step) == ("4321", None, "0")


def test_slurm_cgroup_v2_with_multiple_slurmd_scope():
    ident = parse_cgroup("0::/system.slice/node3_slurmstepd.scope/job_8/step_extern\n")
    assert ident.slurm_job_id == "8"


def test_kubernetes_systemd_containerd():
    ident = parse_cgroup(kube_systemd(POD_UID_A, CID_A))
    assert (ident.pod_uid, ident.container_id, ident.container_runtime) == (
        POD_UID_A,
        CID_A,
        "cri-containerd",
    )


def test_kubernetes_systemd_crio_and_docker():
    assert parse_cgroup(kube_systemd(POD_UID_A, CID_A, runtime="crio")).container_runtime == "crio"
    assert parse_cgroup(kube_systemd(POD_UID_A, CID_A, runtime="docker")).container_runtime == "docker"


def test_kubernetes_systemd_guaranteed_pod_has_no_qos_slice():
    under = POD_UID_A.replace("-", "_")
    text = f"0::/kubepods.slice/kubepods-pod{under}.slice/cri-containerd-{CID_A}.scope\n"
    assert parse_cgroup(text).pod_uid == POD_UID_A


def test_kubernetes_cgroupfs_besteffort_and_guaranteed():
    assert parse_cgroup(kube_cgroupfs(POD_UID_A, CID_A, qos="besteffort")).pod_uid == POD_UID_A
    text = f"0::/kubepods/pod{POD_UID_A}/{CID_A}\n"
    assert parse_cgroup(text) == CgroupIdentity(pod_uid=POD_UID_A, container_id=CID_A)


def test_kubernetes_nested_under_kind_node_prefix():
    text = f"0::/system.slice/docker-{'c' * 64}.scope/kubelet.slice/kubelet-kubepods.slice/" + kube_systemd(
        POD_UID_A, CID_A
    ).removeprefix("0::/")
    assert parse_cgroup(text).pod_uid == POD_UID_A


def test_static_pod_uid_without_dashes():
    uid = "6a0f4e4c1c2e7c3a9b8d7e6f5a4b3c2d"
    assert parse_cgroup(f"0::/kubepods/burstable/pod{uid}/{CID_A}\n").pod_uid == uid


def test_pod_without_container_component():
    ident = parse_cgroup(f"0::/kubepods/burstable/pod{POD_UID_A}\n")
    assert (ident.pod_uid, ident.container_id) == (POD_UID_A, None)


def test_plain_user_session_is_empty():
    assert parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n").empty


def test_pod_like_component_outside_kubepods_is_ignored():
    assert parse_cgroup(f"0::/system.slice/pod{POD_UID_A}/x\n").pod_uid is None


def test_job_component_outside_slurm_is_ignored():
    assert parse_cgroup("0::/user.slice/job_12/step_0\n").slurm_job_id is None


@given(st.text(max_size=400))
def test_arbitrary_text_never_raises(text):
    ident = parse_cgroup(text)
    assert ident.slurm_job_id is None or ident.slurm_job_id.isdigit()


@given(
    st.lists(
        st.tuples(
            st.integers(0, 20),
            st.sampled_from(["", "memory", "cpu,cpuacct", "name=systemd"]),
            st.lists(
                st.sampled_from(
                    [
                        "slurm",
                        "uid_7",
                        "job_5",
                        "step_0",
                        "kubepods",
                        "burstable",
                        f"pod{POD_UID_A}",
                        CID_A,
                        "system.slice",
                        "slurmstepd.scope",
                        "x:y",
                        "..",
                        "",
                    ]
                ),
                max_size=8,
            ),
        ),
        max_size=6,
    )
)
def test_structured_cgroup_lines_never_raise_and_ids_come_from_the_text(lines):
    text = "".join(f"{n}:{c}:/{'/'.join(parts)}\n" for n, c, parts in lines)
    ident = parse_cgroup(text)
    if ident.slurm_job_id is not None:
        assert f"job_{ident.slurm_job_id}" in text
    if ident.pod_uid is not None:
        assert ident.pod_uid in text.replace("_", "-") and "kubepods" in text
