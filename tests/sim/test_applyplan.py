"""`gpulens sim apply-plan`: week 1's scenarios and report -> week 2 as an SRE who applied the plan runs it.

The week pair is two Kubernetes nodes simulated together (tests/data/weekpair/README.md):
week1.yaml (k8s-weekpair-1) has two small pods on MIG 2x 3g.40gb (re-sliced to 2x 1g.10gb on GPU
0) and a busy trainer on GPU 1 (kept); week1-shared.yaml (k8s-weekpair-2) has four under-used pods
on GPUs 0-3, which the plan packs as MPS clients onto one GPU, shared the way the NVIDIA device
plugin's MPS shares it. Each node's week 2 is `apply_plan_files` on its scenario with the one report.
"""

from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulens.analyzer.history import read_history
from gpulens.analyzer.workload import pod_owner
from gpulens.catalog import MIB, get_model
from gpulens.cli import main
from gpulens.sim.applyfiles import apply_plan_files, parse_grow
from gpulens.sim.applyplan import PluginDaemon, job_key
from gpulens.sim.clock import ManualClock
from gpulens.sim.engine import build_node
from gpulens.sim.history import simulate
from gpulens.sim.reportplan import ApplyPlanError
from gpulens.sim.scenario import (
    PINNED_MEM_LIMIT,
    THREAD_PERCENTAGE,
    KubernetesJob,
    ProcessSpec,
    Scenario,
    SlurmJob,
    instance_profiles,
)
from gpulens.sim.scenariofile import BUILTIN_DIR, load_scenario

WEEK1 = Path(__file__).resolve().parents[1] / "data" / "weekpair" / "week1.yaml"  # MIG + a kept trainer
SHARED = WEEK1.parent / "week1-shared.yaml"  # the four pods the plan packs on MPS
PAIR = (WEEK1, SHARED)
DAY, STEP = 86400.0, 300.0
GIB = 1024**3
RANKER, EMBEDDER, FEATURIZE = (
    "ml-serving/ranker-6c9f7d8b5-k2x7q",
    "ml-serving/embedder-0",
    "batch/featurize-x7k2p",
)


def _report(history: Path, out: Path, *extra: str) -> dict[str, Any]:
    assert main(["report", "--history", str(history), "--out", str(out), *extra]) == 0
    jobs = json.loads((out / "jobs.json").read_text())["jobs"]
    return {"plan": json.loads((out / "plan.json").read_text()), "jobs": {j["job_id"]: j for j in jobs}}


