"""`gpulens sim apply-plan --history`: a history rewritten into its jobs running as the plan places them.

The hand-made history: node n1 with six A100-80GB GPUs, one job alone on each of GPUs 0-2 and 4,
GPUs 3 and 5 idle, ten one-minute steps. The hand-written plan runs a and b as MPS clients of GPU 0
(b's demand over its 20 % cap), moves c onto a 1g.10gb slice of GPU 3 (re-sliced), frees GPUs 1
and 2, and keeps k on GPU 4 as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import pytest

from gpulens.analyzer.emit import CONFIGMAP_FILE, LABELS_FILE, configmap_text, labels_text
from gpulens.analyzer.history import History, HistoryWriter, read_history
from gpulens.analyzer.importers import import_trace
from gpulens.analyzer.pipeline import analyze_history
from gpulens.analyzer.thresholds import Thresholds, load_thresholds
from gpulens.catalog import get_model, model_for_nvml_name
from gpulens.cli import main
from gpulens.sim.defaults import default_gpu_instance_id
from gpulens.sim.history_apply import Counts, apply_plan_history
from gpulens.sim.reportplan import ApplyPlanError

MODEL = get_model("A100-80GB")
L4 = get_model("L4")
GIB, MIB = 1024**3, 1024**2
STEPS = [1_750_000_000.0 + 60 * n for n in range(10)]
# job -> (GPU index, SM activity, NVML utilization, memory)
JOBS = {
    "a": (0, 0.2, 0.3, 10 * GIB),
    "b": (1, 0.3, 0.4, 8 * GIB),
    "c": (2, 0.1, 0.1, 5 * GIB),
    "k": (4, 0.9, 0.95, 70 * GIB),
}


def _uuid(index: int) -> str:
    return f"GPU-{index}"


def _history(
    path: Path, models: Mapping[int, str] | None = None, sm: bool = True, source: str = "kubernetes"
) -> Path:
    """The history of the module docstring; `models`: GPU index -> another model's NVML name (its
    memory: the catalog's, else 24 GiB); `sm=False`: no SM activity (a duty-cycle trace); `source`:
    the jobs' scheduler."""
    models = models or {}
    with HistoryWriter(path, {"source": "test", "step_s": 60.0}) as w:
        for t in STEPS:
            for index in range(6):
                gpu = {"instance": "n1", "gpu": str(index), "uuid": _uuid(index)}
                name = models.get(index, MODEL.nvml_name)
                known = model_for_nvml_name(name)
                w.add(t, "gpu_info", 1.0, {**gpu, "model": name})
                total = known.memory_bytes if known is not None else 24 * GIB
                w.add(t, "gpu_memory_total_bytes", float(total), gpu)
            for job, (index, activity, util, memory) in JOBS.items():
                gpu = {"instance": "n1", "gpu": str(index), "uuid": _uuid(index)}
                w.add(
                    t,
                    "gpu_job_info",
                    1.0,
                    {**gpu, "job_id": job, "job_source": source, "sharing": "exclusive"},
                )
                w.add(t, "gpu_job_memory_used_bytes", float(memory), {**gpu, "job_id": job})
                if sm:
                    w.add(t, "gpu_sm_active_ratio", activity, gpu)
                w.add(t, "gpu_utilization_ratio", util, gpu)
                w.add(t, "gpu_memory_used_bytes", float(memory), gpu)
    return path


def _report(path: Path) -> Path:
    path.mkdir()
    entry = {"node": "n1", "model": "A100-80GB"}
    layout = [
        {
            **entry,
            "uuid": _uuid(0),
            "sharing": "mps",
            "jobs": ["a", "b"],
            "mps_clients": [
                {
                    "job_id": "a",
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": 40,
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": 12 * GIB,
                },
                {
                    "job_id": "b",
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": 20,
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": 9 * GIB,
                },
            ],
        },
        {
            **entry,
            "uuid": _uuid(3),
            "sharing": "mig",
            "jobs": ["c"],
            "mig_layout": [{"job_id": "c", "profile": "1g.10gb", "start": 0}],
        },
        {**entry, "uuid": _uuid(4), "sharing": "exclusive", "jobs": ["k"]},
    ]
    freed = [
        {"node": "n1", "uuid": _uuid(i), "model": "A100-80GB", "why": "freed by consolidation"}
        for i in (1, 2)
    ]
    (path / "plan.json").write_text(json.dumps({"layout": layout, "freed": freed}))
    actions = {"a": "change", "b": "change", "c": "change", "k": "keep"}
    (path / "jobs.json").write_text(
        json.dumps({"jobs": [{"job_id": j, "action": a} for j, a in actions.items()]})
    )
    return path


