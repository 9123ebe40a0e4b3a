"""Real Slurm reads a gres.conf: `slurmd -G` (Debian's slurmd) prints the GRES it configured.

slurmd stats every `File=` and insists on character devices, so it runs in a private mount
namespace (`unshare -m`, root) with a tmpfs over /dev holding `/dev/nvidiaN` nodes (major 195,
as the NVIDIA driver creates them): nothing on the machine's /dev changes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

_GRES = re.compile(
    r"Gres Name=(?P<name>\S+) Type=(?P<type>\S+) Count=(?P<count>\d+) Index=(?P<index>\d+)"
    r".*File=(?P<file>\S+)"
)


def require_slurmd() -> str:
    slurmd = shutil.which("slurmd") or ("/usr/sbin/slurmd" if Path("/usr/sbin/slurmd").exists() else None)
    if slurmd is None:
        pytest.skip("slurmd not installed (make system-deps installs it from Debian)")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("slurmd -G needs root and unshare for a private /dev")
    return slurmd


def slurmd_gres(tmp: Path, gres_conf: str, node_lines: str, host: str, gpus: int) -> list[dict[str, str]]:
    """What slurmd configures for `host` from these files: one dict per GRES line it prints."""
    slurmd = require_slurmd()
    node = next(line for line in node_lines.splitlines() if line.startswith(f"NodeName={host} "))
    (tmp / "slurm.conf").write_text(
        "ClusterName=gpulens-test\nSlurmctldHost=localhost\nGresTypes=gpu,mps,shard\n"
        "SelectType=select/cons_tres\n"
        f"{node} CPUs=4 State=UNKNOWN\nPartitionName=test Nodes={host} Default=YES\n"
    )
    (tmp / "gres.conf").write_text(gres_conf)
    devices = " && ".join(f"mknod /dev/nvidia{i} c 195 {i}" for i in range(gpus))
    script = f"mount -t tmpfs none /dev && {devices} && exec {slurmd} -G -N {host}"
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        env={**os.environ, "SLURM_CONF": str(tmp / "slurm.conf")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    if "fatal" in output or done.returncode != 0:
        raise AssertionError(f"slurmd -G rejected the files (rc {done.returncode}):\n{output}")
    errors = [line for line in output.splitlines() if "error:" in line]
    if errors:
        raise AssertionError("slurmd -G reported errors:\n" + "\n".join(errors))
    return [m.groupdict() for m in map(_GRES.search, output.splitlines()) if m]
