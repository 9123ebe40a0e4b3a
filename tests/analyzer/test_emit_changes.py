"""emit writes changes against what each node runs now, never whole-fleet targets (issue 30 item 1-2)."""

from __future__ import annotations

import re
from typing import Any

import yaml

from gpulens.analyzer import emit as em
from gpulens.analyzer.nodestate import Mode, gpus_now
from gpulens.analyzer.plan import Plan
from tests.analyzer.nodefiles import check_all, mig_after
from tests.analyzer.test_emit import A100, H100, HOUR, mig_gpu, mps_gpu, whole_gpu

A100_80 = "A100-80GB"


def plan(*layout: dict[str, Any]) -> Plan:
    return Plan(0, 0, 0, {}, 0.0, 0.0, 1.0, list(layout), {})


def fleet(
    gpus: dict[str, list[tuple[str, ...]]], source: str = "kubernetes", model: str = A100_80
) -> em.FleetContext:
    """`gpus`: host -> one tuple per GPU index: (mode, job, job, ...); a MIG job is `job@profile`."""
    inventory = []
    rows = []
    for host, layout in gpus.items():
        for index, (mode, *jobs) in enumerate(layout):
            uuid = f"GPU-{host}-{index}"
            inventory.append({"uuid": uuid, "model": model, "instance": host, "gpu": str(index)})
            for job in jobs:
                name, _, profile = job.partition("@")
                rows.append(
                    {
                        "job_id": name,
                        "uuids": uuid,
                        "instance": host,
                        "gpu_model": model,
                        "job_source": source,
                        "start": 0.0,
                        "end": HOUR,
                        "sharing": mode,
                        "mig_profile_now": profile,
                    }
                )
    return em.context_from_rows(rows, inventory)


def on(entry: dict[str, Any], host: str, index: int) -> dict[str, Any]:
    return {**entry, "uuid": f"GPU-{host}-{index}"}


def test_the_state_now_is_read_per_gpu_from_the_jobs_rows():
    rows = [
        {"job_id": "a", "uuids": "G0", "sharing": "mig", "mig_profile_now": "1g.10gb"},
        {"job_id": "b", "uuids": "G0", "sharing": "mig", "mig_profile_now": "1g.10gb"},
        {"job_id": "c", "uuids": "G1", "sharing": "time_slicing", "mig_profile_now": ""},
    ]
    now = gpus_now(rows)
    assert now["G0"].mode is Mode.MIG and now["G0"].mig_profiles == (("1g.10gb", 2),)
    assert now["G1"].mode is Mode.TIME_SLICING and now["G1"].jobs == frozenset({"c"})


def test_a_plan_that_leaves_every_gpu_as_it_runs_emits_no_file_and_says_so():
    ctx = fleet({"w3": [("time-slicing", "a", "b"), ("mig", "c@2g.20gb", "d@1g.10gb"), ("exclusive", "e")]})
    layout = [
        {**on(whole_gpu("g0", "a", "b", model=A100_80), "w3", 0), "sharing": "unchanged"},
        {**on(whole_gpu("g1", "c", "d", model=A100_80), "w3", 1), "sharing": "unchanged"},
        on(whole_gpu("g2", "e", model=A100_80), "w3", 2),  # planned exactly as it runs
    ]
    out = em.emit(plan(*layout), ctx)
    assert out.files == {} and out.changes == []
    assert any("changes no GPU" in note for note in out.notes)


def test_only_the_node_the_plan_changes_gets_lines_in_any_file():
    ctx = fleet(
        {"n1": [("exclusive", "a"), ("exclusive", "b")], "n2": [("exclusive", "c"), ("exclusive", "d")]}
    )
    layout = [
        on(mps_gpu("s", ("a", 40), ("b", 40), model=A100_80), "n1", 0),
        on(whole_gpu("g2", "c", model=A100_80), "n2", 0),
        on(whole_gpu("g3", "d", model=A100_80), "n2", 1),
    ]
    out = em.emit(plan(*layout), ctx)
    assert {c.host for c in out.changes} == {"n1"}
    assert "n2" not in "".join(out.files.values())
    assert "kubectl label node n1 " in out.files[em.LABELS_FILE]


