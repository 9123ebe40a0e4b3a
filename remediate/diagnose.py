"""The diagnostic that gates a GPU's return, as it runs on the node (`gpulens remediate diag`).

The receiver starts it in a Job pinned to the node (kubernetes.py, `diagnostic_job`), after the
recovery and the hold-down. It runs DCGM's own diagnostic, `dcgmi diag -r <level> -j`, where
`dcgmi` is on the PATH (an image built on NVIDIA's DCGM image), and reads its JSON; where DCGM is
absent it checks the GPU through NVML instead: retired pages pending, a row remap pending or
failed, volatile double-bit ECC errors, and hardware slowdown clock-event reasons (what the
exporter's backend reads for the same alerts). Either way the verdict is one JSON line
(`Verdict.to_json`) on stdout and in the container's termination message (`/dev/termination-log`,
which the API serves in the pod's status), and the exit status: 0 passed, 1 failed, 2 error (the
check itself could not run). The receiver reads the verdict back (`Verdict.from_message`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

TERMINATION_LOG = Path("/dev/termination-log")
MAX_MESSAGE = 4096  # the API keeps at most 4096 bytes of a termination message
LEVELS = (1, 2, 3, 4)
# dcgmi diag -r 4 runs for about an hour and a half; the Job's deadline bounds it anyway
DCGMI_TIMEOUT_S = {1: 300, 2: 900, 3: 3600, 4: 7200}


class Result(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"  # the check could not run or its answer could not be read

    @property
    def exit_status(self) -> int:
        return {Result.PASSED: 0, Result.FAILED: 1, Result.ERROR: 2}[self]


@dataclass(frozen=True)
class Verdict:
    result: Result
    check: str  # what ran: "dcgmi diag -r 2" or "nvml"
    detail: str = ""

    def to_json(self) -> str:
        doc = {"result": self.result.value, "check": self.check, "detail": self.detail[:1000]}
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_message(cls, text: str) -> Verdict | None:
        """The verdict a diagnostic container left as its termination message; None if it is not one."""
        try:
            doc = json.loads(text) if len(text) <= MAX_MESSAGE else None
            if not isinstance(doc, dict):
                return None
            result = Result(doc["result"])
        except (ValueError, KeyError, TypeError, RecursionError):
            return None
        check, detail = doc.get("check"), doc.get("detail")
        if not isinstance(check, str) or not isinstance(detail, str):
            return None
        return cls(result, check[:100], detail[:1000])


# ---- DCGM ----------------------------------------------------------------------------------------


def dcgmi_command(dcgmi: str, level: int, gpu: str) -> list[str]:
    """`dcgmi diag -r <level> -j`, for one GPU (its DCGM id, the NVML index) or all (`gpu` empty)."""
    return [dcgmi, "diag", "-r", str(level), "-j", *(["-i", gpu] if gpu else [])]


def read_dcgmi(doc: Any, check: str) -> Verdict:
    """The verdict of `dcgmi diag -j`'s answer: failed when any test failed on any GPU it ran on
    (naming the tests and their first warning), passed when every result passed, was skipped or
    only warned; error when the answer is not that JSON."""
    body = None
    if isinstance(doc, dict):
        body = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic")
    categories = body.get("test_categories") if isinstance(body, dict) else None
    if not isinstance(categories, list):
        return Verdict(Result.ERROR, check, "the answer has no 'DCGM GPU Diagnostic'.test_categories list")
    failures: list[str] = []
    ran = 0
    for category in categories:
        tests = category.get("tests") if isinstance(category, dict) else None
        for test in tests if isinstance(tests, list) else []:
            if not isinstance(test, dict):
                continue
            for entry in test.get("results") or []:
                if not isinstance(entry, dict):
                    continue
                ran += 1
                if str(entry.get("status", "")).lower() != "fail":
                    continue
                gpu = entry.get("gpu_id", entry.get("entity_id", "?"))
                warnings = entry.get("warnings") or []
                first = warnings[0] if isinstance(warnings, list) and warnings else {}
                why = first.get("warning", "") if isinstance(first, dict) else str(first)
                failures.append(
                    f"{test.get('name', '?')} on GPU {gpu}" + (f": {str(why)[:200]}" if why else "")
                )
    if failures:
        return Verdict(Result.FAILED, check, "; ".join(failures))
    if ran == 0:
        return Verdict(Result.ERROR, check, "the answer holds no test result")
    return Verdict(Result.PASSED, check, f"{ran} test result(s), none failed")


def run_dcgmi(dcgmi: str, level: int, gpu: str) -> Verdict:
    command = dcgmi_command(dcgmi, level, gpu)
    check = f"dcgmi diag -r {level}"
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=DCGMI_TIMEOUT_S[level], check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Verdict(Result.ERROR, check, f"{' '.join(command)}: {exc}")
    try:  # dcgmi exits non-zero when a test fails: the JSON says what failed
        doc = json.loads(done.stdout)
    except ValueError:
        first = (done.stderr or done.stdout).strip().splitlines()
        why = first[0][:200] if first else f"exit status {done.returncode}"
        return Verdict(Result.ERROR, check, f"{' '.join(command)}: no JSON answer ({why})")
    return read_dcgmi(doc, check)


# ---- NVML ----------------------------------------------------------------------------------------

# nvmlClocksEventReason* bits that mean the hardware itself slows the GPU (not idle or the app)
HW_SLOWDOWN = 0x8  # HW slowdown (thermal or power brake)
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80


def check_nvml(nvml: Any, uuid: str, index: str) -> Verdict:
    """NVML's view of one GPU (`uuid`, else `index`; every GPU when both are empty): failed on
    pending retired pages, a pending or failed row remap, volatile double-bit ECC errors or a
    hardware slowdown; error when NVML cannot be read. A read the GPU does not support is skipped."""
    check = "nvml"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return Verdict(Result.ERROR, check, f"nvmlInit: {exc}")
    try:
        if uuid:
            handles = [(uuid, nvml.nvmlDeviceGetHandleByUUID(uuid))]
        elif index:
            handles = [(index, nvml.nvmlDeviceGetHandleByIndex(int(index)))]
        else:
            handles = [(str(i), nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
        problems: list[str] = []
        for name, handle in handles:
            problems += [f"GPU {name}: {p}" for p in _gpu_problems(nvml, handle)]
    except nvml.NVMLError as exc:
        return Verdict(Result.ERROR, check, f"NVML: {exc}")
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    if problems:
        return Verdict(Result.FAILED, check, "; ".join(problems))
    return Verdict(
        Result.PASSED, check, "no pending retired pages or row remap, no volatile DBE, no HW slowdown"
    )


def _supported(nvml: Any, call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3):
            return None
        raise


def _gpu_problems(nvml: Any, handle: Any) -> list[str]:
    problems: list[str] = []
    pending = _supported(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    if pending:
        problems.append("retired pages pending")
    remap = _supported(nvml, nvml.nvmlDeviceGetRemappedRows, handle)
    if remap is not None:
        _corr, _unc, is_pending, failed = remap
        if is_pending:
            problems.append("row remap pending")
        if failed:
            problems.append("row remap failed")
    dbe = _supported(
        nvml,
        nvml.nvmlDeviceGetTotalEccErrors,
        handle,
        nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        nvml.NVML_VOLATILE_ECC,
    )
    if dbe:
        problems.append(f"{dbe} volatile double-bit ECC error(s)")
    reasons = _supported(nvml, nvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
    if reasons and reasons & (HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE):
        problems.append(f"hardware slowdown (clock event reasons 0x{reasons:x})")
    return problems


# ---- on the node -----------------------------------------------------------------------------------


def diagnose(level: int, gpu: str, uuid: str, dcgmi: str = "dcgmi", nvml: Any = None) -> Verdict:
    """DCGM's diagnostic where `dcgmi` is found, else the NVML check."""
    found = shutil.which(dcgmi)
    if found:
        return run_dcgmi(found, level, gpu)
    if nvml is not None:
        return check_nvml(nvml, uuid, gpu)
    try:
        import pynvml  # nvidia-ml-py: what the exporter reads NVML with
    except ImportError:
        return Verdict(Result.ERROR, "nvml", "neither dcgmi nor the NVML bindings (nvidia-ml-py) found")
    return check_nvml(pynvml, uuid, gpu)


def main(level: int, gpu: str, uuid: str, dcgmi: str, termination_log: Path = TERMINATION_LOG) -> int:
    """Run the diagnostic, print the verdict and leave it as the termination message."""
    verdict = diagnose(level, gpu, uuid, dcgmi)
    line = verdict.to_json()
    print(line, flush=True)
    with contextlib.suppress(OSError):  # outside a container: stdout and the exit status say it
        termination_log.write_text(line[:MAX_MESSAGE])
    return verdict.result.exit_status
