"""A capped MPS GPU's unattributed remainder goes by each client's room under its thread cap
(issue 30 items 4 and 6; `profile._room_split`, `promexpr.capped_share_expr`).

Under caps the exporter gives each client at most its busy time x its cap, so the remainder is
what the GPU did beyond the clients' bounds. Split by share, a client already at its cap took
most of it and read as binding its cap (a false `roll back`). Shares and remainders here are
binary fractions, so the expected demands are exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpulens.analyzer.history import write_history
from gpulens.analyzer.profile import profiles_from_samples
from gpulens.analyzer.sources import files
from gpulens.analyzer.sources.promclient import PromClient, PromConfig
from gpulens.analyzer.sources.prometheus import PromSource
from tests.analyzer import synth
from tests.analyzer.synth import SynthJob, flat, steady
from tests.support.procs import (
    PROMETHEUS_ENGINES,
    backfill_openmetrics,
    find_binary,
    prometheus,
    use_prometheus,
)

GIB = 1024**3
STEPS = 20


def _client(job_id: str, share: float, cap: float | None, uuid: str = "GPU-m") -> SynthJob:
    caps = None if cap is None else flat(STEPS, cap)
    return SynthJob(job_id, uuid, flat(STEPS, share), flat(STEPS, GIB), sharing="mps", thread_cap=caps)


def _demand(jobs: list[SynthJob], th, remainder: float, profiled: bool = True) -> dict[str, float]:
    samples = synth.with_device_shares(synth.frame(jobs), remainder=remainder, profiled=profiled)
    p = profiles_from_samples(samples, synth.STEP, th).set_index("job_id")
    return {job: float(p.loc[job, "sm_active_mean"]) for job in p.index}


def test_a_client_at_its_cap_takes_none_of_the_remainder(th):
    demand = _demand([_client("at-cap", 0.25, 0.25), _client("uncapped", 0.125, None)], th, remainder=0.25)
    assert demand == {"at-cap": 0.25, "uncapped": 0.375}


def test_the_remainder_is_split_in_proportion_to_each_clients_room_under_its_cap(th):
    """room = cap - share: 0.375 - 0.125 = 0.25 and, without a cap, 1 - 0.25 = 0.75."""
    demand = _demand([_client("capped", 0.125, 0.375), _client("uncapped", 0.25, None)], th, remainder=0.25)
    assert demand == {"capped": 0.125 + 0.25 * 0.25, "uncapped": 0.25 + 0.25 * 0.75}


def test_the_mps_server_takes_none_of_the_remainder(th):
    """The exporter lists the MPS server as the `mps_server` pseudo-job with a share of 0 and no
    cap; it runs no kernels of its own, so the room it has under no cap is not room for the
    clients' work (a bursty client alone under its cap read a quarter of what it did)."""
    server = SynthJob("mps_server", "GPU-m", flat(STEPS, 0.0), flat(STEPS, GIB // 32), sharing="mps")
    demand = _demand([_client("capped", 0.125, 0.375), server], th, remainder=0.25)
    assert demand["capped"] == 0.375


def test_what_no_client_has_room_for_stays_unattributed(th):
    demand = _demand([_client("full", 0.25, 0.25), _client("near", 0.25, 0.375)], th, remainder=0.5)
    assert demand == {"full": 0.25, "near": 0.375}


def test_a_client_over_its_cap_has_no_room_rather_than_less_than_none(th):
    """A share above the cap (a cap lowered within the step) counts room 0, not a negative one."""
    demand = _demand([_client("over", 0.375, 0.25), _client("other", 0.125, 0.5)], th, remainder=0.25)
    assert demand == {"over": 0.375, "other": 0.375}


def test_without_caps_the_remainder_is_split_in_proportion_to_the_shares(th):
    demand = _demand([_client("a", 0.125, None), _client("b", 0.25, None)], th, remainder=0.25)
    assert demand == pytest.approx({"a": 0.125 * 0.625 / 0.375, "b": 0.25 * 0.625 / 0.375}, rel=1e-12)


def test_on_utilization_the_caps_do_not_split_the_remainder(th):
    """A cap bounds the SMs a client uses, not the time its kernels run: utilization's remainder
    is split by share whatever the caps."""
    jobs = [_client("a", 0.125, 0.125), _client("b", 0.25, None)]
    demand = _demand(jobs, th, remainder=0.25, profiled=False)
    assert demand == pytest.approx({"a": 0.125 * 0.625 / 0.375, "b": 0.25 * 0.625 / 0.375}, rel=1e-12)


def test_only_steps_with_a_published_cap_split_by_room(th):
    """A cap published for the second half of the window only: the first half splits by share."""
    half = STEPS // 2
    caps = np.concatenate([np.full(half, np.nan), flat(STEPS - half, 0.25)])
    jobs = [
        SynthJob("a", "GPU-m", flat(STEPS, 0.25), flat(STEPS, GIB), sharing="mps", thread_cap=caps),
        _client("b", 0.25, None),
    ]
    demand = _demand(jobs, th, remainder=0.25)
    assert demand == {"a": (0.375 + 0.25) / 2, "b": (0.375 + 0.5) / 2}


def _mixed_fleet() -> list[SynthJob]:
    """A capped GPU whose caps change mid-window and whose one client has none, with shares that
    cross a cap, and its MPS server's row; and an uncapped MPS GPU beside it."""
    tight = np.concatenate([flat(30, 0.2), flat(30, 0.3)])
    return [
        SynthJob(
            "c-1", "GPU-c", steady(60, 0.22, 0.05, seed=1), flat(60, GIB), sharing="mps", thread_cap=tight
        ),
        SynthJob(
            "c-2",
            "GPU-c",
            steady(60, 0.1, 0.05, seed=2),
            flat(60, GIB),
            sharing="mps",
            thread_cap=flat(60, 0.4),
        ),
        SynthJob("c-3", "GPU-c", steady(60, 0.15, 0.05, seed=3), flat(60, GIB), sharing="mps"),
        SynthJob("mps_server", "GPU-c", flat(60, 0.0), flat(60, GIB // 32), sharing="mps"),
        SynthJob("u-1", "GPU-u", steady(60, 0.3, 0.05, seed=4), flat(60, GIB), sharing="mps"),
        SynthJob("u-2", "GPU-u", steady(60, 0.1, 0.05, seed=5), flat(60, GIB), sharing="mps"),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("engine", PROMETHEUS_ENGINES)
def test_the_prometheus_path_splits_a_capped_remainder_as_the_file_path_does(
    tmp_path, th, engine, monkeypatch
):
    """One job a chunk: each job's device sums come from jobs another chunk asks for."""
    use_prometheus(engine, monkeypatch)
    start = synth.START
    samples = synth.with_device_shares(synth.frame(_mixed_fleet(), start=start), remainder=0.15)
    write_history(tmp_path / "h", samples, {"step_s": synth.STEP})
    backfill_openmetrics(tmp_path / "h" / "metrics.om", tmp_path / "db", find_binary("promtool"))
    end, window = start + 60 * synth.STEP, 2 * 3600.0  # the whole history, and none before it
    from_files = files.profiles(files.load(str(tmp_path / "h"), window, end), th).set_index("job_id")
    with prometheus(tmp_path, [], storage=tmp_path / "db", extra_args=["--query.lookback-delta=30s"]) as api:
        source = PromSource(PromClient(PromConfig(api.base_url)), window, end, synth.STEP, chunk_size=1)
        from_prom = source.profiles(th).set_index("job_id")
    columns = ["sm_active_mean", "sm_active_p50", "sm_active_p95", "sm_active_max", "idle_fraction"]
    assert list(from_prom["activity_signal"]) == ["sm_active_share"] * 6
    got, want = from_prom.loc[from_files.index, columns], from_files[columns]
    assert np.allclose(got.to_numpy(float), want.to_numpy(float), rtol=1e-9), (got, want)
    # and the caps decided: without them, the client nearest its cap would read more
    by_share = profiles_from_samples(
        samples[samples["metric"] != "gpu_job_mps_active_thread_ratio"], synth.STEP, th
    ).set_index("job_id")
    assert from_prom.loc["c-1", "sm_active_p95"] < by_share.loc["c-1", "sm_active_p95"]
