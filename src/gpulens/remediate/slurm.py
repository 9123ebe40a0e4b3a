"""Slurm backend: drain the node with `scontrol update ... State=DRAIN Reason="gpulens: ..."`.

DRAIN lets running jobs finish and starts no new ones. Slurm has no per-GPU drain, so both kinds
drain the node; the reason names the GPU. The `gpulens:` prefix marks drains gpulens made (the
LBNL NHC convention), so a person (or a later tool) knows which reasons are ours.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass

from gpulens.remediate.model import IsolationRequest, Outcome


@dataclass
class SlurmIsolator:
    scontrol: str = "scontrol"
    timeout_s: float = 30.0
    backend: str = "slurm"

    def command(self, request: IsolationRequest) -> list[str]:
        return [
            self.scontrol,
            "update",
            f"NodeName={request.node}",
            "State=DRAIN",
            f"Reason={request.reason}",
        ]

    def describe(self, request: IsolationRequest, now: float) -> str:
        return shlex.join(self.command(request))

    def isolate(self, request: IsolationRequest, now: float) -> Outcome:
        command = self.command(request)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except FileNotFoundError:
            return Outcome("failed", f"{self.scontrol}: not found")
        except subprocess.TimeoutExpired:
            return Outcome("failed", f"{shlex.join(command)}: no answer in {self.timeout_s:g}s")
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip().splitlines()
            first = message[0] if message else f"exit status {done.returncode}"
            return Outcome("failed", f"{shlex.join(command)}: {first}")
        return Outcome("applied", shlex.join(command))
