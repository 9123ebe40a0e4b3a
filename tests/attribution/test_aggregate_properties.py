"""Invariants of the per-job aggregation, whatever the processes and identities."""

from hypothesis import given
from hypothesis import strategies as st

from gpulens.exporter.attribution import JobIdentity
from gpulens.exporter.attribution.aggregate import aggregate
from tests.attribution.fakes import proc

_identity = st.builds(
    JobIdentity,
    job_id=st.sampled_from(["1", "2", "3", "ml/a", "unknown", "mps_server", "other"]),
    source=st.sampled_from(["slurm", "kubernetes", "mapping", "unknown", "system"]),
    container=st.sampled_from(["", "main", "side"]),
)
_process = st.builds(
    proc,
    pid=st.integers(1, 500),
    gpu=st.integers(0, 2),
    memory=st.one_of(st.none(), st.integers(0, 1 << 40)),
    sm=st.one_of(st.none(), st.floats(0, 1)),
    kind=st.sampled_from(["compute", "graphics", "mps_client", "mps_server"]),
    gi=st.one_of(st.none(), st.integers(1, 3)),
)


@given(st.lists(st.tuples(_process, _identity), max_size=40), st.integers(2, 5))
def test_memory_adds_up_rows_are_unique_and_ratios_bounded(pairs, max_jobs):
    usages, _ = aggregate(pairs, {(0, 1): 0.5}, max_jobs)
    keys = [(u.gpu, u.gpu_instance, u.identity.job_id) for u in usages]
    assert len(keys) == len(set(keys))
    for device in {(p.gpu, p.gpu_instance) for p, _ in pairs}:
        rows = [u for u in usages if (u.gpu, u.gpu_instance) == device]
        expected = sum(p.used_memory_bytes or 0 for p, _ in pairs if (p.gpu, p.gpu_instance) == device)
        assert sum(u.memory_used_bytes for u in rows) == expected
        assert sum(u.processes for u in rows) == sum(1 for p, _ in pairs if (p.gpu, p.gpu_instance) == device)
        assert len(rows) <= max_jobs
        assert len({u.sharing for u in rows}) == 1
    assert all(u.sm_utilization_ratio is None or 0 <= u.sm_utilization_ratio <= 1 for u in usages)
