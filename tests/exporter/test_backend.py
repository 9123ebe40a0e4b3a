"""The pynvml backend's error mapping: absent vs failed area vs lost GPU."""

from __future__ import annotations

import pynvml
import pytest

from gpulens.exporter.app import Exporter
from gpulens.exporter.backends.nvml import AreaError, GpuLostError, _call, _memory_fields
from tests.exporter.expo import value


def _raiser(code: int):
    def fn(*_args: object) -> None:
        raise pynvml.NVMLError(code)

    return fn


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_NO_PERMISSION,
    ],
)
def test_unsupported_values_are_absent(code: int) -> None:
    assert _call(_raiser(code)) is None


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED])
def test_lost_gpu_errors_raise_gpu_lost(code: int) -> None:
    with pytest.raises(GpuLostError):
        _call(_raiser(code))


def test_other_errors_fail_the_area() -> None:
    with pytest.raises(AreaError, match="Unknown"):
        _call(_raiser(pynvml.NVML_ERROR_UNKNOWN))


def test_library_mismatch_of_process_wrappers_is_absent() -> None:
    def mismatch() -> None:
        raise pynvml.NVMLLibraryMismatchError("struct version")

    assert _call(mismatch) is None


def test_memory_used_is_total_minus_free_minus_reserved() -> None:
    # (total, used, free, reserved)
    assert _memory_fields(total=100, free=30, reserved=10) == (100, 60, 30, 10)
    assert _memory_fields(total=100, free=30, reserved=None) == (100, 70, 30, None)


def test_a_failing_call_fails_only_its_collector(exporter: Exporter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", _raiser(pynvml.NVML_ERROR_UNKNOWN))
    text = exporter.render(exporter.sample_once()).text.decode()
    assert value(text, "gpulens_collector_success", collector="power_thermal") == 0
    assert value(text, "gpulens_collector_success", collector="memory") == 1
    assert value(text, "gpu_up", gpu="2") == 1
    assert value(text, "gpu_power_watts", gpu="2") is None
    assert value(text, "gpu_memory_total_bytes", gpu="2") is not None
