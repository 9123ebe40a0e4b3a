"""`gpulens sim apply-plan A.yaml B.yaml --report DIR --out DIR`: a fleet's scenarios applied at once,
so a job the plan moves from one node to another leaves the one and joins the other.

The Kubernetes fleet is tests/data/fixedpoint/cross-node-{a,b}.yaml (simulated together; the plan
packs node a's embedding pod with node b's two pods as MPS clients on node b's GPU 0). The Slurm
cases use a plan written here (only what apply-plan reads: plan.json and jobs.json).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulens.analyzer.workload import pod_owner
from gpulens.cli import main
from gpulens.sim.applyfiles import apply_plan_files
from gpulens.sim.applyplan import job_key
from gpulens.sim.history import simulate
from gpulens.sim.reportplan import ApplyPlanError
from gpulens.sim.scenario import KubernetesJob, Scenario, SlurmJob
from gpulens.sim.scenariofile import load_scenario

TESTS = Path(__file__).resolve().parents[1]
NODE_A, NODE_B = (TESTS / "data" / "fixedpoint" / f"cross-node-{n}.yaml" for n in ("a", "b"))
PAIR = tuple(TESTS / "data" / "weekpair" / f for f in ("week1.yaml", "week1-shared.yaml"))
EMBED = "search/embed-6c5b4a3f2-j8k9l"  # runs on node a; the plan puts it on node b
EMBEDDER = "search/embed-6c5b4a3f2"  # its workload (jobs.json): the pod's name less its suffix
DAY, STEP, START = 86400.0, 300.0, 1_750_000_200.0


def _week1(nodes: tuple[Path, ...], root: Path) -> Path:
    simulate([str(p) for p in nodes], duration_s=DAY, out=root / "history", step_s=STEP, start=START)
    assert main(["report", "--history", str(root / "history"), "--out", str(root / "report")]) == 0
    return root / "report"


@pytest.fixture(scope="module")
def cross_report(tmp_path_factory) -> Path:
    return _week1((NODE_A, NODE_B), tmp_path_factory.mktemp("cross"))


@pytest.fixture(scope="module")
def applied(cross_report, tmp_path_factory) -> list[Scenario]:
    return apply_plan_files([str(NODE_A), str(NODE_B)], cross_report, tmp_path_factory.mktemp("w2") / "out")


def _layout_entry(report: Path, job: str) -> dict[str, Any]:
    layout: list[dict[str, Any]] = json.loads((report / "plan.json").read_text())["layout"]
    (entry,) = [e for e in layout if job in e["jobs"]]
    return entry


def _pods(scenario: Scenario) -> dict[str, list[Any]]:
    """Per workload (namespace/owner): its processes."""
    out: dict[str, list[Any]] = {}
    for p in scenario.processes:
        assert isinstance(p.job, KubernetesJob)
        out.setdefault(f"{p.job.namespace}/{pod_owner(p.job.pod)}", []).append(p)
    return out


def test_the_plan_moves_the_embedding_pod_from_node_a_to_node_b(cross_report):
    entry = _layout_entry(cross_report, EMBED)
    assert (entry["node"], entry["sharing"]) == ("k8s-a100-b", "mps")


def test_a_job_moved_to_another_node_runs_on_its_planned_gpu_there_and_no_longer_on_its_old_node(
    cross_report, applied
):
    node_a, node_b = applied
    entry = _layout_entry(cross_report, EMBED)
    (moved,) = _pods(node_b)[EMBEDDER]
    assert node_b.gpus[moved.gpu].uuid == entry["uuid"] and moved.kind == "mps_client"
    assert EMBEDDER not in _pods(node_a)
    before = next(p for p in load_scenario(NODE_A).processes if job_key(p) == EMBED)
    assert isinstance(moved.job, KubernetesJob) and moved.job.pod != "embed-6c5b4a3f2-j8k9l"
    assert (moved.workload, moved.cmdline, moved.uid) == (before.workload, before.cmdline, before.uid)


def test_the_gpu_a_moved_job_leaves_is_left_empty(cross_report, applied):
    node_a, _ = applied
    freed = {f["uuid"] for f in json.loads((cross_report / "plan.json").read_text())["freed"]}
    (left,) = [g.index for g in node_a.gpus if g.uuid in freed]
    assert not [p for p in node_a.processes if p.gpu == left]


def test_the_fleet_form_writes_one_file_a_node_named_as_its_scenario_that_reads_back_equal(applied):
    assert [Path(s.source).name for s in applied] == ["cross-node-a.yaml", "cross-node-b.yaml"]
    assert len({Path(s.source).parent for s in applied}) == 1
    assert [load_scenario(s.source) for s in applied] == applied


def test_without_moves_across_nodes_the_fleet_form_writes_what_the_one_node_form_writes(tmp_path):
    report = _week1(PAIR, tmp_path / "week1")
    fleet = apply_plan_files([str(p) for p in PAIR], report, tmp_path / "fleet")
    for source, written in zip(PAIR, fleet, strict=True):
        alone = apply_plan_files(str(source), report, tmp_path / source.name)
        assert Path(written.source).read_text() == (tmp_path / source.name).read_text()
        assert alone.processes == written.processes and alone.gpus == written.gpus


@pytest.mark.parametrize("form", ["one node", "fleet"])
def test_a_plan_moving_a_job_to_a_node_not_given_is_one_clear_error(cross_report, tmp_path, form):
    out = tmp_path / "out.yaml" if form == "one node" else tmp_path / "out"
    with pytest.raises(ApplyPlanError) as error:
        apply_plan_files(str(NODE_A) if form == "one node" else [str(NODE_A)], cross_report, out)
    assert str(error.value).startswith(
        f"plan.json: layout: {EMBED} moves from k8s-a100-a ({NODE_A}) to k8s-a100-b: "
        "expected that node's scenario given too"
    )
    assert "\n" not in str(error.value) and not out.exists()


def test_a_job_arriving_from_a_node_not_given_names_what_is_missing(cross_report, tmp_path):
    with pytest.raises(ApplyPlanError) as error:
        apply_plan_files(str(NODE_B), cross_report, tmp_path / "out.yaml")
    assert f"{EMBED!r}: expected a job of scenario fixedpoint-cross-node-b, found none" in str(error.value)
    assert "needs that node's scenario given too" in str(error.value)


def test_the_command_applies_a_fleet_into_a_directory(cross_report, tmp_path, capsys):
    out = tmp_path / "week2"
    args = ["sim", "apply-plan", str(NODE_A), str(NODE_B), "--report", str(cross_report), "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == [
        str(out / "cross-node-a.yaml"),
        str(out / "cross-node-b.yaml"),
    ]
    assert sorted(p.name for p in out.iterdir()) == ["cross-node-a.yaml", "cross-node-b.yaml"]


def test_the_command_refuses_to_replace_a_directory_holding_other_files(cross_report, tmp_path, capsys):
    out = tmp_path / "home"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = ["sim", "apply-plan", str(NODE_A), str(NODE_B), "--report", str(cross_report), "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpulens: error: {out}: cannot write: holds notes.txt") and err.count("\n") == 1
    assert (out / "notes.txt").read_text() == "mine"


# --- Slurm: a job requeued onto another node --------------------------------------------------


def _slurm_node(
    root: Path, host: str, users: dict[str, int], jobs: list[tuple[int, str, str]], model: str = "A100-80GB"
) -> Path:
    """A Slurm node with two GPUs (A100s unless told) and a job (pid, id, user) on each of the first GPUs."""
    doc = {
        "name": host,
        "node": {"hostname": host},
        "users": users,
        "gpus": [{"model": model, "count": 2}],
        "processes": [
            {
                "pid": pid,
                "gpu": gpu,
                "cmdline": ["python", "train.py"],
                "job": {"slurm": {"id": job_id, "user": user, "account": "ml", "name": f"job-{job_id}"}},
                "start": "-1d",
                "workload": {"pattern": "constant", "memory": "8GiB", "sm": 0.2, "busy": 0.3},
            }
            for gpu, (pid, job_id, user) in enumerate(jobs)
        ],
    }
    path = root / f"{host}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _slurm_report(root: Path, a: Scenario, b: Scenario) -> Path:
    """A plan that time-slices node b's GPU 0 with its job and node a's job 7001, freeing node a's GPU 0."""
    layout = [
        {"node": b.hostname, "uuid": b.gpus[0].uuid, "sharing": "time-slicing", "jobs": ["8001", "7001"]},
        {"node": a.hostname, "uuid": a.gpus[1].uuid, "sharing": "unchanged", "jobs": ["7002"]},
    ]
    freed = [{"node": a.hostname, "uuid": a.gpus[0].uuid}]
    root.mkdir()
    (root / "plan.json").write_text(json.dumps({"layout": layout, "freed": freed}))
    rows = [{"job_id": j, "action": "change" if j == "7001" else "keep"} for j in ("7001", "7002", "8001")]
    (root / "jobs.json").write_text(json.dumps({"jobs": rows}))
    return root


