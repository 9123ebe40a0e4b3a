"""The slow tier: limits and modes are read on every Nth sample; fault values on every sample."""

from __future__ import annotations

import pytest

from gpulens.exporter.app import Exporter
from gpulens.exporter.cli import parse_config
from gpulens.exporter.config import ConfigError
from tests.exporter.conftest import make_exporter
from tests.exporter.expo import value
from tests.sim.static_node import StaticNode


def text_of(exporter: Exporter) -> str:
    return exporter.render(exporter.sample_once()).text.decode()


def power_limit(text: str) -> float | None:
    return value(text, "gpu_power_limit_watts", gpu="2")


def ecc(text: str, scope: str) -> float | None:
    return value(text, "gpu_ecc_errors_total", gpu="2", error="uncorrected", scope=scope)


def test_a_changed_power_limit_is_served_from_the_next_slow_sample(node: StaticNode) -> None:
    exporter = make_exporter(node, slow_every=3)
    try:
        first = power_limit(text_of(exporter))  # sample 0: the slow tier is read
        node.update(2, power_limit_mw=150_000)
        assert power_limit(text_of(exporter)) == first  # samples 1 and 2 repeat it
        assert power_limit(text_of(exporter)) == first
        assert power_limit(text_of(exporter)) == 150.0  # sample 3 reads it again
    finally:
        exporter.close()


def test_volatile_ecc_errors_are_read_every_sample_and_aggregate_ones_on_slow_samples(
    node: StaticNode,
) -> None:
    exporter = make_exporter(node, slow_every=3)
    try:
        text_of(exporter)
        node.update(2, ecc_totals={(0, 0): 4, (1, 0): 5, (0, 1): 17, (1, 1): 6})
        text = text_of(exporter)
        assert ecc(text, "volatile") == 5
        assert ecc(text, "aggregate") == 1  # still the slow sample's answer
        text_of(exporter)
        assert ecc(text_of(exporter), "aggregate") == 6
    finally:
        exporter.close()


def test_every_sample_reads_everything_when_the_tier_is_off(node: StaticNode) -> None:
    exporter = make_exporter(node, slow_every=1)
    try:
        text_of(exporter)
        node.update(2, power_limit_mw=150_000)
        assert power_limit(text_of(exporter)) == 150.0
    finally:
        exporter.close()


def test_a_gpu_that_comes_back_reads_its_slow_values_afresh(node: StaticNode) -> None:
    exporter = make_exporter(node, slow_every=100)
    try:
        text_of(exporter)
        node.update(2, lost=True)
        text_of(exporter)
        node.update(2, lost=False, power_limit_mw=150_000)
        assert power_limit(text_of(exporter)) == 150.0
    finally:
        exporter.close()


def test_the_slow_tier_changes_no_family_or_label(node: StaticNode) -> None:
    tiered = make_exporter(node, slow_every=12)
    every = make_exporter(node, slow_every=1)
    try:
        for _ in range(2):  # the second sample is the first from the slow tier's repeat
            a, b = text_of(tiered), text_of(every)

        def series(text: str) -> set[str]:
            return {line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}

        assert series(a) == series(b)
    finally:
        tiered.close()
        every.close()


def test_the_slow_tier_flag_is_validated() -> None:
    assert parse_config(["--nvml.slow-fields-every", "1"]).slow_every == 1
    with pytest.raises(ConfigError, match="slow-fields-every"):
        parse_config(["--nvml.slow-fields-every", "0"])