@pytest.fixture
def th() -> Thresholds:
    return load_thresholds()


@pytest.fixture
def applied(tmp_path):
    before = _history(tmp_path / "before")
    counts = apply_plan_history(before, _report(tmp_path / "report"), tmp_path / "after")
    return read_history(before).samples, read_history(tmp_path / "after").samples, counts


def _rows(samples: pd.DataFrame, metric: str, **labels: str) -> pd.DataFrame:
    rows = samples[samples["metric"] == metric]
    for label, value in labels.items():
        rows = rows[rows[label] == value]
    return rows


def _value(samples: pd.DataFrame, metric: str, **labels: str) -> float:
    values = set(_rows(samples, metric, **labels)["value"].round(9))
    assert len(values) == 1, (metric, labels, values)
    return float(values.pop())


def test_jobs_moved_to_mps_run_as_clients_of_their_planned_gpu(applied):
    _, after, _ = applied
    for job in ("a", "b"):
        info = _rows(after, "gpu_job_info", job_id=job)
        assert len(info) == len(STEPS)
        assert (
            set(info["uuid"]) == {_uuid(0)}
            and set(info["sharing"]) == {"mps"}
            and set(info["instance"]) == {"n1"}
        )
    assert _value(after, "gpu_job_memory_used_bytes", job_id="b") == 8 * GIB  # under its 9 GiB limit


def test_a_client_over_its_thread_cap_is_held_to_it_and_runs_longer(applied):
    _, after, counts = applied
    # b asks 30 % of the SMs under a 20 % cap: kernels at most a fifth wide run all the time and
    # deliver 0.2; a's kernels (2/3 of the SMs while they ran) narrow to its 40 % cap and run
    # 0.2 / 0.4 = half the time for the same 0.2
    assert _value(after, "gpu_sm_active_ratio", uuid=_uuid(0)) == pytest.approx(0.2 + 0.2)
    assert _value(after, "gpu_utilization_ratio", uuid=_uuid(0)) == pytest.approx(1 - (1 - 0.5) * (1 - 1.0))
    assert counts.capped_steps == len(STEPS)


def test_shared_gpu_shares_and_remainder_add_up_to_its_sm_figure(applied):
    _, after, _ = applied
    shares = _rows(after, "gpu_job_sm_utilization_ratio", uuid=_uuid(0)).groupby("timestamp")["value"].sum()
    rest = _rows(after, "gpu_job_sm_unattributed_ratio", uuid=_uuid(0)).set_index("timestamp")["value"]
    assert (shares + rest).round(9).eq(0.4).all()
    a, b = (_value(after, "gpu_job_sm_utilization_ratio", job_id=j) for j in ("a", "b"))
    # weighed by what each client could add (busy x cap: 0.5 x 0.4, 1.0 x 0.2), as the exporter
    # does where caps are known: each reads its own SM activity, b no more than its cap
    assert (a, b) == (pytest.approx(0.2), pytest.approx(0.2))


def test_a_job_moved_to_a_mig_slice_gets_its_instance_on_the_slice_scale(applied):
    _, after, _ = applied
    profile = MODEL.mig_profile("1g.10gb")
    gi = str(default_gpu_instance_id(MODEL, profile, 0))
    info = _rows(after, "gpu_job_info", job_id="c")
    assert set(zip(info["uuid"], info["gpu_instance"], info["sharing"], strict=True)) == {
        (_uuid(3), gi, "mig")
    }
    assert _value(after, "gpu_mig_instance_info", uuid=_uuid(3), gpu_instance=gi, mig_profile="1g.10gb") == 1
    slice_activity = 0.1 * MODEL.sm_count / profile.sm_count
    assert _value(after, "gpu_mig_sm_active_ratio", uuid=_uuid(3), gpu_instance=gi) == pytest.approx(
        slice_activity
    )
    assert _value(after, "gpu_sm_active_ratio", uuid=_uuid(3)) == pytest.approx(0.1)


