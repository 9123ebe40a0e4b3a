"""emit: the plan on real hosts, changed where a tool cannot express it, and every file valid."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens.analyzer import emit as em
from gpulens.analyzer.hosts import Orchestrator
from gpulens.analyzer.plan import Plan
from gpulens.analyzer.validate import device_plugin as dp
from gpulens.catalog import GIB
from tests.analyzer.slurmd import slurmd_gres

A100 = "A100-SXM4-40GB"
H100 = "H100-80GB"
HOUR = 3600.0


def plan(*layout):
    return Plan(0, 0, 0, {}, 0.0, 0.0, 1.0, list(layout), {})


def mps_gpu(name, *clients, model=A100):
    return {
        "gpu": name,
        "model": model,
        "sharing": "mps",
        "jobs": [c[0] for c in clients],
        "mps_clients": [
            {
                "job_id": job,
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": pct,
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": 8 * GIB,
            }
            for job, pct in clients
        ],
    }


def whole_gpu(name, *jobs, model=A100):
    return {"gpu": name, "model": model, "sharing": "exclusive", "jobs": list(jobs)}


def mig_gpu(name, *slices, model=H100):
    return {
        "gpu": name,
        "model": model,
        "sharing": "mig",
        "jobs": [j for j, _ in slices],
        "mig_layout": [{"profile": p, "start": None, "job_id": j} for j, p in slices],
    }


def context(hosts, source="slurm", jobs=(), model=A100):
    """`hosts`: name -> GPU count; every job runs over the same hour on GPU 0 of the first host."""
    gpus = [
        {"uuid": f"GPU-{h}-{i}", "model": model, "instance": f"{h}:9400", "gpu": str(i)}
        for h, n in hosts.items()
        for i in range(n)
    ]
    first = next(iter(hosts))
    rows = [
        {
            "job_id": j,
            "uuids": f"GPU-{first}-0",
            "instance": first,
            "gpu_model": model,
            "job_source": source,
            "start": 0.0,
            "end": HOUR,
        }
        for j in jobs
    ]
    ctx = em.context_from_rows(rows, gpus)
    assert all(ctx.inventory.orchestrator(h) in (Orchestrator(source), Orchestrator.UNKNOWN) for h in hosts)
    return ctx


def test_slurm_mps_uses_the_real_host_and_one_count_of_100_per_shared_gpu():
    out = em.emit(plan(mps_gpu("g", ("a", 50), ("b", 40))), context({"node-7": 4}, jobs="ab"))
    gres = out.files["gres.conf"]
    assert "NodeName=node-7 Name=mps Count=100 File=/dev/nvidia0" in gres
    assert re.findall(r"--gres=mps:(\d+)", gres) == ["50", "40"]
    assert out.files["slurm-nodes.conf"].splitlines()[-1] == (
        "NodeName=node-7 Gres=gpu:nvidia_a100-sxm4-40gb:4,mps:100"
    )
    assert out.adjustments == []


def test_real_slurmd_reads_the_emitted_files(tmp_path):
    out = em.emit(plan(mps_gpu("g", ("a", 50), ("b", 40))), context({"node-7": 4}, jobs="ab"))
    lines = slurmd_gres(tmp_path, out.files["gres.conf"], out.files["slurm-nodes.conf"], "node-7", 4)
    assert {(g["name"], g["file"], g["count"]) for g in lines if g["name"] == "mps"} >= {
        ("mps", "/dev/nvidia0", "100")
    }


def test_slurm_mps_shares_past_100_become_shards():
    out = em.emit(plan(mps_gpu("g", ("a", 60), ("b", 55))), context({"node-7": 4}, jobs="ab"))
    assert [a.what for a in out.adjustments] == ["slurm-mps-over-100"]
    assert "Name=shard Count=2 File=/dev/nvidia0" in out.files["gres.conf"]
    assert "--gres=mps" not in out.files["gres.conf"]


def test_a_lone_sharer_becomes_a_whole_gpu():
    out = em.emit(plan(mps_gpu("g", ("a", 30))), context({"node-7": 2}, jobs="a"))
    assert [a.what for a in out.adjustments] == ["lone-sharer"]
    assert "Name=mps" not in out.files["gres.conf"]
    assert "--gres=gpu:nvidia_a100-sxm4-40gb:1" in out.files["gres.conf"]


def test_kubernetes_mps_is_one_configmap_key_selected_by_the_node_label():
    out = em.emit(
        plan(mps_gpu("g", ("a", 30), ("b", 30), ("c", 30))), context({"k8s-1": 2}, "kubernetes", "abc")
    )
    problems, configs = dp.validate_configmap(out.files["device-plugin-configmap.yaml"], "cm")
    assert problems == []
    assert configs["gpulens-mps-3"]["sharing"]["mps"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 3}
    ]
    assert (
        "kubectl label node k8s-1 nvidia.com/device-plugin.config=gpulens-mps-3 --overwrite"
        in out.files["node-labels.sh"]
    )
    assert "gres.conf" not in out.files  # a Kubernetes node gets no Slurm files


def test_the_emitted_configmap_passes_the_kubernetes_schema():
    validator = pytest.importorskip("kubernetes_validate")
    out = em.emit(plan(mps_gpu("g", ("a", 30), ("b", 30))), context({"k8s-1": 2}, "kubernetes", "ab"))
    doc = yaml.safe_load(out.files["device-plugin-configmap.yaml"])
    validator.validate(doc, validator.latest_version(), strict=True)


def test_mps_shares_above_the_device_plugins_equal_split_make_the_node_time_sliced():
    out = em.emit(
        plan(mps_gpu("g", ("a", 55), ("b", 20), ("c", 10))), context({"k8s-1": 2}, "kubernetes", "abc")
    )
    assert [a.what for a in out.adjustments] == ["mps-equal-split"]
    assert out.adjustments[0].jobs == ("a",)
    _, configs = dp.validate_configmap(out.files["device-plugin-configmap.yaml"], "cm")
    assert "timeSlicing" in configs["gpulens-time-slicing-3"]["sharing"]


def test_a_kubernetes_node_with_shared_and_whole_gpus_is_time_sliced_and_says_so():
    out = em.emit(
        plan(mps_gpu("g", ("a", 30), ("b", 30)), whole_gpu("w", "x")),
        context({"k8s-1": 4}, "kubernetes", "abx"),
    )
    assert {a.what for a in out.adjustments} == {"mps-beside-whole", "shared-node"}
    assert "nvidia.com/device-plugin.config=gpulens-time-slicing-2 " in out.files["node-labels.sh"]


def test_shared_and_whole_gpus_go_to_separate_kubernetes_nodes_when_there_are_several():
    out = em.emit(
        plan(mps_gpu("g", ("a", 30), ("b", 30)), whole_gpu("w", "x")),
        context({"k8s-1": 2, "k8s-2": 2}, "kubernetes", "abx"),
    )
    assert out.adjustments == []
    labels = out.files["node-labels.sh"]
    assert "k8s-1 nvidia.com/device-plugin.config=gpulens-mps-2" in labels
    assert "k8s-2 nvidia.com/device-plugin.config=gpulens-exclusive" in labels


def test_a_planned_gpu_the_fleet_does_not_have_is_not_emitted():
    out = em.emit(plan(whole_gpu("w1", "x"), whole_gpu("w2", "y")), context({"node-7": 1}, jobs="xy"))
    assert [a.what for a in out.adjustments] == ["unplaced"]
    assert out.files["gres.conf"].count("--gres=gpu:") == 1


def test_a_planned_gpu_of_pods_is_never_placed_on_a_slurm_node():
    def row(job, host, source):
        return {
            "job_id": job,
            "uuids": f"GPU-{host}-0",
            "instance": host,
            "gpu_model": A100,
            "job_source": source,
            "start": 0.0,
            "end": HOUR,
        }

    gpus = [
        {"uuid": f"GPU-{h}-{i}", "model": A100, "instance": f"{h}:9400", "gpu": str(i)}
        for h, n in {"k8s-1": 1, "slurm-1": 2}.items()
        for i in range(n)
    ]
    rows = [row("x", "k8s-1", "kubernetes"), row("a", "k8s-1", "kubernetes"), row("b", "k8s-1", "kubernetes")]
    ctx = em.context_from_rows([*rows, row("s", "slurm-1", "slurm")], gpus)
    kept = {"gpu": "u", "model": A100, "sharing": "unchanged", "jobs": ["x"], "uuid": "GPU-k8s-1-0"}
    out = em.emit(plan(kept, mps_gpu("g", ("a", 30), ("b", 30))), ctx)
    # slurm-1's GPU 1 is free, but no pod can run there: the pods stay where they are
    assert [(a.what, a.jobs) for a in out.adjustments] == [("unplaced", ("a", "b"))]
    assert "on a kubernetes node" in out.adjustments[0].message
    assert out.placement is not None
    assert [g for g in out.placement.gpus if g.host == "slurm-1" and set(g.jobs) & {"a", "b"}] == []


def test_mig_geometry_is_a_per_host_config_with_the_models_device_filter():
    out = em.emit(
        plan(mig_gpu("m", ("a", "3g.40gb"), ("b", "1g.10gb")), whole_gpu("w", "c", model=H100)),
        context({"dgx-1": 2}, jobs="abc", model=H100),
    )
    spec = yaml.safe_load(out.files["mig-parted.yaml"])
    assert spec["mig-configs"]["gpulens-dgx-1"] == [
        {
            "device-filter": ["0x233010DE"],
            "devices": [0],
            "mig-enabled": True,
            "mig-devices": {"1g.10gb": 1, "3g.40gb": 1},
        },
        {"devices": [1], "mig-enabled": False},
    ]
    assert "NodeName=dgx-1 AutoDetect=nvml" in out.files["gres.conf"]
    assert "--gres=gpu:3g.40gb:1" in out.files["gres.conf"]


def test_every_emitted_file_has_an_apply_step():
    out = em.emit(
        plan(mig_gpu("m", ("a", "3g.40gb")), mps_gpu("g", ("b", 30), ("c", 30), model=H100)),
        context({"dgx-1": 2}, "unknown", "abc", model=H100),
    )
    assert {s.file for s in out.apply} == set(out.files) - {"slurm-nodes.conf"}


def test_config_names_are_label_values_even_for_long_host_names():
    name = em.config_name("gpulens", "a" * 80 + ".example.com")
    assert len(name) <= 63 and dp.label_value_problem(name) is None


REPO = Path(__file__).resolve().parents[2]


def migcheck() -> str:
    """tools/migcheck: $GPULENS_MIGCHECK (make test sets it), else the cache `make migcheck` builds."""
    binary = Path(
        os.environ.get("GPULENS_MIGCHECK") or Path.home() / ".cache" / "gpulens-tools" / "bin" / "migcheck"
    )
    if not binary.exists():
        if shutil.which("go") is None:
            pytest.skip("Go is not installed: tools/migcheck cannot be built")
        subprocess.run(["make", "-s", "migcheck"], cwd=REPO, check=True, timeout=900)
    return str(binary)


def test_nvidias_own_profile_tables_accept_the_emitted_mig_config(tmp_path):
    out = em.emit(
        plan(mig_gpu("m", ("a", "3g.40gb"), ("b", "2g.20gb"), ("c", "1g.10gb"), ("d", "1g.10gb"))),
        context({"dgx-1": 1}, jobs="abcd", model=H100),
    )
    path = tmp_path / "mig-parted.yaml"
    path.write_text(out.files["mig-parted.yaml"])
    done = subprocess.run([migcheck(), str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok: ")


def test_nvidias_profile_tables_reject_a_profile_the_gpu_does_not_have(tmp_path):
    path = tmp_path / "mig-parted.yaml"
    path.write_text(
        "version: v1\nmig-configs:\n  c:\n  - device-filter: ['0x233010DE']\n    devices: [0]\n"
        "    mig-enabled: true\n    mig-devices: {'1g.5gb': 1}\n"
    )
    done = subprocess.run([migcheck(), str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "1g.5gb is not a MIG profile of NVIDIA H100 80GB HBM3" in done.stdout


client = st.tuples(st.sampled_from("abcdefgh"), st.integers(1, 100))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.lists(st.lists(client, min_size=1, max_size=5, unique_by=lambda c: c[0]), min_size=1, max_size=5),
    source=st.sampled_from(["slurm", "kubernetes", "unknown"]),
    hosts=st.integers(1, 3),
)
def test_emit_changes_what_a_tool_cannot_express_instead_of_failing(gpus, source, hosts):
    layout = [mps_gpu(f"g{i}", *[(f"{i}{j}", pct) for j, pct in clients]) for i, clients in enumerate(gpus)]
    jobs = [c["job_id"] for entry in layout for c in entry["mps_clients"]]
    ctx = context({f"node-{h}": 2 for h in range(hosts)}, source, jobs)
    out = em.emit(plan(*layout), ctx)  # raises InvalidConfig if a file broke its tool's rules
    assert out.placement is not None
    assert len(out.placement.gpus) <= 2 * hosts


def test_a_layout_entry_that_names_its_gpu_lands_on_it():
    entry = {**whole_gpu("w", "x"), "uuid": "GPU-node-7-2"}
    out = em.emit(plan(entry), context({"node-7": 4}, jobs="x"))
    assert "# job x on node-7 /dev/nvidia2: --gres=gpu:" in out.files["gres.conf"]


def test_without_a_context_the_plans_own_nodes_are_the_hosts():
    entry = {**mps_gpu("g", ("a", 50), ("b", 40)), "node": "node-9", "uuid": "GPU-9-0"}
    out = em.emit(plan(entry))
    assert "NodeName=node-9 Name=mps Count=100 File=/dev/nvidia0" in out.files["gres.conf"]


def test_a_fleet_of_inventory_objects_gives_the_context():
    from dataclasses import dataclass

    @dataclass
    class Gpu:
        uuid: str
        model: str
        node: str
        index: int

    ctx = em.context_from_fleet([Gpu("GPU-1", A100, "n1", 3), Gpu("GPU-2", A100, "n1", 1)])
    assert [(s.host, s.index, s.uuid) for s in ctx.inventory.gpus] == [("n1", 1, "GPU-2"), ("n1", 3, "GPU-1")]
