"""The plan chooses each job's mode while it packs (issue 31 item 3): fewest GPUs, then fewest
moves, every packed GPU within the fit tests."""

from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens.analyzer import modes
from gpulens.analyzer.bins import GpuBin, Item, fits
from gpulens.analyzer.emit import context_from_rows, emit
from gpulens.analyzer.kinds import Kind
from gpulens.analyzer.modes import Mode
from gpulens.analyzer.packing import _mode_of, _packing, fewest_moves
from gpulens.analyzer.pipeline import analyze_profiles
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.recommend import choose_mig_profile, mps_settings
from gpulens.analyzer.thresholds import Thresholds, load_thresholds
from gpulens.catalog import get_model, model_for_nvml_name
from tests.analyzer import synth
from tests.analyzer.invariants import violations
from tests.analyzer.nodefiles import check_all
from tests.analyzer.synth import SynthJob, flat, steady

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"
H100_MODEL = get_model("H100-80GB")


def rec_row(kind: str, sm: float, gib: float, **extra: object) -> SimpleNamespace:
    """A recommendation row as recommend.py sizes it (the columns `modes_of` reads)."""
    th = load_thresholds()
    need = gib * GIB
    sms = sm * H100_MODEL.sm_count * (1 + th.headroom.compute_ratio)
    settings_ = mps_settings(sm, need, th)
    profile = choose_mig_profile(H100_MODEL, need, sms)
    row = {
        "recommendation": kind,
        "gpus": 1,
        "gpu_model": H100,
        "memory_need_bytes": need,
        "sm_fraction": sm,
        "sm_demand_sms": sms,
        "memory_leak": "",
        "serving_server": "",
        "mig_profile": profile.name if kind == "mig" and profile else None,
        "mig_alternative": profile.name if kind == "mps" and profile else None,
        "mps_active_thread_percentage": settings_.thread_percentage if kind == "mps" else math.nan,
        "mps_pinned_memory_limit_bytes": settings_.pinned_memory_limit_bytes if kind == "mps" else math.nan,
    }
    row.update(extra)
    return SimpleNamespace(**row)


def item_for(
    job: str, row: SimpleNamespace, origin: str, now: str, start: float = 0.0, end: float = 3600.0
) -> Item:
    own = modes.own_mode(row)
    return Item(
        job_id=job,
        kind=str(row.recommendation),
        model=H100,
        start=start,
        end=end,
        gpus=1,
        memory=row.memory_need_bytes,
        sm=row.sm_fraction,
        load=row.sm_fraction * 0.6,
        used_hours=1.0,
        p95=row.sm_fraction,
        origin_model=H100,
        origin_mode=now,
        origin_uuids=(origin,),
        mig_profile=own.mig_profile,
        mig_alternative=row.mig_alternative,
        thread_pct=own.thread_pct,
        memory_limit=own.memory_limit,
        modes=modes.modes_of(row, load_thresholds()),
    )


def test_a_mig_jobs_modes_are_its_slice_then_the_mps_settings_recommend_sizes():
    th = load_thresholds()
    row = rec_row("mig", 0.2, 20)
    found = modes.modes_of(row, th)
    expected = mps_settings(0.2, 20 * GIB, th)
    assert found == (
        Mode(Kind.MIG, mig_profile="3g.40gb"),
        Mode(
            Kind.MPS, thread_pct=expected.thread_percentage, memory_limit=expected.pinned_memory_limit_bytes
        ),
    )


def test_an_mps_jobs_modes_are_its_cap_then_the_slice_recommend_named():
    row = rec_row("mps", 0.2, 20)
    found = modes.modes_of(row, load_thresholds())
    assert [m.kind for m in found] == [Kind.MPS, Kind.MIG]
    assert found[1].mig_profile == row.mig_alternative == "3g.40gb"


def test_a_leaking_job_a_server_under_pressure_and_a_whole_job_keep_one_mode():
    th = load_thresholds()
    assert modes.modes_of(rec_row("mps", 0.2, 20, memory_leak="grows 1 GiB/h"), th) == ()
    queueing = rec_row(
        "mig", 0.2, 20, serving_server="vllm", serving_waiting_fraction=0.9, serving_preemptions=0
    )
    assert modes.modes_of(queueing, th) == ()
    assert modes.modes_of(rec_row("exclusive", 0.7, 20), th) == ()