def test_a_freed_gpu_keeps_only_its_identity(applied):
    _, after, counts = applied
    for index in (1, 2):
        rows = after[after["uuid"] == _uuid(index)]
        assert set(rows["metric"]) == {"gpu_info", "gpu_memory_total_bytes"}
        assert len(_rows(rows, "gpu_info")) == len(STEPS)
    assert counts.freed_gpus == 2


def test_a_kept_job_and_its_gpu_are_copied_unchanged(applied):
    before, after, _ = applied
    columns = ["timestamp", "metric", "value", "uuid", "job_id", "sharing"]

    def of_gpu4(samples: pd.DataFrame) -> pd.DataFrame:
        rows = samples[samples["uuid"] == _uuid(4)][columns].astype(str)
        return rows.sort_values(columns).reset_index(drop=True)

    pd.testing.assert_frame_equal(of_gpu4(before), of_gpu4(after))


def test_the_analyzer_reads_a_job_moved_to_a_slice_on_the_slice(applied, tmp_path, th):
    analysis = analyze_history(read_history(tmp_path / "after"), th)
    row = analysis.recs.set_index("job_id").loc["c"]
    assert row["sharing"] == "mig" and row["mig_profile_now"] == "1g.10gb"
    assert row["sm_active_mean"] == pytest.approx(
        0.1 * MODEL.sm_count / MODEL.mig_profile("1g.10gb").sm_count
    )


