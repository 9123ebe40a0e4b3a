"""Per-job SM figures are shares of the device's figure: the jobs plus the remainder add up to it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.exporter.attribution.shares import capped_shares, remainder, sm_shares

_weights = st.dictionaries(st.sampled_from("abcdef"), st.one_of(st.none(), st.floats(0, 1.5)), max_size=6)
_ratio = st.floats(0, 1)


@given(_weights, _ratio, st.one_of(st.none(), _ratio))
def test_shares_and_remainder_add_up_to_the_device_figure(weights, device, duty) -> None:
    shares = sm_shares(weights, device, duty)
    known = [s for s in shares.values() if s is not None]
    assert all(s >= 0 for s in known)
    assert sum(known) + remainder(device, shares) == pytest.approx(device, abs=1e-9)
    assert {k for k, s in shares.items() if s is None} == {k for k, w in weights.items() if w is None}


@given(_weights, _ratio, st.one_of(st.none(), _ratio))
def test_shares_keep_the_jobs_order(weights, device, duty) -> None:
    shares = sm_shares(weights, device, duty)
    known = [(w, shares[k]) for k, w in weights.items() if w is not None]
    for w1, s1 in known:
        for w2, s2 in known:
            if w1 < w2:
                assert s1 <= s2  # type: ignore[operator]


def test_overlapping_mps_clients_are_scaled_down_to_the_device() -> None:
    # dgx-h100 GPU 2: clients' per-process times sum past the device's busy time
    shares = sm_shares({"a": 0.7, "b": 0.5, "c": 0.34}, device=0.88, duty=0.9)
    assert sum(shares.values()) == pytest.approx(0.88)  # type: ignore[arg-type]
    assert shares["a"] == pytest.approx(0.88 * 0.7 / 1.54)


def test_processes_that_account_for_part_of_the_busy_time_leave_a_remainder() -> None:
    shares = sm_shares({"a": 0.2, "b": 0.2}, device=0.6, duty=0.8)
    assert shares == {"a": pytest.approx(0.15), "b": pytest.approx(0.15)}
    assert remainder(0.6, shares) == pytest.approx(0.3)


def test_an_exclusive_job_gets_the_whole_device_figure() -> None:
    assert sm_shares({"a": 0.9}, device=0.55, duty=0.9) == {"a": pytest.approx(0.55)}


_capacity = st.dictionaries(st.sampled_from("abcdef"), st.one_of(st.none(), st.floats(0, 1.5)), max_size=6)


@given(_capacity, _ratio)
def test_capped_shares_and_remainder_add_up_to_the_device_figure(capacity, device) -> None:
    shares = capped_shares(capacity, device)
    known = [s for s in shares.values() if s is not None]
    assert all(s >= 0 for s in known)
    assert sum(known) + remainder(device, shares) == pytest.approx(device, abs=1e-9)


@given(_capacity, _ratio)
def test_no_mps_client_is_given_more_than_it_could_add(capacity, device) -> None:
    shares = capped_shares(capacity, device)
    for key, most in capacity.items():
        if most is not None:
            assert shares[key] <= most + 1e-12


def test_a_client_busy_all_the_time_at_a_30_percent_cap_reads_30_percent_beside_a_lighter_one() -> None:
    # a: kernels all the time, 30 % of the SMs; b: uncapped, kernels 20 % of the time
    shares = capped_shares({"a": 1.0 * 0.3, "b": 0.2 * 1.0}, device=0.5)
    assert shares == {"a": pytest.approx(0.3), "b": pytest.approx(0.2)}
    # weighed by time alone, a would read 0.5 x 1.0 / 1.2 = 0.42, above its own cap
    assert sm_shares({"a": 1.0, "b": 0.2}, device=0.5, duty=1.0)["a"] == pytest.approx(0.5 / 1.2)


def test_a_device_busier_than_its_capped_clients_could_make_it_keeps_the_rest_unattributed() -> None:
    shares = capped_shares({"a": 0.3, "b": 0.3}, device=0.8)
    assert shares == {"a": pytest.approx(0.3), "b": pytest.approx(0.3)}
    assert remainder(0.8, shares) == pytest.approx(0.2)


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 1), min_size=1, max_size=6),
    st.floats(0, 1),
    st.floats(0, 1),
)
def test_with_every_cap_at_one_the_capped_split_is_the_time_split(weights, busy, active) -> None:
    # clients known to run at 100 % (a daemon's cap of 1): on SM activity D, which is at most the
    # union of busy times U, itself at most the clients' summed times when they account for it
    duty = busy * min(sum(weights.values()), 1.0)
    device = active * duty
    capped = capped_shares(dict(weights), device)
    timed = sm_shares(dict(weights), device, duty)
    assert capped == pytest.approx(timed, abs=1e-12)
