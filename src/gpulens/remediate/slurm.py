"""Slurm backend: drain the node with `scontrol update ... State=DRAIN Reason="gpulens: ..."`.

DRAIN lets running jobs finish and starts no new ones. Slurm has no per-GPU drain, so both kinds
drain the node; the reason names the GPU. The `gpulens:` prefix marks drains gpulens made (the
LBNL NHC convention). A node that is already draining or drained is left as it is, so a person's
own drain reason is never overwritten and repeated faults do not rewrite ours.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass

from gpulens.remediate.model import IsolationRequest, Outcome

_STATE = re.compile(r"\bState=(\S+)")
_REASON = re.compile(r"\bReason=(.*?)(?:\s+\[[^\]]*\])?\s*$", re.M)


class ScontrolError(Exception):
    """scontrol failed; the message is one line."""


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

    def _run(self, command: list[str]) -> str:
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except FileNotFoundError:
            raise ScontrolError(f"{self.scontrol}: not found") from None
        except subprocess.TimeoutExpired:
            raise ScontrolError(f"{shlex.join(command)}: no answer in {self.timeout_s:g}s") from None
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip().splitlines()
            first = message[0] if message else f"exit status {done.returncode}"
            raise ScontrolError(f"{shlex.join(command)}: {first}")
        return done.stdout

    def isolate(self, request: IsolationRequest, now: float) -> Outcome:
        try:
            shown = self._run([self.scontrol, "show", "node", request.node, "--oneliner"])
            state = _STATE.search(shown)
            flags = set(re.split(r"[+*]", state.group(1).upper())) if state else set()
            if flags & {"DRAIN", "DRAINING", "DRAINED"}:
                reason = _REASON.search(shown)
                text = reason.group(1).strip() if reason else ""
                owner = "by gpulens" if text.startswith("gpulens:") else "by someone else"
                return Outcome("already", f"node {request.node} already drained {owner} (Reason={text})")
            command = self.command(request)
            self._run(command)
            return Outcome("applied", shlex.join(command))
        except ScontrolError as exc:
            return Outcome("failed", str(exc))