def test_a_slurm_job_moved_to_another_node_is_requeued_there_under_an_id_no_node_uses(tmp_path):
    a = _slurm_node(tmp_path, "slurm-a", {"erin": 2001}, [(71001, "7001", "erin"), (71002, "7002", "erin")])
    b = _slurm_node(tmp_path, "slurm-b", {}, [(81001, "8001", "frank")])
    report = _slurm_report(tmp_path / "report", load_scenario(a), load_scenario(b))
    node_a, node_b = apply_plan_files([str(a), str(b)], report, tmp_path / "out")
    (moved,) = [p for p in node_b.processes if isinstance(p.job, SlurmJob) and p.job.user == "erin"]
    assert moved.gpu == 0 and (moved.job.name, moved.job.account, moved.uid) == ("job-7001", "ml", 2001)
    assert moved.job.job_id not in {"7001", "7002", "8001"}
    assert [job_key(p) for p in node_a.processes] == ["7002"]


def test_a_job_downsized_onto_a_smaller_model_keeps_its_work_in_sm_cycles(tmp_path):
    # the analyzer downsizes by SMs x max SM clock (recommend.capability), the clock the engine runs
    # a loaded GPU at: 20 % of an A100 (108 SMs at 1410 MHz) is 25.7 % of an L4 (58 at 2040), not
    # the 37 % its SMs alone would make it (tests/data/fixedpoint/downsize-*.yaml)
    a = _slurm_node(tmp_path, "slurm-a", {"erin": 2001}, [(71001, "7001", "erin")])
    b = _slurm_node(tmp_path, "slurm-l4", {}, [], model="L4")
    before_a, before_b = load_scenario(a), load_scenario(b)
    report = tmp_path / "report"
    report.mkdir()
    layout = [{"node": "slurm-l4", "uuid": before_b.gpus[1].uuid, "sharing": "exclusive", "jobs": ["7001"]}]
    freed = [{"node": "slurm-a", "uuid": g.uuid} for g in before_a.gpus]
    (report / "plan.json").write_text(json.dumps({"layout": layout, "freed": freed}))
    (report / "jobs.json").write_text(json.dumps({"jobs": [{"job_id": "7001", "action": "change"}]}))
    _, node_b = apply_plan_files([str(a), str(b)], report, tmp_path / "out")
    (moved,) = node_b.processes
    l4, a100 = node_b.gpus[1].model, before_a.gpus[0].model
    assert moved.gpu == 1 and moved.workload.sm * l4.sm_count * l4.max_sm_clock_mhz == pytest.approx(
        0.2 * a100.sm_count * a100.max_sm_clock_mhz, rel=1e-5
    )
    assert moved.workload.busy == 0.3  # its kernels run as much of the time as before