def test_a_slice_whose_share_of_the_memory_bandwidth_is_below_the_jobs_dram_activity_is_no_mode():
    th = load_thresholds()
    light = rec_row("mps", 0.1, 5, dram_active_p95=0.1, device_sms=132)
    streaming = rec_row("mps", 0.1, 5, dram_active_p95=0.5, device_sms=132)
    assert [m.kind for m in modes.modes_of(light, th)] == [Kind.MPS, Kind.MIG]
    assert modes.modes_of(streaming, th) == ()  # its 1g.10gb has 1/8 of the bandwidth


def test_a_busy_time_sliced_job_gets_no_mps_cap():
    th = load_thresholds()
    busy = rec_row("time-slicing", th.exclusive.min_activity, 10)
    assert Kind.MPS not in [m.kind for m in modes.modes_of(busy, th)]


def test_all_mps_frees_the_gpu_the_chosen_mig_and_mps_mix_loses():
    th = load_thresholds()
    items = [
        item_for("s0", rec_row("mig", 0.2, 20), "GPU-m0", "mig"),
        item_for("s1", rec_row("mig", 0.2, 20), "GPU-m1", "mig"),
        item_for("x", rec_row("mps", 0.2, 20), "GPU-x", "exclusive"),
    ]
    per_job = min(len(_packing(items, th, in_place)[0]) for in_place in (True, False))
    bins, moved = fewest_moves(items, th)
    assert (per_job, len(bins)) == (2, 1)
    assert bins[0].mode == Kind.MPS and sorted(i.job_id for i in bins[0].items) == ["s0", "s1", "x"]
    expected = mps_settings(0.2, 20 * GIB, th)
    assert moved["s0"]["recommendation"] == Kind.MPS
    assert moved["s0"]["mps_active_thread_percentage"] == expected.thread_percentage
    assert moved["s0"]["mps_pinned_memory_limit_bytes"] == expected.pinned_memory_limit_bytes
    assert "1 GPU(s), 2 with each job's recommended mode" in moved["s0"]["note"]
    assert "x" not in moved  # it runs as recommended


