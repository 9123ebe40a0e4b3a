"""The engine-to-driver records keep dataclass semantics with their one-step `__init__`."""

from __future__ import annotations

import dataclasses

import pytest

from gpulens.sim.state import ActivityState, NvLinkState, ProcessState


def test_a_record_gets_every_declared_default() -> None:
    proc = ProcessState(pid=7, kind="compute", used_memory_bytes=None)
    for f in dataclasses.fields(ProcessState):
        if f.default is not dataclasses.MISSING:
            assert getattr(proc, f.name) == f.default


def test_default_factories_give_each_record_its_own_value() -> None:
    a, b = NvLinkState(link=0, active=True, tx_kib_total=0, rx_kib_total=0), NvLinkState(1, False, 0, 0)
    assert a.errors == {} and a.errors is not b.errors


def test_positional_and_keyword_arguments_build_equal_hashable_records() -> None:
    by_position = ProcessState(7, "compute", 1024, 3, 4, 0, 0, 12.5, "train")
    by_name = ProcessState(
        pid=7,
        kind="compute",
        used_memory_bytes=1024,
        sm_util_percent=3,
        mem_util_percent=4,
        gpu_instance_id=0,
        compute_instance_id=0,
        start_time=12.5,
        name="train",
    )
    assert by_position == by_name and hash(by_position) == hash(by_name)
    assert dataclasses.replace(by_name, pid=8).pid == 8


def test_records_stay_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ActivityState().sm = 1.0  # type: ignore[misc]


def test_a_missing_required_field_is_still_a_type_error() -> None:
    with pytest.raises(TypeError):
        ProcessState(pid=1)  # type: ignore[call-arg]