def test_a_node_the_plan_empties_is_applied_with_its_gpus_freed_and_no_jobs(tmp_path):
    # the plan moves node a's only job to node b: node a is in no layout entry, only in `freed`
    a = _slurm_node(tmp_path, "slurm-a", {"erin": 2001}, [(71001, "7001", "erin")])
    b = _slurm_node(tmp_path, "slurm-b", {}, [(81001, "8001", "frank")])
    before_a, before_b = load_scenario(a), load_scenario(b)
    report = tmp_path / "report"
    report.mkdir()
    layout = [
        {
            "node": "slurm-b",
            "uuid": before_b.gpus[0].uuid,
            "sharing": "time-slicing",
            "jobs": ["8001", "7001"],
        }
    ]
    freed = [{"node": "slurm-a", "uuid": g.uuid} for g in before_a.gpus]
    (report / "plan.json").write_text(json.dumps({"layout": layout, "freed": freed}))
    rows = [{"job_id": "7001", "action": "change"}, {"job_id": "8001", "action": "keep"}]
    (report / "jobs.json").write_text(json.dumps({"jobs": rows}))
    node_a, node_b = apply_plan_files([str(a), str(b)], report, tmp_path / "out")
    assert (node_a.processes, len(node_a.gpus)) == ((), 2)
    assert sorted(p.job.user for p in node_b.processes if isinstance(p.job, SlurmJob)) == ["erin", "frank"]


def test_the_same_node_given_twice_is_a_one_line_error(tmp_path):
    a = _slurm_node(tmp_path, "slurm-a", {}, [(71001, "7001", "erin")])
    twin = tmp_path / "twin"
    twin.mkdir()
    copy = twin / "slurm-a-again.yaml"
    copy.write_text(a.read_text())
    with pytest.raises(ApplyPlanError) as error:
        apply_plan_files([str(a), str(copy)], tmp_path, tmp_path / "out")
    assert str(error.value) == (
        f"{copy}: node.hostname: expected one scenario a node, found slurm-a again (also {a})"
    )