def test_every_change_names_the_node_the_gpu_before_and_after_and_the_jobs():
    ctx = fleet({"n1": [("exclusive", "a"), ("exclusive", "b")]})
    out = em.emit(plan(on(mps_gpu("s", ("a", 40), ("b", 40), model=A100_80), "n1", 0)), ctx)
    by_gpu = {c.where: c for c in out.changes}
    assert by_gpu["n1/GPU 0"].before == "exclusive: a" and by_gpu["n1/GPU 0"].after == "mps: a, b"
    assert by_gpu["n1/GPU 0"].jobs == ("a", "b")
    assert by_gpu["n1/GPU 1"].before == "exclusive: b" and by_gpu["n1/GPU 1"].after == "free"


def test_a_mig_gpu_left_as_it_is_keeps_the_mixed_strategy_on_a_changed_node():
    ctx = fleet(
        {"w3": [("exclusive", "a"), ("mig", "c@2g.20gb", "d@1g.10gb", "e@1g.10gb"), ("exclusive", "b")]}
    )
    layout = [
        on(mps_gpu("s", ("a", 40), ("b", 40), model=A100_80), "w3", 0),
        {**on(whole_gpu("g1", "c", "d", "e", model=A100_80), "w3", 1), "sharing": "unchanged"},
    ]
    out = em.emit(plan(*layout), ctx)
    key = re.search(r"device-plugin.config=(\S+)", out.files[em.LABELS_FILE])
    assert key is not None
    config = yaml.safe_load(yaml.safe_load(out.files[em.CONFIGMAP_FILE])["data"][key[1]])
    assert config["flags"]["migStrategy"] == "mixed"
    assert mig_after(out, "w3")[1] == {"2g.20gb": 1, "1g.10gb": 2}  # mig-parted leaves it alone
    assert check_all(out) == []


def test_a_freed_mig_gpu_is_cleared_and_every_tool_sees_it_whole():
    ctx = fleet({"s1": [("mig", "a@3g.40gb"), ("exclusive", "b"), ("exclusive", "c")]}, "slurm", H100)
    layout = [on(mig_gpu("m", ("b", "3g.40gb"), ("c", "2g.20gb"), ("a", "1g.10gb")), "s1", 1)]
    out = em.emit(plan(*layout), ctx)
    assert mig_after(out, "s1") == {0: None, 1: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, 2: None}
    assert "Name=gpu Type=" not in out.files[em.GRES_FILE]  # AutoDetect: slurmd reads MIG itself
    assert out.files[em.SLURM_NODES_FILE].splitlines()[-1] == (
        "NodeName=s1 Gres=gpu:1g.10gb:1,gpu:2g.20gb:1,gpu:3g.40gb:1,gpu:nvidia_h100_80gb_hbm3:2"
    )
    assert check_all(out) == []
    assert [c.after for c in out.changes if c.index == 0] == ["free (MIG disabled)"]


def test_an_mps_gpu_left_as_it_is_keeps_its_mps_count_on_a_changed_slurm_node():
    ctx = fleet({"s1": [("mps", "a", "b"), ("exclusive", "c"), ("exclusive", "d")]}, "slurm", A100)
    layout = [
        {**on(whole_gpu("g0", "a", "b", model=A100), "s1", 0), "sharing": "unchanged"},
        on(mps_gpu("s", ("c", 40), ("d", 40), model=A100), "s1", 1),
    ]
    out = em.emit(plan(*layout), ctx)
    gres = out.files[em.GRES_FILE]
    assert "NodeName=s1 Name=mps Count=100 File=/dev/nvidia0" in gres
    assert "NodeName=s1 Name=mps Count=100 File=/dev/nvidia1" in gres
    assert "job a " not in gres and "job c on s1 /dev/nvidia1: --gres=mps:40" in gres
    assert out.files[em.SLURM_NODES_FILE].splitlines()[-1].endswith(",mps:200")