def test_the_joint_mode_is_the_one_every_emitted_file_carries(th):
    jobs = [
        SynthJob(
            f"s{i}",
            f"GPU-m{i}",
            steady(60, 0.20, 0.005, seed=i),
            flat(60, 20 * GIB),
            model=H100,
            sharing="mig",
            gpu_instance="1",
            mig_profile="3g.40gb",
        )
        for i in range(2)
    ] + [SynthJob("x", "GPU-x", steady(60, 0.20, 0.005, seed=5), flat(60, 20 * GIB), model=H100)]
    profiles = profiles_from_samples(synth.frame(jobs), synth.STEP, th)
    analysis = analyze_profiles(profiles, th, "test", with_archetypes=False)
    assert (analysis.plan.gpus_before, analysis.plan.gpus_after) == (3, 1)
    recs = analysis.recs.set_index("job_id")
    assert list(recs["recommendation"]) == ["mps"] * 3
    assert recs["mig_profile"].isna().all()
    [entry] = analysis.plan.layout
    for client in entry["mps_clients"]:
        row = recs.loc[client["job_id"]]
        assert client["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == row["mps_active_thread_percentage"]
        assert client["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == row["mps_pinned_memory_limit_bytes"]
    emitted = emit(analysis.plan, context_from_rows(analysis.recs.to_dict("records")))  # validated inside
    assert check_all(emitted) == []
    assert violations(analysis, inventory=3) == []


def _fits_as_packed(gpu: GpuBin, th: Thresholds) -> bool:
    """Every job of `gpu` passes the fit tests against those placed before it, in its order."""
    model = model_for_nvml_name(gpu.model)
    rebuilt = GpuBin(name=gpu.name, model=gpu.model, mode=gpu.mode)
    for item in gpu.items:
        if not fits(rebuilt, item, model, th):
            return False
        rebuilt.items.append(item)
    return True


def _allowed(item: Item, th: Thresholds) -> set[Mode]:
    """The modes a packed job may run in: its own modes, or what a lone sharer becomes (whole,
    time-sliced, MPS as `mps_settings` sizes it, its MIG alternative)."""
    mps = mps_settings(item.sm, item.memory, th)
    return {
        *item.modes,
        Mode(Kind.EXCLUSIVE),
        Mode(Kind.TIME_SLICING),
        Mode(Kind.MPS, thread_pct=mps.thread_percentage, memory_limit=mps.pinned_memory_limit_bytes),
        Mode(Kind.MIG, mig_profile=item.mig_alternative),
    }


def _settings_hold(item: Item) -> bool:
    """A packed job's settings hold its need: an MPS limit or MIG slice at least its memory need,
    an MPS cap at least its demand, both as recommend.py sizes them."""
    if item.kind == Kind.MPS:
        return (item.memory_limit or 0) >= item.memory and (item.thread_pct or 0) >= item.sm * 100
    if item.kind == Kind.MIG:
        return H100_MODEL.mig_profile(str(item.mig_profile)).memory_bytes >= item.memory
    return True


jobs_strategy = st.lists(
    st.tuples(
        st.sampled_from(["mig", "mps", "mps", "time-slicing"]),
        st.sampled_from([0.03, 0.06, 0.1, 0.15, 0.2, 0.3]),  # demand at the sizing percentile
        st.sampled_from([4, 8, 16, 20, 30]),  # memory need, GiB
        st.sampled_from(["mig", "mps", "exclusive"]),  # how it runs now
        st.integers(0, 5),  # the GPU it runs on now
        st.sampled_from([(0.0, 3600.0), (0.0, 7200.0), (1800.0, 7200.0), (7300.0, 9000.0)]),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs_strategy)
def test_the_joint_plan_never_needs_more_gpus_than_each_jobs_own_mode_and_every_gpu_fits(spec):
    th = load_thresholds()
    items = [
        item_for(f"j{n}", rec_row(kind, sm, gib), f"GPU-{gpu}", now, *span)
        for n, (kind, sm, gib, now, gpu, span) in enumerate(spec)
    ]
    per_job = min(len(_packing(items, th, in_place)[0]) for in_place in (True, False))
    bins, _ = fewest_moves(items, th)
    assert len(bins) <= per_job
    assert Counter(i.job_id for b in bins for i in b.items) == Counter(i.job_id for i in items)
    for gpu in bins:
        assert all(i.kind == gpu.mode for i in gpu.items)
        assert _fits_as_packed(gpu, th)
        assert all(_settings_hold(i) for i in gpu.items)
        for item in gpu.items:
            assert _mode_of(item) in _allowed(item, th)


def test_the_gate_skips_a_model_whose_lower_bound_cannot_beat_the_packing():
    th = load_thresholds()
    # two 25 % jobs: one MPS GPU holds both, so no choice of modes can need fewer
    items = [
        item_for("a", rec_row("mps", 0.2, 8), "GPU-a", "mps"),
        item_for("b", rec_row("mps", 0.2, 8), "GPU-a", "mps"),
    ]
    spans = [modes.Span(i.start, i.end, i.modes, i.memory) for i in items]
    assert modes.lower_bound(H100, spans) == 1
    bins, moved = fewest_moves(items, th)
    assert len(bins) == 1 and moved == {}


# (SM demand, memory GiB) that `mps_settings` sizes to caps 37, 31, 31, 30, 25, 19 % (a 20 % job
# with the most memory is added as a MIG or MPS job): decreasing by size, its memory puts it first
# and the caps fill three GPUs; decreasing by share, two (37+31+31, 30+25+20+19)
_SHARES = {
    "a": (0.308, 15),
    "b": (0.258, 21),
    "c": (0.251, 11),
    "d": (0.248, 19),
    "e": (0.201, 16),
    "f": (0.151, 10),
}


def _clients(big_kind: str) -> list[Item]:
    items = [
        item_for(j, rec_row("mps", sm, gib), f"GPU-{j}", "exclusive") for j, (sm, gib) in _SHARES.items()
    ]
    return [*items, item_for("big", rec_row(big_kind, 0.162, 26.25), "GPU-big", big_kind)]


def test_the_shares_are_the_ones_the_example_names():
    shares = sorted(m.thread_pct for i in _clients("mps") for m in i.modes[:1])
    assert shares == [19, 20, 25, 30, 31, 31, 37]


def test_packing_by_decreasing_share_fills_mps_gpus_that_decreasing_size_leaves_short():
    th = load_thresholds()
    items = _clients("mps")
    by_size, _ = _packing(items, th, False)
    by_share, _ = _packing(items, th, False, by_share=True)
    assert (len(by_size), len(by_share)) == (3, 2)
    assert sorted(sum(i.thread_pct or 0 for i in b.items) for b in by_share) == [94, 99]
    assert all(_fits_as_packed(b, th) for b in by_share)


def test_the_joint_packing_moves_a_mig_job_onto_mps_where_decreasing_shares_free_a_gpu():
    th = load_thresholds()
    bins, moved = fewest_moves(_clients("mig"), th)
    assert len(bins) == 2 and {b.mode for b in bins} == {Kind.MPS}
    assert moved["big"]["recommendation"] == Kind.MPS and moved["big"]["mps_active_thread_percentage"] == 20
