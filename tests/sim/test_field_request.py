"""The exporter's field-value request (rawcalls.FieldRequest) reads what pynvml's wrapper reads.

Every entry of an answer carries its own nvmlReturn and value type: the request's one-unpack path
(all entries succeeded, all unsigned long long) and its entry-by-entry path must give the values
pynvml gives, on both simulated drivers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pynvml
import pytest

from gpulens.exporter.backends.rawcalls import FieldRequest
from gpulens.sim.nvml import SimLib
from tests.sim.static_node import StaticNode, example_node, installed

ULL_FIELDS = [
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1),
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0),
]


@pytest.fixture(name="sim")
def _sim(nvml_driver: str) -> Iterator[tuple[StaticNode, SimLib]]:
    yield from installed(example_node(), nvml_driver)


def _pynvml_values(
    handle: Any, requests: Sequence[int | tuple[int, int]]
) -> dict[tuple[int, int], float | int]:
    """{(field, scope): value} of the entries pynvml reports as succeeded."""
    keys = [(r, 0) if isinstance(r, int) else r for r in requests]
    out: dict[tuple[int, int], float | int] = {}
    for key, entry in zip(keys, pynvml.nvmlDeviceGetFieldValues(handle, list(requests)), strict=True):
        if entry.nvmlReturn == pynvml.NVML_SUCCESS:
            out[key] = getattr(entry.value, {3: "ullVal", 1: "uiVal"}[entry.valueType])
    return out


def test_all_unsigned_long_long_answers_read_at_once_equal_pynvml(sim) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    values, failed = FieldRequest(ULL_FIELDS)(handle)
    assert failed == []
    assert values == _pynvml_values(handle, ULL_FIELDS)


def test_mixed_types_and_failed_entries_are_read_entry_by_entry(sim) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    requests = [*ULL_FIELDS, pynvml.NVML_FI_DEV_MEMORY_TEMP, 307]  # an unsigned int, an unsupported id
    values, failed = FieldRequest(requests)(handle)
    assert failed == [((307, 0), pynvml.NVML_ERROR_NOT_SUPPORTED)]
    assert values == _pynvml_values(handle, requests)
    assert values[(pynvml.NVML_FI_DEV_MEMORY_TEMP, 0)] == 35


def test_an_empty_request_makes_no_call(sim) -> None:
    assert FieldRequest([])(None) == ({}, [])
