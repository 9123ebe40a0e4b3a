"""The plan keeps, per GPU model, the packing with the fewest GPUs and then the fewest moved jobs."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpulens.analyzer.bins import GpuBin, Item, fits
from gpulens.analyzer.packing import _moves, best_per_model, fewest_moves, pack, settle_lone_sharers
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.catalog import model_for_nvml_name

GIB = 1024**3
A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"


def job(job_id: str, model: str, origin: str, kind: str = "mps", share: int = 30) -> Item:
    return Item(
        job_id=job_id,
        kind=kind,
        model=model,
        start=0.0,
        end=3600.0,
        gpus=1,
        memory=4 * GIB,
        sm=share / 100 * 0.5,
        load=share / 100 * 0.3,
        used_hours=1.0,
        origin_model=model,
        origin_mode=kind,
        origin_uuids=(origin,),
        thread_pct=share,
        memory_limit=4 * GIB,
    )


def gpu(name: str, model: str, *items: Item) -> GpuBin:
    return GpuBin(name=name, model=model, mode="mps", items=list(items))


def test_each_model_takes_the_packing_best_for_it():
    a1, a2 = job("a1", A100, "GPU-a1"), job("a2", A100, "GPU-a1")
    h1, h2 = job("h1", H100, "GPU-h1"), job("h2", H100, "GPU-h2")
    # in place: the A100 jobs stay together where they are; the H100 jobs keep two GPUs
    in_place = ([gpu("A#1", A100, a1, a2), gpu("H#1", H100, h1), gpu("H#2", H100, h2)], {"h1": {"x": 1}})
    # from scratch: the same one A100 GPU, but on the other job's GPU (a move for nothing); one H100
    moved_a1 = replace(a1, origin_uuids=("GPU-a9",))
    from_scratch = ([gpu("A#1", A100, moved_a1, a2), gpu("H#1", H100, h1, h2)], {"a1": {"y": 2}})
    bins, moved = best_per_model([in_place, from_scratch], {"a1": A100, "a2": A100, "h1": H100, "h2": H100})
    packed = [(b.model, [i.job_id for i in b.items]) for b in bins]
    assert packed == [(A100, ["a1", "a2"]), (H100, ["h1", "h2"])]
    assert bins[0] is in_place[0][0] and bins[1] is from_scratch[0][1]
    assert moved == {}  # h1's change belongs to the H100 packing not taken, a1's to the A100 one


def test_a_tie_keeps_the_first_packing_whole():
    a = job("a", A100, "GPU-a")
    first = ([gpu("A#1", A100, a)], {"a": {"note": "first"}})
    second = ([gpu("A#1", A100, replace(a))], {"a": {"note": "second"}})
    assert best_per_model([first, second], {"a": A100}) is first


def _packings(items: list[Item]) -> list[list[GpuBin]]:
    th = load_thresholds()
    return [
        settle_lone_sharers(pack([replace(i) for i in items], th, in_place=in_place), th)[0]
        for in_place in (True, False)
    ]


# model, GPU now, kind, kind now, MPS share, GiB, start, end
JobSpec = tuple[str, str, str, str, int, int, float, float]

jobs_strategy = st.lists(
    st.tuples(
        st.sampled_from([A100, H100]),
        st.sampled_from(["GPU-1", "GPU-2", "GPU-3", "GPU-4", "GPU-5"]),
        st.sampled_from(["mps", "mps", "time-slicing", "exclusive"]),
        st.sampled_from(["mps", "exclusive"]),
        st.sampled_from([10, 20, 30, 40, 50, 60]),
        st.sampled_from([2, 4, 8, 16, 30]),
        st.sampled_from([0.0, 1800.0]),
        st.sampled_from([3600.0, 7200.0]),
    ),
    min_size=1,
    max_size=12,
)

# found by a random search: the H100 jobs free a GPU only when packed from scratch, the A100 jobs
# are packed as well in place with fewer moves (one packing for both moved A100 jobs for nothing)
TWO_MODELS_DISAGREE: list[JobSpec] = [
    (A100, "GPU-1", "mps", "exclusive", 10, 8, 1800.0, 3600.0),
    (H100, "GPU-3", "mps", "exclusive", 10, 30, 1800.0, 3600.0),
    (A100, "GPU-2", "time-slicing", "exclusive", 0, 4, 1800.0, 7200.0),
    (H100, "GPU-3", "mps", "mps", 60, 8, 0.0, 3600.0),
    (H100, "GPU-5", "mps", "exclusive", 60, 30, 1800.0, 3600.0),
    (H100, "GPU-2", "time-slicing", "exclusive", 0, 2, 1800.0, 3600.0),
    (A100, "GPU-5", "mps", "mps", 10, 30, 1800.0, 3600.0),
    (A100, "GPU-1", "mps", "mps", 40, 4, 0.0, 7200.0),
]


def _items(spec: list[JobSpec]) -> list[Item]:
    items = []
    for n, (model, uuid, kind, now, share, gib, start, end) in enumerate(spec):
        item = replace(
            job(f"j{n}", model, f"{model[:10]}-{uuid}", share=share or 10),
            kind=kind,
            origin_mode=now,
            start=start,
            end=end,
            memory=gib * GIB,
        )
        item.thread_pct, item.memory_limit = (share, gib * GIB) if kind == "mps" else (None, None)
        items.append(item)
    return items


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs_strategy)
@example(TWO_MODELS_DISAGREE)
def test_no_model_gets_more_gpus_or_more_moves_than_its_best_packing(spec):
    items = _items(spec)
    bins, _ = fewest_moves(items, load_thresholds())
    assert Counter(i.job_id for b in bins for i in b.items) == Counter(i.job_id for i in items)
    candidates = _packings(items)
    for model in {i.model for i in items}:
        mine = [b for b in bins if b.model == model]
        theirs = [[b for b in packed if b.model == model] for packed in candidates]
        fewest = min(len(group) for group in theirs)
        assert len(mine) == fewest
        assert _moves(mine) == min(_moves(group) for group in theirs if len(group) == fewest)


# -- orchestrators: a pod cannot run on a Slurm node, nor a Slurm job on a Kubernetes node


def test_a_kubernetes_job_does_not_fit_a_gpu_a_slurm_job_holds():
    th = load_thresholds()
    held = GpuBin(name="A#1", model=A100, mode="mps")
    held.add(replace(job("s", A100, "GPU-s", share=20), source="slurm"))
    model = model_for_nvml_name(A100)
    assert fits(held, replace(job("k", A100, "GPU-k", share=20), source="kubernetes"), model, th) is False
    assert fits(held, replace(job("s2", A100, "GPU-k", share=20), source="slurm"), model, th) is True


def test_light_mps_jobs_of_two_orchestrators_are_packed_on_a_gpu_each():
    items = [
        replace(job("k", A100, "GPU-k", share=20), source="kubernetes"),
        replace(job("s", A100, "GPU-s", share=20), source="slurm"),
    ]
    bins = pack(items, load_thresholds())
    assert sorted([i.job_id for i in b.items] for b in bins) == [["k"], ["s"]]
    assert sorted(b.orchestrator for b in bins) == ["kubernetes", "slurm"]


def test_whole_gpu_jobs_in_turn_reuse_a_gpu_only_within_one_orchestrator():
    def whole(job_id: str, source: str, start: float) -> Item:
        item = replace(job(job_id, A100, f"GPU-{job_id}", kind="exclusive"), source=source)
        item.start, item.end, item.thread_pct, item.memory_limit = start, start + 1800.0, None, None
        return item

    th = load_thresholds()
    mixed = pack([whole("k", "kubernetes", 0.0), whole("s", "slurm", 3600.0)], th)
    assert sorted([i.job_id for i in b.items] for b in mixed) == [["k"], ["s"]]
    same = pack([whole("s1", "slurm", 0.0), whole("s2", "slurm", 3600.0)], th)
    assert [sorted(i.job_id for i in b.items) for b in same] == [["s1", "s2"]]


def test_a_job_of_unknown_source_shares_with_either_but_never_joins_them():
    th = load_thresholds()
    model = model_for_nvml_name(A100)
    gpu = GpuBin(name="A#1", model=A100, mode="mps")
    gpu.add(job("u", A100, "GPU-u", share=20))  # no job_source
    assert gpu.orchestrator == ""
    assert fits(gpu, replace(job("s", A100, "GPU-s", share=20), source="slurm"), model, th) is True
    gpu.add(replace(job("k", A100, "GPU-k", share=20), source="kubernetes"))
    assert fits(gpu, replace(job("s", A100, "GPU-s", share=20), source="slurm"), model, th) is False
    assert fits(gpu, job("u2", A100, "GPU-u2", share=20), model, th) is True


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs_strategy, st.lists(st.sampled_from(["kubernetes", "slurm", ""]), min_size=12, max_size=12))
def test_no_packed_gpu_holds_jobs_of_two_orchestrators(spec, sources):
    items = [replace(i, source=s) for i, s in zip(_items(spec), sources, strict=False)]
    bins, _ = fewest_moves(items, load_thresholds())
    assert Counter(i.job_id for b in bins for i in b.items) == Counter(i.job_id for i in items)
    for b in bins:
        assert len({i.source for i in b.items} - {""}) <= 1, [(i.job_id, i.source) for i in b.items]
