"""What works without root (docs/security.md): the real daemon run as `nobody`.

The process's /proc entry is readable except its `environ` (mode 0400, owned by root), as on a
node where the exporter is not root. Attribution must still name the Slurm job from the cgroup
path, say once why environment reads fail, and keep serving.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.reliability.expo import series, value
from tests.support.procs import free_port

PID, JOB, GPU = 213101, "5110", "3"  # dgx-h100: an exclusive Slurm job on GPU 3
NOBODY = 65534


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop to nobody")
def test_the_exporter_as_nobody_attributes_by_cgroup_and_says_once_why_environ_fails() -> None:
    root = Path(tempfile.mkdtemp(prefix="gpulens-nobody-"))
    try:
        root.chmod(0o755)
        proc_dir = root / "proc" / str(PID)
        proc_dir.mkdir(parents=True)
        (root / "proc").chmod(0o755)
        proc_dir.chmod(0o555)
        (proc_dir / "cgroup").write_text(f"0::/system.slice/slurmstepd.scope/job_{JOB}/step_0/user/task_0\n")
        (proc_dir / "status").write_text("Name:\tpython\nUid:\t1001\t1001\t1001\t1001\n")
        (proc_dir / "environ").write_bytes(b"SLURM_JOB_ID=7777123\0SLURM_JOB_USER=root\0")
        (proc_dir / "environ").chmod(0o400)
        for name in ("cgroup", "status"):
            (proc_dir / name).chmod(0o444)
        port = free_port()
        log_path = root / "exporter.log"
        cmd = [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            sys.executable,
            "-m",
            "gpulens.exporter.cli",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--simulate",
            "dgx-h100",
            "--interval",
            "0.5",
            "--path.procfs",
            str(root / "proc"),
            "--no-attribution.mapping",
            "--pod-resources-socket",
            str(root / "no-kubelet.sock"),
        ]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root, env={**os.environ, "HOME": str(root)}
            )
            try:
                body = b""
                deadline = time.monotonic() + 40
                while time.monotonic() < deadline:
                    assert proc.poll() is None, log_path.read_text()
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                            body = r.read()
                    except (urllib.error.URLError, OSError):
                        body = b""
                    if any(lab.get("job_id") == JOB for lab, _ in series(body, "gpu_job_info")):
                        break
                    time.sleep(0.2)
                time.sleep(1.5)  # a few more samples: the environ failure must not be logged again
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read()
            finally:
                proc.terminate()
                proc.wait(timeout=10)
        jobs = {lab["job_id"]: lab for lab, _ in series(body, "gpu_job_info") if lab["gpu"] == GPU}
        assert JOB in jobs, (jobs, log_path.read_text()[-2000:])  # from the cgroup, not the environment
        assert jobs[JOB]["job_source"] == "slurm"
        assert b'job_id="7777123"' not in body
        assert value(body, "gpulens_collector_success", collector="jobs") == 1
        assert value(body, "gpu_up", gpu=GPU) == 1
        denied = [line for line in log_path.read_text().splitlines() if "permission denied" in line]
        assert len(denied) == 1 and "environ" in denied[0], denied
    finally:
        shutil.rmtree(root, ignore_errors=True)