def test_a_plan_naming_a_gpu_the_history_lacks_is_one_line(tmp_path):
    report = _report(tmp_path / "report")
    plan = json.loads((report / "plan.json").read_text())
    plan["layout"][0]["uuid"] = "GPU-elsewhere"
    (report / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(
        ApplyPlanError,
        match=r"plan.json: layout\[0\].uuid: expected a GPU of the history, found .GPU-elsewhere.",
    ):
        apply_plan_history(_history(tmp_path / "h"), report, tmp_path / "out")


def test_a_plan_that_leaves_a_job_on_a_freed_gpu_is_refused(tmp_path):
    report = _report(tmp_path / "report")
    plan = json.loads((report / "plan.json").read_text())
    plan["freed"].append({"node": "n1", "uuid": _uuid(4)})
    plan["layout"].pop()
    (report / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(ApplyPlanError, match=r"GPU GPU-4: expected the plan to place job 'k'"):
        apply_plan_history(_history(tmp_path / "h"), report, tmp_path / "out")


def test_the_command_takes_a_history_or_a_scenario(tmp_path, capsys):
    history, report = _history(tmp_path / "h"), _report(tmp_path / "report")
    out = tmp_path / "after"
    assert (
        main(["sim", "apply-plan", "--history", str(history), "--report", str(report), "--out", str(out)])
        == 0
    )
    assert "3 jobs placed on 2 GPUs, 2 GPUs freed" in capsys.readouterr().out
    assert main(["sim", "apply-plan", "--report", str(report), "--out", str(out)]) == 2
    assert "expected a SCENARIO or --history DIR" in capsys.readouterr().err


def _pods(path: Path, rows: list[str]) -> Path:
    path.mkdir()
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    header += "creation_time,deletion_time,scheduled_time"
    (path / "openb_pod_list_default.csv").write_text("\n".join([header, *rows]) + "\n")
    return path


def test_requests_packed_as_planned_free_nothing_more(tmp_path, th):
    # three 0.3-GPU pods and a whole-GPU pod at once: 4 GPUs whole, 2 with the shares packed
    src = _pods(
        tmp_path / "src",
        [f"p{n},1,1,1,300,,BE,Running,0,1000,0" for n in range(3)] + ["w,1,1,1,1000,,LS,Running,0,1000,0"],
    )
    import_trace("alibaba-gpu-v2023", src, tmp_path / "h", None)
    week1 = analyze_history(read_history(tmp_path / "h"), th).plan
    report = tmp_path / "report"
    report.mkdir()
    (report / "plan.json").write_text(json.dumps({"layout": week1.layout}))
    apply_plan_history(tmp_path / "h", report, tmp_path / "packed")
    week2 = analyze_history(read_history(tmp_path / "packed"), th).plan
    assert (week1.gpus_before, week1.gpus_after) == (4, 2)
    assert (week2.gpus_before, week2.gpus_after, week2.gpus_freed) == (2, 2, 0)
    assert "as they run now (3 fractional pods" in week2.notes[0]


# --- a node the report's device-plugin files relabel (sim/nodesharing.py) -----------------------


def _with_device_plugin(report: Path, sharing: str, replicas: int, node: str = "n1") -> Path:
    """`report` with the device-plugin files emit writes: `node` selects one shared config."""
    block = {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}
    config = {"version": "v1", "flags": {"migStrategy": "mixed"}, "sharing": {sharing: block}}
    (report / "config").mkdir()
    (report / "config" / CONFIGMAP_FILE).write_text(configmap_text({"shared": config}))
    (report / "config" / LABELS_FILE).write_text(labels_text({node: "shared"}, {}))
    return report


def _applied_on_plugin_node(tmp_path: Path, sharing: str, replicas: int) -> pd.DataFrame:
    """The samples of `_history` with `_report`'s plan applied on a device-plugin node."""
    before = _history(tmp_path / "before")
    report = _with_device_plugin(_report(tmp_path / "report"), sharing, replicas)
    apply_plan_history(before, report, tmp_path / "after")
    return read_history(tmp_path / "after").samples


def test_on_a_device_plugin_mps_node_every_client_runs_at_100_over_replicas(tmp_path):
    after = _applied_on_plugin_node(tmp_path, "mps", 4)
    # b asks 30 % of the SMs: the plan's 20 % is not in force, the daemon's 25 % is (a: 20 % < 25 %)
    assert _value(after, "gpu_sm_active_ratio", uuid=_uuid(0)) == pytest.approx(0.2 + 0.25)


def test_on_a_node_whose_config_time_slices_planned_mps_jobs_share_the_gpu_by_time(tmp_path):
    after = _applied_on_plugin_node(tmp_path, "timeSlicing", 4)
    assert set(_rows(after, "gpu_job_info", uuid=_uuid(0))["sharing"]) == {"time_slicing"}
    assert _value(after, "gpu_sm_active_ratio", uuid=_uuid(0)) == pytest.approx(0.2 + 0.3)  # no caps


def _with_plan_limit(report: Path, job: str, limit: int) -> Path:
    """`report` with the plan's pinned memory limit for MPS client `job` set to `limit` bytes."""
    plan = json.loads((report / "plan.json").read_text())
    for client in plan["layout"][0]["mps_clients"]:
        if client["job_id"] == job:
            client["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = limit
    (report / "plan.json").write_text(json.dumps(plan))
    return report


def test_on_a_device_plugin_mps_node_a_client_is_pinned_to_total_over_replicas_in_whole_mib(tmp_path):
    after = _applied_on_plugin_node(tmp_path, "mps", 9)
    # the daemon's limit: 81920 MiB / 9 = 9102.2 MiB, in whole MiB; a uses 10 GiB (the plan gave it 12)
    assert _value(after, "gpu_job_memory_used_bytes", job_id="a") == 9102 * MIB
    assert _value(after, "gpu_job_memory_used_bytes", job_id="b") == 8 * GIB  # under it


def test_on_a_device_plugin_mps_node_the_plans_lower_limit_is_not_in_force(tmp_path):
    before = _history(tmp_path / "before")
    report = _with_device_plugin(_with_plan_limit(_report(tmp_path / "report"), "b", 6 * GIB), "mps", 4)
    apply_plan_history(before, report, tmp_path / "after")
    after = read_history(tmp_path / "after").samples
    # the daemon pins every client to 20480 MiB; the plugin gives the pod no limit of its own
    assert _value(after, "gpu_job_memory_used_bytes", job_id="b") == 8 * GIB


def test_a_slurm_mps_client_keeps_the_plans_limit(tmp_path):
    before = _history(tmp_path / "before", source="slurm")
    report = _with_plan_limit(_report(tmp_path / "report"), "b", 6 * GIB)
    # the device-plugin files relabel some Kubernetes node, not n1
    apply_plan_history(before, _with_device_plugin(report, "mps", 4, node="k8s-1"), tmp_path / "after")
    after = read_history(tmp_path / "after").samples
    assert _value(after, "gpu_job_memory_used_bytes", job_id="b") == 6 * GIB


# --- a job moved to another GPU model: the same SM cycles on its compute --------------------------

# what an A100-80GB does per second over what an L4 does: SMs x max SM clock
A100_OVER_L4 = (108 * 1410) / (58 * 2040)


def _move_report(path: Path, job: str, source: int, target: int) -> Path:
    """A plan that moves `job` alone from GPU `source` onto the idle GPU `target`, freeing `source`."""
    path.mkdir()
    entry = {"node": "n1", "uuid": _uuid(target), "sharing": "exclusive", "jobs": [job]}
    freed = [{"node": "n1", "uuid": _uuid(source)}]
    (path / "plan.json").write_text(json.dumps({"layout": [entry], "freed": freed}))
    (path / "jobs.json").write_text(json.dumps({"jobs": [{"job_id": job, "action": "change"}]}))
    return path


def _moved_to_gpu5(
    tmp_path: Path, job: str, source: int, model: str = L4.nvml_name, sm: bool = True
) -> tuple[History, Counts]:
    """The history with GPU 5 a `model`, after `job` moves there from GPU `source`."""
    before = _history(tmp_path / "before", {5: model}, sm=sm)
    report = _move_report(tmp_path / "report", job, source, 5)
    counts = apply_plan_history(before, report, tmp_path / "after")
    return read_history(tmp_path / "after"), counts


def test_a_job_moved_from_an_a100_to_an_l4_reads_more_of_the_l4(tmp_path):
    after, counts = _moved_to_gpu5(tmp_path, "c", 2)
    expected = 0.1 * A100_OVER_L4
    assert _value(after.samples, "gpu_sm_active_ratio", uuid=_uuid(5)) == pytest.approx(expected)
    assert _value(after.samples, "gpu_job_sm_utilization_ratio", job_id="c") == pytest.approx(expected)
    assert counts.capped_steps == 0


def test_activity_rescaled_over_1_is_held_to_1_and_counted(tmp_path):
    after, counts = _moved_to_gpu5(tmp_path, "k", 4)  # 0.9 of an A100 is 1.16 of an L4
    assert _value(after.samples, "gpu_sm_active_ratio", uuid=_uuid(5)) == 1.0
    assert counts.capped_steps == len(STEPS)
    assert after.meta["applied_plan"]["capped_steps"] == len(STEPS)


def test_a_moved_duty_cycle_takes_longer_on_a_slower_gpu(tmp_path):
    after, counts = _moved_to_gpu5(tmp_path, "c", 2, sm=False)
    assert _value(after.samples, "gpu_utilization_ratio", uuid=_uuid(5)) == pytest.approx(0.1 * A100_OVER_L4)
    assert counts.capped_steps == 0


def test_a_duty_cycle_rescaled_over_1_is_held_to_1_and_counted(tmp_path):
    after, counts = _moved_to_gpu5(tmp_path, "k", 4, sm=False)  # 0.95 of an A100's time is 1.22 of an L4's
    assert _value(after.samples, "gpu_utilization_ratio", uuid=_uuid(5)) == 1.0
    assert counts.capped_steps == len(STEPS)


def test_a_job_moved_to_a_model_the_catalog_lacks_keeps_its_figures_and_is_listed(tmp_path):
    after, counts = _moved_to_gpu5(tmp_path, "c", 2, model="NVIDIA Z99")
    assert _value(after.samples, "gpu_sm_active_ratio", uuid=_uuid(5)) == pytest.approx(0.1)
    assert after.meta["applied_plan"]["not_rescaled"] == ["c"]
    assert counts.not_rescaled == ["c"]


def test_a_job_moved_within_its_model_is_not_rescaled(tmp_path):
    after, counts = _moved_to_gpu5(tmp_path, "c", 2, model=MODEL.nvml_name)
    assert _value(after.samples, "gpu_sm_active_ratio", uuid=_uuid(5)) == pytest.approx(0.1)
    assert counts.not_rescaled == []
