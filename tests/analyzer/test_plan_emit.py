"""Consolidation plan and the configuration that realises it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens.analyzer.bins import GpuBin, Item
from gpulens.analyzer.emit import context_from_rows, emit
from gpulens.analyzer.pipeline import analyze_profiles
from gpulens.analyzer.plan import build_plan
from gpulens.analyzer.planlayout import assign_gpus
from gpulens.analyzer.profile import FleetGpu, fleet_from_samples, profiles_from_samples
from gpulens.analyzer.recommend import recommend
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.catalog import get_model, model_for_nvml_name
from gpulens.migplacement import place_mig_layout
from tests.analyzer import synth
from tests.analyzer.invariants import violations
from tests.analyzer.synth import SynthJob, flat, steady

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"


def plan_for(jobs, th):
    recs = recommend(profiles_from_samples(synth.frame(jobs), synth.STEP, th), th)
    return recs, build_plan(recs, th)


def test_seed_case_is_the_textbook_answer(th):
    _, plan = plan_for(synth.seed_case(), th)
    assert (plan.gpus_before, plan.gpus_after, plan.gpus_freed) == (4, 2, 2)
    assert all(entry["sharing"] == "mps" for entry in plan.layout)
    assert plan.utilization_after == pytest.approx(2 * plan.utilization_before, rel=0.01)
    assert sum(len(e["jobs"]) for e in plan.layout) == 4


def test_a_plan_as_a_dict_is_its_dataclass_as_a_dict(th):
    _, plan = plan_for(synth.seed_case(), th)
    assert plan.layout and plan.freed
    assert plan.as_dict() == dataclasses.asdict(plan)
    assert plan.as_dict()["layout"] is not plan.layout  # a copy, as asdict makes


def test_mig_jobs_are_packed_with_valid_placements(th):
    jobs = [
        SynthJob(f"m{i}", f"GPU-h{i}", steady(60, 0.06, 0.005), flat(60, 8 * GIB), model=H100)
        for i in range(9)
    ]
    recs, plan = plan_for(jobs, th)
    assert set(recs["mig_profile"]) == {"1g.10gb"}
    assert (plan.gpus_before, plan.gpus_after) == (9, 2)  # 7 x 1g.10gb fill one H100
    model = get_model("H100-80GB")
    for entry in plan.layout:
        starts = [(s["profile"], s["start"]) for s in entry["mig_layout"]]
        assert len(place_mig_layout(model, starts)) == len(starts)


def test_sequential_exclusive_jobs_can_reuse_one_gpu(th):
    jobs = [
        SynthJob("early", "GPU-a", steady(30, 0.9, 0.01), flat(30, 20 * GIB)),
        SynthJob("late", "GPU-b", steady(30, 0.9, 0.01), flat(30, 20 * GIB), first_step=40),
    ]
    _, plan = plan_for(jobs, th)
    assert plan.gpus_before == 2 and plan.gpus_after == 1


def test_jobs_too_short_to_size_hold_a_whole_gpu_only_while_they_ran(th):
    jobs = [  # three samples each: too few to size; the second starts 7 min after the first ended
        SynthJob("first", "GPU-a", flat(3, 0.5), flat(3, GIB)),
        SynthJob("second", "GPU-b", flat(3, 0.5), flat(3, GIB), first_step=10),
    ]
    recs, plan = plan_for(jobs, th)
    assert set(recs["recommendation"]) == {"insufficient-data"}
    assert (plan.gpus_before, plan.gpus_after) == (2, 1)
    assert [(e["sharing"], sorted(e["jobs"])) for e in plan.layout] == [("exclusive", ["first", "second"])]


def test_jobs_closer_than_the_lifetime_margin_do_not_use_a_gpu_in_turn(th):
    jobs = [  # the second starts 2 min after the first's last step: within plan.lifetime_margin_s
        SynthJob("early", "GPU-a", steady(30, 0.9, 0.01), flat(30, 20 * GIB)),
        SynthJob("late", "GPU-b", steady(30, 0.9, 0.01), flat(30, 20 * GIB), first_step=32),
    ]
    assert th.plan.lifetime_margin_s > 120
    assert plan_for(jobs, th)[1].gpus_after == 2
    no_margin = dataclasses.replace(th, plan=dataclasses.replace(th.plan, lifetime_margin_s=0))
    assert plan_for(jobs, no_margin)[1].gpus_after == 1


def test_reclaimed_and_unknown_jobs_are_counted_correctly(th):
    jobs = [
        SynthJob("idle", "GPU-a", flat(60, 0.0), flat(60, GIB)),
        SynthJob("short", "GPU-b", flat(3, 0.5), flat(3, GIB)),
    ]
    _, plan = plan_for(jobs, th)
    assert plan.gpus_before == 2
    assert plan.gpus_after == 1  # the idle GPU is freed; the short job stays where it is
    assert any(e["sharing"] == "unchanged" for e in plan.layout)


def test_emitted_configs_match_the_plan_and_validate(th):
    jobs = synth.seed_case() + [
        SynthJob(f"m{i}", f"GPU-h{i}", steady(60, 0.06, 0.005), flat(60, 8 * GIB), model=H100)
        for i in range(3)
    ]
    recs, plan = plan_for(jobs, th)
    out = emit(plan, context_from_rows(recs.to_dict("records")))  # validated inside
    mig = yaml.safe_load(out.files["mig-parted.yaml"])
    assert mig["version"] == "v1"
    enabled = [d for cfg in mig["mig-configs"].values() for d in cfg if d["mig-enabled"]]
    assert enabled and enabled[0]["mig-devices"] == {"1g.10gb": 3}
    assert "--gres=gpu:1g.10gb:1" in out.files["gres.conf"]
    layout_clients = [c for e in plan.layout for c in e.get("mps_clients", [])]
    assert all(isinstance(c["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], int) for c in layout_clients)


def test_a_job_alone_under_mps_takes_a_free_mig_slice_instead(th):
    jobs = [
        SynthJob(f"m{i}", f"GPU-h{i}", steady(60, 0.06, 0.005), flat(60, 8 * GIB), model=H100)
        for i in range(3)
    ] + [SynthJob("lone", "GPU-x", steady(60, 0.10, 0.01), flat(60, 8 * GIB), model=H100)]
    profiles = profiles_from_samples(synth.frame(jobs), synth.STEP, th)
    assert recommend(profiles, th).set_index("job_id").loc["lone", "recommendation"] == "mps"
    analysis = analyze_profiles(profiles, th, "test")
    row = analysis.recs.set_index("job_id").loc["lone"]
    assert row["recommendation"] == "mig" and row["mig_profile"] == "2g.20gb"
    assert "plan:" in row["reason"]
    assert (analysis.plan.gpus_before, analysis.plan.gpus_after) == (4, 1)


def analysis_for(jobs, th, idle=()):
    """The whole pipeline on synthetic jobs, with the inventory `gpu_info` reports (idle GPUs too)."""
    samples = synth.frame(jobs, idle=list(idle))
    profiles = profiles_from_samples(samples, synth.STEP, th)
    return analyze_profiles(profiles, th, "test", with_archetypes=False, fleet=fleet_from_samples(samples))


def test_a_gpu_that_ran_no_job_is_counted_and_freed(th):
    analysis = analysis_for(synth.seed_case(), th, idle=[synth.IdleGpu("GPU-seed-idle")])
    plan = analysis.plan
    assert (plan.gpus_before, plan.gpus_after, plan.gpus_freed) == (5, 2, 3)
    assert {
        "node": "node-1",
        "uuid": "GPU-seed-idle",
        "model": "A100-SXM4-40GB",
        "why": "no job in the window",
    } in (plan.freed)
    assert plan.by_model["A100-SXM4-40GB"] == {"gpus_before": 5, "gpus_after": 2, "gpus_freed": 3}


def test_shared_gpus_carry_their_interference_risk(th):
    analysis = analysis_for(synth.seed_case(), th)
    recs = analysis.recs.set_index("job_id")
    for entry in analysis.plan.layout:
        p95 = sum(recs.loc[j, "sm_active_p95"] for j in entry["jobs"])
        assert entry["interference"]["sm_p95_sum"] == pytest.approx(p95, abs=0.01)
        assert entry["interference"]["risk"] == "low"


def test_jobs_that_stream_memory_do_not_share_a_gpu(th):
    jobs = [
        SynthJob(f"s{i}", f"GPU-s{i}", steady(60, 0.1, 0.01), flat(60, 5 * GIB), dram=flat(60, 0.5))
        for i in range(2)
    ]
    analysis = analysis_for(jobs, th)
    assert all(len(entry["jobs"]) == 1 for entry in analysis.plan.layout)
    assert analysis.plan.gpus_freed == 0
    assert set(analysis.recs["action"]) == {"keep"}


def test_memory_heavy_compute_light_jobs_pair_when_they_fit(th):
    jobs = [
        SynthJob("big", "GPU-h1", steady(60, 0.06, 0.005), flat(60, 45 * GIB), model=H100),
        SynthJob("small", "GPU-h2", steady(60, 0.06, 0.005), flat(60, 25 * GIB), model=H100),
    ]
    plan = analysis_for(jobs, th).plan
    assert (plan.gpus_before, plan.gpus_after) == (2, 1)
    (entry,) = plan.layout
    assert entry["memory_committed_bytes"] <= get_model("H100-80GB").memory_bytes


def test_a_job_no_partner_fits_keeps_its_whole_gpu(th):
    jobs = [
        SynthJob("big", "GPU-h1", steady(60, 0.06, 0.005), flat(60, 35 * GIB), model=H100),
        SynthJob("busy", "GPU-h2", steady(60, 0.9, 0.01), flat(60, 40 * GIB), model=H100),
    ]
    analysis = analysis_for(jobs, th)
    row = analysis.recs.set_index("job_id").loc["big"]
    assert row["recommendation"] == "exclusive" and row["action"] == "keep"
    assert "saves nothing" in row["reason"]  # alone, or its whole model gains nothing from packing
    assert not any(e["sharing"] in ("mps", "time-slicing") for e in analysis.plan.layout)


def test_every_job_says_current_and_proposed_and_keep_is_never_an_action(th):
    jobs = [*synth.seed_case(), SynthJob("busy", "GPU-b", steady(120, 0.9, 0.01), flat(120, 20 * GIB))]
    jobs.append(SynthJob("idle", "GPU-i", flat(120, 0.0), flat(120, 2 * GIB)))
    analysis = analysis_for(jobs, th)
    recs = analysis.recs.set_index("job_id")
    assert recs.loc["busy", "action"] == "keep"
    assert recs.loc["busy", "proposed_gpu"] == "GPU-b"
    seed = recs.loc["seed-0"]
    assert seed["action"] == "change"
    assert seed["change"].startswith("exclusive, A100-SXM4-40GB on node-1/GPU-seed-0000 -> mps ")
    assert seed["proposed_node"] == "node-1"
    actions = analysis.top_actions(n=10)
    assert [a["job_id"] for a in actions if a["action"] == "keep"] == []
    assert "busy" not in [a["job_id"] for a in actions]
    assert actions[0]["job_id"] == "idle" and actions[0]["action"] == "reclaim"
    hours = [a["gpu_hours_recovered"] for a in actions]
    assert hours == sorted(hours, reverse=True)


def test_an_exclusive_job_that_pre_allocates_memory_is_an_action_to_fix(th):
    job = SynthJob("tf", "GPU-a", steady(120, 0.08, 0.01), flat(120, 38.5 * GIB))
    analysis = analysis_for([job], th)
    row = analysis.recs.iloc[0]
    assert row["action"] == "fix" and "TF_FORCE_GPU_ALLOW_GROWTH" in row["finding"]
    assert analysis.top_actions()[0]["what_to_do"].startswith("false saturation")


def test_downsizing_never_uses_more_gpus_of_a_model_than_the_fleet_has(th):
    jobs = [
        SynthJob(f"w{i}", f"GPU-w{i}", steady(60, 0.62, 0.01), flat(60, 68 * GIB), model="NVIDIA H200")
        for i in range(3)
    ]
    analysis = analysis_for(jobs, th, idle=[synth.IdleGpu("GPU-spare", model=H100)])
    by_model = analysis.plan.by_model
    assert by_model["H100-80GB"]["gpus_after"] <= 1
    assert all(v["gpus_freed"] >= 0 for v in by_model.values())
    assert (analysis.recs["recommendation"] == "downsize-model").sum() == 1


def test_a_downsized_jobs_gpu_is_projected_as_busy_as_the_same_work_keeps_the_smaller_model(th):
    """The same work keeps a GPU with fewer SMs x clock busier: an A100 job moved to an L4
    (58 SMs at 2040 MHz against 108 at 1410) projects at the capability ratio, not its A100 figure."""
    a100, l4 = "NVIDIA A100-SXM4-80GB", "NVIDIA L4"
    jobs = [
        SynthJob(f"w{i}", f"GPU-w{i}", steady(60, 0.6, 0.01), flat(60, 14 * GIB), model=a100)
        for i in range(2)
    ]
    analysis = analysis_for(jobs, th, idle=[synth.IdleGpu("GPU-spare", model=l4)])
    recs = analysis.recs.set_index("job_id")
    [job] = recs.index[recs["recommendation"] == "downsize-model"]
    [entry] = [e for e in analysis.plan.layout if job in e["jobs"]]
    origin, target = (model_for_nvml_name(m) for m in (a100, l4))
    assert origin is not None and target is not None
    ratio = (origin.sm_count * origin.max_sm_clock_mhz) / (target.sm_count * target.max_sm_clock_mhz)
    used = min(float(recs.loc[job, "gpu_hours_used"]) * ratio, float(recs.loc[job, "duration_s"]) / 3600)
    assert entry["projected_utilization"] == pytest.approx(used / analysis.plan.window_hours, abs=1e-4)
    assert (
        entry["projected_utilization"] > float(recs.loc[job, "gpu_hours_used"]) / analysis.plan.window_hours
    )


MODELS_FOR_PLANS = ["NVIDIA A100-SXM4-40GB", H100, "NVIDIA H200"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(MODELS_FOR_PLANS),
            st.floats(0.0, 1.0),  # activity level
            st.floats(0.01, 0.97),  # peak memory as a share of the GPU
            st.integers(0, 30),  # first step
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 2),
)
def test_a_plan_fits_every_gpu_and_the_fleet(jobs, idle):
    th = load_thresholds()
    synth_jobs = []
    for k, (model, level, share, first) in enumerate(jobs):
        memory = share * model_for_nvml_name(model).memory_bytes
        synth_jobs.append(
            SynthJob(
                f"j{k}",
                f"GPU-{k}",
                steady(30, level, 0.05, seed=k),
                flat(30, memory),
                model=model,
                first_step=first,
            )
        )
    spare = [synth.IdleGpu(f"GPU-idle-{k}", model=MODELS_FOR_PLANS[k]) for k in range(idle)]
    analysis = analysis_for(synth_jobs, th, idle=spare)
    assert violations(analysis, inventory=len(jobs) + idle) == []
    fleet = {}
    for model in [*(m for m, *_ in jobs), *(g.model for g in spare)]:
        key = model_for_nvml_name(model).key
        fleet[key] = fleet.get(key, 0) + 1
    for key, counts in analysis.plan.by_model.items():
        assert counts["gpus_after"] <= fleet.get(key, 0)


def test_an_exclusive_job_whose_memory_grows_steadily_is_a_leak_to_fix(th):
    rng = np.random.default_rng(7)
    grows = np.linspace(4 * GIB, 20 * GIB, 120) + rng.normal(0, 0.3 * GIB, 120)  # 8 GiB/h, noisy
    analysis = analysis_for([SynthJob("leaky", "GPU-a", steady(120, 0.15, 0.02), grows)], th)
    row = analysis.recs.iloc[0]
    assert row["memory_trend_bytes_per_hour"] == pytest.approx(8 * GIB, rel=0.05)
    assert row["recommendation"] == "exclusive" and row["reason"].startswith("memory leak: grows 8.")
    assert row["action"] == "fix" and row["finding"].startswith("memory leak: grows 8.")
    (action,) = analysis.top_actions()
    assert action["job_id"] == "leaky" and "restart it on a schedule" in action["what_to_do"]


def test_noise_a_warm_up_or_a_short_run_is_not_a_leak(th):
    rng = np.random.default_rng(3)
    noisy = 10 * GIB + rng.normal(0, 0.5 * GIB, 120)
    warm_up = np.concatenate([np.linspace(2 * GIB, 10 * GIB, 3), flat(117, 10 * GIB)])
    jobs = [
        SynthJob("noisy", "GPU-a", steady(120, 0.15, 0.02), noisy),
        SynthJob("warm", "GPU-b", steady(120, 0.15, 0.02), warm_up),
        SynthJob("short", "GPU-c", steady(40, 0.15, 0.02), np.linspace(4 * GIB, 20 * GIB, 40)),
    ]
    recs = analysis_for(jobs, th).recs.set_index("job_id")
    assert list(recs["memory_leak"]) == ["", "", ""]
    assert not recs["reason"].str.contains("leak").any()


def test_an_unknown_models_plan_packs_by_its_memory_and_emits_valid_configs_without_mig(th):
    from gpulens.analyzer import emit as em
    from tests.analyzer.test_recommend import unknown_model_jobs, with_memory_total

    samples = with_memory_total(synth.frame(unknown_model_jobs()), 48 * GIB)
    profiles = profiles_from_samples(samples, synth.STEP, th)
    analysis = analyze_profiles(
        profiles, th, "test", with_archetypes=False, fleet=fleet_from_samples(samples)
    )
    plan = analysis.plan
    assert plan.gpus_before == 5 and plan.gpus_freed >= 1
    for entry in plan.layout:
        assert entry["sharing"] != "mig"
        jobs = analysis.recs.set_index("job_id").loc[entry["jobs"]]
        assert jobs["memory_need_bytes"].sum() <= 48 * GIB or len(entry["jobs"]) == 1
    emitted = analysis.emitted
    assert emitted is not None and emitted.placement is not None
    names = {h: em.config_name("gpulens", h) for h in emitted.placement.inventory.hosts()}
    assert em.validate_files(emitted.files, emitted.placement.inventory, names) == []
    assert "mig-devices" not in emitted.files.get(em.MIG_FILE, "")


def test_jobs_that_share_a_gpu_stay_on_it_when_moving_them_frees_nothing(th):
    residents = [
        SynthJob(
            f"r{i}", "GPU-m", steady(60, 0.22, 0.01, seed=i), flat(60, 10 * GIB), model=H100, sharing="mps"
        )
        for i in range(3)
    ]
    # fits beside two of them but not three (thread caps): swapping it in for one frees no GPU
    newcomer = SynthJob("new", "GPU-x", steady(60, 0.15, 0.01), flat(60, 40 * GIB), model=H100)
    analysis = analysis_for([*residents, newcomer], th)
    recs = analysis.recs.set_index("job_id")
    assert set(recs.loc[["r0", "r1", "r2"], "proposed_gpu"]) == {"GPU-m"}
    assert recs.loc["new", "proposed_gpu"] == "GPU-x"
    assert "change" not in set(recs["action"])
    assert (analysis.plan.gpus_before, analysis.plan.gpus_after) == (2, 2)


def test_kubernetes_nodes_get_one_sharing_family_each(th):
    def pod(name, uuid, node, level, memory):
        return SynthJob(name, uuid, steady(60, level, 0.01), flat(60, memory), node=node, source="kubernetes")

    jobs = [
        pod("trainer", "GPU-k1a", "k1", 0.9, 30 * GIB),
        pod("small-a", "GPU-k1b", "k1", 0.2, 8 * GIB),  # larger than small-b: its GPU is wanted first
        pod("small-b", "GPU-k2a", "k2", 0.18, 8 * GIB),
    ]
    analysis = analysis_for(jobs, th, idle=[synth.IdleGpu("GPU-k2b", node="k2")])
    (shared,) = [e for e in analysis.plan.layout if e["sharing"] == "mps"]
    assert set(shared["jobs"]) == {"small-a", "small-b"}
    assert shared["node"] == "k2"  # not beside the trainer's whole GPU on k1
    emitted = analysis.emitted
    assert {a.what for a in emitted.adjustments} & {"mps-beside-whole", "shared-node"} == set()
    labels = emitted.files["node-labels.sh"]
    assert "node k1 nvidia.com/device-plugin.config=gpulens-exclusive" in labels
    assert "node k2 nvidia.com/device-plugin.config=gpulens-mps-2" in labels


# -- orchestrators: a pod cannot run on a Slurm node, nor a Slurm job on a Kubernetes node


def test_a_gpu_of_kubernetes_jobs_goes_to_a_kubernetes_node_though_a_slurm_gpu_is_free_first():
    model = "A100-SXM4-40GB"
    fleet = [FleetGpu("GPU-a-0", model, "a-slurm"), FleetGpu("GPU-z-0", model, "z-k8s")]
    gpu = GpuBin(name=f"{model}#1", model=model, mode="mps")
    for name in ("ocr", "ranker"):  # moved from GPUs the fleet no longer lists
        gpu.add(Item(name, "mps", model, 0.0, 1.0, 1, GIB, 0.1, 0.1, 1.0, source="kubernetes"))
    assign_gpus([gpu], fleet, None, None, {"a-slurm": "slurm", "z-k8s": "kubernetes"})
    assert (gpu.node, gpu.original_uuid) == ("z-k8s", "GPU-z-0")


def test_a_gpu_of_kubernetes_jobs_gets_no_slurm_gpu_when_no_kubernetes_one_is_left():
    model = "A100-SXM4-40GB"
    gpu = GpuBin(name=f"{model}#1", model=model, mode="exclusive")
    gpu.add(Item("pod", "exclusive", model, 0.0, 1.0, 1, GIB, 0.5, 0.5, 1.0, source="kubernetes"))
    assign_gpus([gpu], [FleetGpu("GPU-s-0", model, "s")], None, None, {"s": "slurm"})
    assert (gpu.node, gpu.original_uuid) == ("", "")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(["kubernetes", "slurm"]), min_size=2, max_size=3),  # each node's
    st.lists(
        st.tuples(
            st.integers(0, 2),  # node (modulo the nodes)
            st.floats(0.02, 0.9),  # activity level
            st.floats(0.02, 0.6),  # peak memory as a share of the GPU
            st.integers(0, 30),  # first step
        ),
        min_size=2,
        max_size=8,
    ),
    st.integers(0, 2),  # idle GPUs, one on each of the first nodes
)
def test_no_planned_gpu_mixes_orchestrators_and_every_job_lands_on_a_node_of_its_own(kinds, jobs, idle):
    th = load_thresholds()
    memory = model_for_nvml_name(synth.SynthJob.model).memory_bytes
    synth_jobs = [
        SynthJob(
            f"j{k}",
            f"GPU-{k}",
            steady(30, level, 0.02, seed=k),
            flat(30, share * memory),
            first_step=first,
            node=f"n{node % len(kinds)}",
            source=kinds[node % len(kinds)],
        )
        for k, (node, level, share, first) in enumerate(jobs)
    ]
    spare = [synth.IdleGpu(f"GPU-idle-{k}", node=f"n{k % len(kinds)}") for k in range(idle)]
    analysis = analysis_for(synth_jobs, th, idle=spare)
    source = {j.job_id: j.source for j in synth_jobs}
    # a node no job ran on (only idle GPUs) has no orchestrator: any job may go there
    orchestrator = {
        f"n{n}": kind for n, kind in enumerate(kinds) if any(j.node == f"n{n}" for j in synth_jobs)
    }
    for entry in analysis.plan.layout:
        (own,) = {source[j] for j in entry["jobs"]}  # one orchestrator per GPU
        assert orchestrator.get(entry["node"], own) == own, entry
    placement = analysis.emitted.placement  # the emitted files' GPUs as well
    for placed in placement.gpus:
        host = placement.inventory.orchestrator(placed.host).value
        assert {source[j] for j in placed.jobs} <= {host} or host == "unknown", placed
    assert violations(analysis, inventory=len(jobs) + idle) == []