@pytest.fixture(scope="module")
def week1(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("week1")
    simulate([str(p) for p in PAIR], duration_s=DAY, out=root / "history", step_s=STEP, start=1_750_000_200.0)
    return root / "report", _report(root / "history", root / "report")


@pytest.fixture(scope="module")
def week2(week1, tmp_path_factory) -> dict[Path, tuple[Path, Scenario]]:
    """Per week-1 scenario file: its week 2 (the YAML written, and the scenario it reads back as)."""
    root = tmp_path_factory.mktemp("week2")
    out = {}
    for source in PAIR:
        path = root / f"{source.stem}-applied.yaml"
        out[source] = (path, apply_plan_files(str(source), week1[0], path))
    return out


def _applied(week2: dict[Path, tuple[Path, Scenario]]) -> list[Scenario]:
    return [scenario for _, scenario in week2.values()]


# (GPU UUID, mode, MIG profile, MPS thread percentage)
Placed = tuple[str, str, str | None, int | None]


def _kubernetes(job: object) -> KubernetesJob:
    assert isinstance(job, KubernetesJob), job
    return job


def _slurm(job: object) -> SlurmJob:
    assert isinstance(job, SlurmJob), job
    return job


def _by_workload(*scenarios: Scenario) -> dict[str, list[ProcessSpec]]:
    out: dict[str, list[ProcessSpec]] = {}
    for scenario in scenarios:
        for p in scenario.processes:
            assert isinstance(p.job, KubernetesJob)
            out.setdefault(f"{p.job.namespace}/{pod_owner(p.job.pod)}", []).append(p)
    return out


def _device_plugin_replicas(report: Path, host: str) -> int:
    """The MPS replicas of the device-plugin config that the report's node-labels.sh selects for
    `host`, read from its ConfigMap as the plugin reads it."""
    config = report / "config"
    (key,) = [
        word.split("=", 1)[1]
        for line in (config / "node-labels.sh").read_text().splitlines()
        if line.startswith(f"kubectl label node {host} ")
        for word in shlex.split(line)
        if word.startswith("nvidia.com/device-plugin.config=")
    ]
    selected = yaml.safe_load(
        yaml.safe_load((config / "device-plugin-configmap.yaml").read_text())["data"][key]
    )
    (resource,) = selected["sharing"]["mps"]["resources"]
    replicas: int = resource["replicas"]
    return replicas


def test_the_week1_plan_has_mps_moves_a_mig_reslice_and_a_kept_job(week1):
    _, report = week1
    modes = {(e["node"], e["sharing"]) for e in report["plan"]["layout"]}
    assert {("k8s-weekpair-2", "mps"), ("k8s-weekpair-1", "mig"), ("k8s-weekpair-1", "exclusive")} <= modes
    assert len(report["plan"]["freed"]) >= 2
    assert report["jobs"]["research/pretrain-llm-0"]["action"] == "keep"


def test_the_mps_node_gets_the_device_plugins_mps_with_a_replica_per_client(week1):
    report, plan = week1
    (mps,) = [e for e in plan["plan"]["layout"] if e["sharing"] == "mps"]
    assert _device_plugin_replicas(report, "k8s-weekpair-2") == len(mps["jobs"]) == 4


def test_every_job_runs_where_the_plan_puts_it_in_its_mode(week1, week2):
    report_dir, report = week1
    applied = _applied(week2)
    uuids = {g.uuid: g for scenario in applied for g in scenario.gpus}
    procs = _by_workload(*applied)
    daemon = 100 // _device_plugin_replicas(report_dir, "k8s-weekpair-2")
    for entry in report["plan"]["layout"]:
        gpu = uuids[entry["uuid"]]
        for job in entry["jobs"]:
            (proc,) = procs[report["jobs"][job]["workload"]]
            assert proc.gpu == gpu.index
            if entry["sharing"] == "mps":
                # the device plugin's MPS: no thread share of the pod's own, the daemon's 100 / replicas
                (client,) = [c for c in entry["mps_clients"] if c["job_id"] == job]
                assert proc.kind == "mps_client" and gpu.mps is not None
                assert THREAD_PERCENTAGE not in dict(proc.environ)
                assert gpu.mps.active_thread_percentage == daemon
                assert gpu.mps.pipe_dir == "/mps/nvidia.com/gpu/pipe"
                assert proc.sm_cap == pytest.approx(daemon / 100)
                # nor a pinned limit of its own: the daemon's total / replicas, which holds the plan's
                assert PINNED_MEM_LIMIT not in dict(proc.environ)
                assert proc.memory_limit_bytes == gpu.mps.pinned_memory_limit
                assert client[PINNED_MEM_LIMIT] <= gpu.mps.pinned_memory_limit
            elif entry["sharing"] == "mig":
                (placed,) = [s for s in entry["mig_layout"] if s["job_id"] == job]
                (inst,) = [i for i in gpu.mig or () if i.gpu_instance_id == proc.instance]
                assert (inst.profile.name, inst.start) == (placed["profile"], placed["start"])
            else:
                assert gpu.mig is None and gpu.mps is None and proc.kind == "compute"


def test_the_device_plugins_daemon_pins_every_mps_client_to_total_over_replicas(week1, week2):
    replicas = _device_plugin_replicas(week1[0], "k8s-weekpair-2")
    _, applied = week2[SHARED]
    (gpu,) = [g for g in applied.gpus if g.mps is not None]
    assert gpu.mps is not None and gpu.mps.pinned_memory_limit == gpu.model.memory_bytes // replicas
    clients = [p for p in applied.processes if p.kind == "mps_client"]
    assert len(clients) == replicas
    assert [PINNED_MEM_LIMIT in dict(p.environ) for p in clients] == [False] * replicas
    assert {p.memory_limit_bytes for p in clients} == {gpu.mps.pinned_memory_limit}


def test_the_daemons_pinned_limit_is_total_over_replicas_rounded_down_to_whole_mib():
    # 81920 MiB / 3 = 27306.7 MiB: the daemon sets `27306M`
    assert PluginDaemon(100 // 3, replicas=3).pinned_limit(get_model("A100-80GB")) == 27306 * MIB


def test_a_plugin_mps_client_that_outgrows_total_over_replicas_restarts_in_week2(week2, tmp_path):
    path, applied = week2[SHARED]
    (gpu,) = [g for g in applied.gpus if g.mps is not None]
    assert gpu.mps is not None and gpu.mps.pinned_memory_limit is not None
    (ranker,) = [p for p in applied.processes if pod_owner(_kubernetes(p.job).pod) == "ranker"]
    data = yaml.safe_load(path.read_text())
    (entry,) = [e for e in data["processes"] if e["pid"] == ranker.pid]
    # in week 2 its memory climbs from 4 GiB past the daemon's share (20 GiB) towards 24 GiB in an
    # hour: killed at 48 min, back 10 s later from 4 GiB
    limit = gpu.mps.pinned_memory_limit
    entry["workload"] = {
        **entry["workload"],
        "pattern": "growing",
        "memory_start": 4 * GIB,
        "memory": limit + 4 * GIB,
        "over": "1h",
    }
    grown = tmp_path / "week2.yaml"
    grown.write_text(yaml.safe_dump(data))
    simulate([str(grown)], duration_s=6 * 3600, out=tmp_path / "history", step_s=60, start=1_750_000_200.0)
    samples = read_history(tmp_path / "history").samples
    memory = samples[
        (samples["metric"] == "gpu_job_memory_used_bytes") & (samples["job_id"] == job_key(ranker))
    ].sort_values("timestamp")["value"]
    assert memory.max() <= limit
    restarts = (memory.to_numpy()[1:] < memory.to_numpy()[:-1] / 2).sum()
    assert restarts == 7  # in 6 h


def test_the_mig_gpu_is_resliced_as_mig_parted_says(week1, week2):
    config = yaml.safe_load((week1[0] / "config" / "mig-parted.yaml").read_text())
    (entry,) = config["mig-configs"]["gpulens-k8s-weekpair-1"]
    (index,) = entry["devices"]
    layout = week2[WEEK1][1].gpus[index].mig
    assert layout is not None and sorted(i.profile.name for i in layout) == sorted(
        p for p, n in entry["mig-devices"].items() for _ in range(n)
    )


def test_freed_gpus_are_left_empty(week1, week2):
    freed = {g["uuid"] for g in week1[1]["plan"]["freed"]}
    empty = [(a, g) for a in _applied(week2) for g in a.gpus if g.uuid in freed]
    assert len(empty) == len(freed)
    assert all(g.mps is None and not any(p.gpu == g.index for p in a.processes) for a, g in empty)


def test_rolled_out_pods_are_renamed_by_their_owner_kind(week2):
    jobs = [_kubernetes(p.job) for p in week2[SHARED][1].processes]
    procs = {f"{j.namespace}/{pod_owner(j.pod)}": j for j in jobs}
    ranker = procs["ml-serving/ranker"]  # a Deployment's pod: new ReplicaSet hash and suffix
    assert ranker.pod.startswith("ranker-") and ranker.pod != "ranker-6c9f7d8b5-k2x7q"
    assert [len(p) for p in ranker.pod.split("-")[1:]] == [9, 5]
    assert set(ranker.pod.split("-")[1:]).isdisjoint({"6c9f7d8b5", "k2x7q"})
    embedder = procs["ml-serving/embedder-0"]  # a StatefulSet's pod keeps its name, not its UID
    was = _kubernetes(load_scenario(SHARED).processes[1].job)
    assert embedder.pod == "embedder-0" and embedder.pod_uid != was.pod_uid
    featurize = procs["batch/featurize"]  # a Job's pod: a new suffix
    assert featurize.pod.startswith("featurize-") and featurize.pod != "featurize-x7k2p"


def test_moved_processes_get_new_pids_and_start_at_week2s_start(week2):
    week1 = {p.pid for source in PAIR for p in load_scenario(source).processes}
    moved = [p for applied in _applied(week2) for p in applied.processes if p.pid not in week1]
    assert len(moved) == 6 and all(p.start == 0 for p in moved)


def test_the_kept_job_is_byte_for_byte_the_same(week2):
    before = yaml.safe_load(WEEK1.read_text())
    after = yaml.safe_load(week2[WEEK1][0].read_text())
    (kept,) = [p for p in before["processes"] if p["job"]["kubernetes"]["pod"] == "pretrain-llm-0"]
    assert kept in after["processes"]
    assert after["gpus"][-1] == before["gpus"][-1]  # its GPU, as written


def _sms(scenario: Scenario, p: ProcessSpec) -> int:
    g = scenario.gpus[p.gpu]
    return (
        g.model.sm_count if p.instance is None else instance_profiles(g, scenario.faults)[p.instance].sm_count
    )


def test_moving_a_job_keeps_its_workload_in_sms(week2):
    # the same work is the same SMs: a share of a slice becomes a smaller share of a whole GPU
    moved_across = 0
    for source, (_, applied) in week2.items():
        week1 = load_scenario(source)
        before = {pod_owner(_kubernetes(p.job).pod): (p, _sms(week1, p)) for p in week1.processes}
        for p in applied.processes:
            was, sms = before[pod_owner(_kubernetes(p.job).pod)]
            assert p.workload.sm * _sms(applied, p) == pytest.approx(was.workload.sm * sms, abs=1e-4)
            # the rest as it was, but a kernel never runs wider than all the time (busy >= sm)
            assert replace(p.workload, sm=was.workload.sm, busy=was.workload.busy) == was.workload
            assert p.workload.busy is None or p.workload.busy == max(was.workload.busy or 0.0, p.workload.sm)
            moved_across += _sms(applied, p) != sms
    assert moved_across  # the week pair moves jobs between a slice and a whole GPU


def test_the_output_validates_and_reads_back_equal(week2, capsys):
    for out, applied in week2.values():
        assert main(["sim", "validate", str(out)]) == 0
        assert load_scenario(out) == applied


def test_a_grown_job_binds_its_device_plugin_thread_cap_in_week2(week1, tmp_path):
    out = tmp_path / "grown.yaml"
    applied = apply_plan_files(str(SHARED), week1[0], out, parse_grow([f"{RANKER}=3"]))
    (ranker,) = _by_workload(applied)["ml-serving/ranker"]
    daemon = 100 // _device_plugin_replicas(week1[0], "k8s-weekpair-2")  # 25 %: four clients
    assert ranker.workload.sm == pytest.approx(0.36) and ranker.sm_cap == pytest.approx(daemon / 100)
    assert ranker.sm_cap < 0.36
    alone = {**yaml.safe_load(out.read_text())}
    alone["processes"] = [p for p in alone["processes"] if p["pid"] == ranker.pid]
    path = tmp_path / "alone.yaml"
    path.write_text(yaml.safe_dump(alone))
    clock = ManualClock(1_750_000_000.0)
    node = build_node(load_scenario(path), clock=clock)
    clock.advance(600)
    assert node.gpu_state(ranker.gpu).activity.sm == pytest.approx(ranker.sm_cap)


@pytest.mark.parametrize(
    ("breaks", "message"),
    [
        ("no-plan", "plan.json: expected a report file (gpulens report --out DIR), found none"),
        ("bad-json", "plan.json: expected valid JSON"),
        ("foreign-gpu", "plan.json: layout[{i}].uuid: expected a GPU of k8s-weekpair-1, found 'GPU-nope'"),
        ("bad-sharing", "plan.json: layout[{i}].sharing: expected one of mig, mps, unchanged"),
        ("unknown-job", "'ns/ghost': expected a job of scenario weekpair-week1, found none"),
        ("jobs-disagree", ".proposed_gpu: expected GPU-"),
        ("mig-parted-disagrees", "mig-devices: expected {{'1g.10gb': 2}} on GPU 0 as plan.json slices it"),
    ],
)
def test_bad_report_input_gets_one_line_errors(week1, tmp_path, breaks, message):
    report = tmp_path / "report"
    shutil.copytree(week1[0], report, symlinks=False)
    plan_path, jobs_path = report / "plan.json", report / "jobs.json"
    plan, jobs = json.loads(plan_path.read_text()), json.loads(jobs_path.read_text())
    # what is broken is on week1.yaml's node: the entries of the other node are not its to read
    i = next(k for k, e in enumerate(plan["layout"]) if e["node"] == "k8s-weekpair-1")
    ours = {job for e in plan["layout"] if e["node"] == "k8s-weekpair-1" for job in e["jobs"]}
    if breaks == "no-plan":
        plan_path.unlink()
    elif breaks == "bad-json":
        plan_path.write_text("{")
    elif breaks == "foreign-gpu":
        plan["layout"][i]["uuid"] = "GPU-nope"
    elif breaks == "bad-sharing":
        plan["layout"][i]["sharing"] = "sliced"
    elif breaks == "unknown-job":
        plan["layout"][i]["jobs"].append("ns/ghost")
    elif breaks == "jobs-disagree":
        next(j for j in jobs["jobs"] if j["job_id"] in ours)["proposed_gpu"] = "GPU-elsewhere"
    elif breaks == "mig-parted-disagrees":
        mig = report / "config" / "mig-parted.yaml"
        mig.write_text(mig.read_text().replace("1g.10gb: 2", "2g.20gb: 1"))
    if breaks not in ("no-plan", "bad-json"):
        plan_path.write_text(json.dumps(plan))
        jobs_path.write_text(json.dumps(jobs))
    with pytest.raises(ApplyPlanError) as error:
        apply_plan_files(str(WEEK1), report, tmp_path / "out.yaml")
    assert message.format(i=i) in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "out.yaml").exists()


def test_the_command_reports_bad_input_on_one_line(week1, tmp_path, capsys):
    out = str(tmp_path / "o.yaml")
    code = main(
        ["sim", "apply-plan", str(SHARED), "--report", str(week1[0]), "--out", out, "--grow", "ranker"]
    )
    err = capsys.readouterr().err
    assert (
        code == 2
        and err == "gpulens: error: --grow: expected JOB=FACTOR with a factor above 0, found 'ranker'\n"
    )


def _placed(report: dict[str, Any]) -> dict[str, Placed]:
    """Per workload: (GPU UUID, mode, MIG profile, MPS thread percentage) as the plan places it. An
    MPS client's percentage is the share the plan sized it to (`sized_thread_percentage` where the
    device plugin's equal split gives it more: `analyzer/planasrun.py`). A GPU the plan leaves
    `unchanged` runs as its jobs run now, each MPS client at the share its row keeps (the dead
    band: `analyzer/hysteresis.py`)."""
    by_job: dict[str, Placed] = {}
    for entry in report["plan"]["layout"]:
        caps = {
            c["job_id"]: c.get("sized_thread_percentage", c["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
            for c in entry.get("mps_clients", [])
        }
        slices = {s["job_id"]: s["profile"] for s in entry.get("mig_layout", [])}
        for job in entry["jobs"]:
            row = report["jobs"][job]
            if entry["sharing"] == "unchanged":
                mode = row["sharing"]
                placed = (
                    mode,
                    row["mig_profile_now"] or None,
                    (row.get("mps_sized_thread_percentage") or row["mps_active_thread_percentage"])
                    if mode == "mps"
                    else None,
                )
            else:
                placed = (entry["sharing"], slices.get(job), caps.get(job))
            by_job[row["workload"]] = (entry["uuid"], *placed)
    return by_job


@pytest.fixture(scope="module")
def week2_report(week1, week2, tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("week2-report")
    simulate(
        [str(path) for path, _ in week2.values()],
        duration_s=DAY,
        out=root / "history",
        step_s=STEP,
        start=1_750_000_200.0 + 7 * DAY,
    )
    # with last week's report, as an SRE runs it: the caps it gave are what the clients run under
    return _report(root / "history", root / "report", "--previous", str(week1[0]))


@pytest.mark.slow
def test_the_week2_plan_moves_no_job_the_week1_plan_placed(week1, week2_report):
    first = {job: placed[:3] for job, placed in _placed(week1[1]).items()}
    assert {job: placed[:3] for job, placed in _placed(week2_report).items()} == first


@pytest.mark.slow
def test_the_week2_plan_keeps_the_week1_thread_caps(week1, week2_report):
    assert _placed(week2_report) == _placed(week1[1])


# --- plans that leave GPUs as they run (issue 30 item 4: every shipped scenario) -----------------


def _write_report(
    root: Path, scenario: Scenario, layout: list[dict[str, Any]], freed: tuple[int, ...] = ()
) -> Path:
    """A report directory holding only what apply-plan reads: plan.json and jobs.json."""
    root.mkdir()
    node = scenario.hostname
    for entry in layout:
        entry.update(node=node, uuid=scenario.gpus[entry.pop("gpu")].uuid)
    plan = {"layout": layout, "freed": [{"node": node, "uuid": scenario.gpus[i].uuid} for i in freed]}
    jobs = [{"job_id": job, "action": "keep"} for entry in layout for job in entry["jobs"]]
    (root / "plan.json").write_text(json.dumps(plan))
    (root / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    return root


def _jobs_by_gpu(scenario: Scenario) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for p in scenario.processes:
        out.setdefault(p.gpu, []).append(job_key(p))  # type: ignore[arg-type]
    return out


def _yaml(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((BUILTIN_DIR / f"{name}.yaml").read_text())
    return doc


def test_gpus_the_plan_keeps_unchanged_keep_their_jobs_mig_instances_included(tmp_path):
    scenario = load_scenario("k8s-a100-mixed")  # GPU 1: MIG, pods on four of its instances
    layout = [{"gpu": g, "sharing": "unchanged", "jobs": jobs} for g, jobs in _jobs_by_gpu(scenario).items()]
    out = tmp_path / "w2.yaml"
    apply_plan_files("k8s-a100-mixed", _write_report(tmp_path / "report", scenario, layout), out)
    after = yaml.safe_load(out.read_text())
    assert after["processes"] == _yaml("k8s-a100-mixed")["processes"]
    assert after["gpus"] == _yaml("k8s-a100-mixed")["gpus"]


def test_an_unchanged_gpu_listing_a_job_from_another_gpu_is_a_one_line_error(tmp_path):
    scenario = load_scenario("k8s-a100-mixed")
    jobs = _jobs_by_gpu(scenario)
    layout = [{"gpu": 0, "sharing": "unchanged", "jobs": [*jobs[0], *jobs[3]]}]
    layout += [{"gpu": g, "sharing": "unchanged", "jobs": jobs[g]} for g in (1, 2)]
    with pytest.raises(ApplyPlanError) as error:
        apply_plan_files(
            "k8s-a100-mixed", _write_report(tmp_path / "report", scenario, layout), tmp_path / "o.yaml"
        )
    assert "expected GPU 0, which the plan keeps unchanged, to hold only the jobs that run on it now" in str(
        error.value
    ) and "\n" not in str(error.value)


def _mps(jobs: list[str], pct: int) -> dict[str, Any]:
    clients = [{"job_id": j, THREAD_PERCENTAGE: pct, PINNED_MEM_LIMIT: 9 * 1024**3} for j in jobs]
    return {"gpu": 1, "sharing": "mps", "jobs": jobs, "mps_clients": clients}


def test_mps_clients_kept_with_the_same_neighbours_keep_the_caps_they_run_with(tmp_path):
    scenario = load_scenario("faults")  # GPU 1: MPS server, clients 9003 and 9004 without caps
    jobs = _jobs_by_gpu(scenario)
    layout = [_mps(jobs[1], 40)] + [
        {"gpu": g, "sharing": "unchanged", "jobs": j} for g, j in jobs.items() if g != 1
    ]
    out = tmp_path / "w2.yaml"
    apply_plan_files("faults", _write_report(tmp_path / "report", scenario, layout), out)
    assert yaml.safe_load(out.read_text())["processes"] == _yaml("faults")["processes"]


def test_mps_clients_restart_with_the_plans_caps_when_their_neighbours_change(tmp_path):
    scenario = load_scenario("faults")
    jobs = _jobs_by_gpu(scenario)  # GPU 7's job joins GPU 1's two MPS clients
    layout = [_mps([*jobs[1], *jobs[7]], 30)] + [
        {"gpu": g, "sharing": "unchanged", "jobs": j} for g, j in jobs.items() if g not in (1, 7)
    ]
    applied = apply_plan_files(
        "faults", _write_report(tmp_path / "report", scenario, layout, (7,)), tmp_path / "o.yaml"
    )
    clients = [p for p in applied.processes if p.gpu == 1]
    assert len(clients) == 3 and {p.sm_cap for p in clients} == {0.3}
    assert not {p.pid for p in clients} & {p.pid for p in scenario.processes}


def test_a_slurm_nodes_mps_clients_keep_the_plans_pinned_limit_of_their_own(tmp_path):
    scenario = load_scenario("faults")  # Slurm jobs; GPU 7's job joins GPU 1's two MPS clients
    jobs = _jobs_by_gpu(scenario)
    layout = [_mps([*jobs[1], *jobs[7]], 30)] + [
        {"gpu": g, "sharing": "unchanged", "jobs": j} for g, j in jobs.items() if g not in (1, 7)
    ]
    applied = apply_plan_files(
        "faults", _write_report(tmp_path / "report", scenario, layout, (7,)), tmp_path / "o.yaml"
    )
    clients = [p for p in applied.processes if p.gpu == 1]
    assert len(clients) == 3 and {dict(p.environ)[PINNED_MEM_LIMIT] for p in clients} == {"0=9216M"}
    assert {p.memory_limit_bytes for p in clients} == {9 * GIB}
    mps = applied.gpus[1].mps
    assert mps is not None and mps.pinned_memory_limit is None


KEPT_PLUGIN_MPS = {
    "name": "k8s-plugin-mps",
    "node": {
        "hostname": "k8s-mps-1",
        "kubernetes": {"driver": "systemd", "runtime": "containerd", "cgroup": "v2"},
    },
    "gpus": [
        {
            "model": "A100-80GB",
            "mps": {
                "server_pid": 100,
                "active_thread_percentage": 50,
                "pinned_memory_limit": "40960MiB",
                "pipe_dir": "/mps/nvidia.com/gpu/pipe",
            },
        },
        {"model": "A100-80GB"},
    ],
    "processes": [
        {
            "pid": 200 + i,
            "gpu": i,
            "kind": "mps_client" if i == 0 else "compute",
            "job": {"kubernetes": {"namespace": "ml", "pod": f"{name}-0"}},
            "workload": {"pattern": "constant", "memory": "4GiB"},
        }
        for i, name in enumerate(("a", "b"))
    ],
}


def test_a_plugin_node_whose_config_the_report_keeps_gives_new_clients_its_running_pinned_limit(tmp_path):
    source = tmp_path / "w1.yaml"
    source.write_text(yaml.safe_dump(KEPT_PLUGIN_MPS))
    scenario = load_scenario(str(source))
    layout = [_mps(["ml/a-0", "ml/b-0"], 30) | {"gpu": 0}]  # no device-plugin files: the config stays
    applied = apply_plan_files(
        str(source), _write_report(tmp_path / "report", scenario, layout, (1,)), tmp_path / "o.yaml"
    )
    assert [(p.gpu, p.memory_limit_bytes, p.sm_cap) for p in applied.processes] == [(0, 40 * GIB, 0.5)] * 2
    assert [PINNED_MEM_LIMIT in dict(p.environ) for p in applied.processes] == [False, False]


SLURM_WEEK1 = WEEK1.parent / "slurm-week1.yaml"


def test_a_moved_slurm_job_is_resubmitted_under_a_new_id_with_its_user_account_and_name(tmp_path):
    scenario = load_scenario(str(SLURM_WEEK1))  # GPUs 0-1: tasks 0 and 1 of alice's `sweep` array
    jobs = _jobs_by_gpu(scenario)
    layout = [{"gpu": 3, "sharing": "time-slicing", "jobs": [*jobs[0], *jobs[1], *jobs[2], *jobs[3]]}]
    layout += [{"gpu": 4, "sharing": "unchanged", "jobs": jobs[4]}]
    applied = apply_plan_files(
        str(SLURM_WEEK1), _write_report(tmp_path / "report", scenario, layout, (0, 1, 2)), tmp_path / "o.yaml"
    )
    # every job here is a Slurm job (_slurm asserts it)
    before = {p.pid: _slurm(p.job) for p in scenario.processes if p.gpu in (0, 1, 2)}  # the jobs it moves
    stays = {_slurm(p.job).job_id for p in scenario.processes if p.gpu == 3}
    after = [_slurm(p.job) for p in applied.processes if p.gpu == 3 and _slurm(p.job).job_id not in stays]
    kept = sorted((j.user, j.account, j.name) for j in before.values())
    assert sorted((j.user, j.account, j.name) for j in after) == kept
    assert not {j.job_id for j in after} & {j.job_id for j in before.values()}
    sweep = sorted(j.job_id for j in after if j.name == "sweep")
    assert len({j.split("_")[0] for j in sweep}) == 1 and [j.split("_")[1] for j in sweep] == ["0", "1"]


def _pcie_layout(split_to: tuple[int, ...]) -> list[dict[str, Any]]:
    """pcie-split's plan with its 4-GPU job 7001 (now on GPUs 2-5) on `split_to`, the rest kept."""
    layout = [{"gpu": g, "sharing": "exclusive", "jobs": ["7002"]} for g in (0, 1)]
    layout += [{"gpu": g, "sharing": "exclusive", "jobs": ["7001"]} for g in split_to]
    return [*layout, {"gpu": 6, "sharing": "exclusive", "jobs": ["7003"]}]


def test_a_multi_gpu_job_the_plan_keeps_where_it_runs_stays_as_written(tmp_path):
    scenario = load_scenario("pcie-split")
    report = _write_report(tmp_path / "report", scenario, _pcie_layout((2, 3, 4, 5)), freed=(7,))
    out = tmp_path / "w2.yaml"
    apply_plan_files("pcie-split", report, out)
    assert yaml.safe_load(out.read_text())["processes"] == _yaml("pcie-split")["processes"]


def test_a_moved_multi_gpu_job_takes_its_ranks_in_order_to_its_new_gpus_as_one_job(tmp_path):
    scenario = load_scenario("pcie-split")
    report = _write_report(tmp_path / "report", scenario, _pcie_layout((2, 3, 5, 7)))
    applied = apply_plan_files("pcie-split", report, tmp_path / "w2.yaml")
    before = {p.gpu: p for p in scenario.processes if job_key(p) == "7001"}
    ranks = sorted((p for p in applied.processes if p.job.user == "olga"), key=lambda p: p.gpu)
    assert [p.gpu for p in ranks] == [2, 3, 5, 7]
    assert [p.job.task for p in ranks] == [before[g].job.task for g in (2, 3, 4, 5)]
    assert len({p.job.job_id for p in ranks}) == 1 and ranks[0].job.job_id != "7001"


def test_a_multi_gpu_job_given_fewer_gpus_than_it_runs_on_is_a_one_line_error(tmp_path):
    scenario = load_scenario("pcie-split")
    report = _write_report(tmp_path / "report", scenario, _pcie_layout((4, 5)))
    with pytest.raises(ApplyPlanError) as error:
        apply_plan_files("pcie-split", report, tmp_path / "w2.yaml")
    assert "expected job '7001' on as many GPUs as it runs on now (4), found 2" in str(error.value)
    assert "\n" not in str(error.value)
