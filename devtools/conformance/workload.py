"""A small CUDA workload so that processes, memory and activity exist while the probes run.

Runs the device image's PyTorch in a child process (never in ours: our process must not hold a
CUDA context, or it would show up as the only process). Without PyTorch it reports why and the
run goes on; process-list shapes are then only compared where the simulator has processes.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

_SCRIPT = """
import sys, time, torch
if not torch.cuda.is_available():
    print("no CUDA device visible to torch", flush=True); sys.exit(3)
x = torch.randn(4096, 4096, device="cuda")
hold = torch.empty(int(2 * 1024**3) // 4, device="cuda")  # ~2 GiB resident
print("ready", flush=True)
deadline = time.time() + float(sys.argv[1])
while time.time() < deadline:
    y = x @ x
    torch.cuda.synchronize()
"""


@contextlib.contextmanager
def cuda_workload(seconds: float) -> Iterator[str]:
    """Run the workload for at most `seconds`; yields a one-line status for the record."""
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SCRIPT, str(seconds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except OSError as exc:
        yield f"workload not started: {exc}"
        return
    status = "workload did not report ready within 60 s"
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            status = f"workload exited early (code {proc.wait()})"
            break
        if line.strip() == "ready":
            status = f"workload running (pid {proc.pid})"
            time.sleep(2.0)  # let process utilization samples accumulate
            break
        status = f"workload: {line.strip()[:200]}"
    try:
        yield status
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
