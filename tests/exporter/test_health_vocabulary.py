"""The closed sets of label values the health, NVLink and thermal families carry: one StrEnum
each in snapshot.py, read by the backend and documented in the family's label column."""

from __future__ import annotations

from enum import StrEnum

import pytest

from gpulens.exporter.backends.nvml import (
    ECC_COUNTERS,
    ECC_SCOPES,
    NVLINK_ERROR_FIELDS,
    NVLINK_ERROR_KINDS,
    RETIREMENT_CAUSES,
    TEMPERATURE_THRESHOLDS,
)
from gpulens.exporter.collectors import health, pcie_nvlink, power_thermal
from gpulens.exporter.snapshot import (
    EccError,
    EccScope,
    NvLinkErrorKind,
    RemappedRowKind,
    RetiredPageCause,
    TemperatureThreshold,
)

READ_BY_THE_BACKEND = [
    (EccError, ECC_COUNTERS),
    (EccScope, ECC_SCOPES),
    (RetiredPageCause, RETIREMENT_CAUSES),
    (NvLinkErrorKind, NVLINK_ERROR_KINDS),
    (TemperatureThreshold, TEMPERATURE_THRESHOLDS),
]
DOCUMENTED_IN = [
    (EccError, health.ECC.label_doc),
    (EccScope, health.ECC.label_doc),
    (RemappedRowKind, health.REMAPPED.label_doc),
    (RetiredPageCause, health.RETIRED.label_doc),
    (NvLinkErrorKind, pcie_nvlink.NV_ERR.label_doc),
    (TemperatureThreshold, power_thermal.THRESHOLDS.label_doc),
]


@pytest.mark.parametrize(
    ("vocabulary", "table"), READ_BY_THE_BACKEND, ids=lambda v: getattr(v, "__name__", "")
)
def test_the_backend_reads_every_value_of_the_vocabulary_once(
    vocabulary: type[StrEnum], table: tuple[tuple[StrEnum, int], ...]
) -> None:
    assert [value for value, _ in table] == list(vocabulary)


@pytest.mark.parametrize(("vocabulary", "doc"), DOCUMENTED_IN, ids=lambda v: getattr(v, "__name__", ""))
def test_the_family_documents_every_value_of_its_label(vocabulary: type[StrEnum], doc: str) -> None:
    assert all(f"`{value}`" in doc for value in vocabulary)


def test_every_nvlink_error_kind_has_its_per_link_field_on_links_0_to_11() -> None:
    assert {(kind, link) for kind in NvLinkErrorKind for link in range(12)} <= NVLINK_ERROR_FIELDS.keys()
