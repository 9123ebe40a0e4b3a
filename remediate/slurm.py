"""Slurm backend: drain the node with `scontrol update ... State=DRAIN Reason="gpulens: ..."`.

DRAIN lets running jobs finish and starts no new ones. Slurm has no per-GPU drain, so both kinds
drain the node; the reason names the GPU. The `gpulens:` prefix marks drains gpulens made (the
LBNL NHC convention). A node that is already draining or drained is left as it is, so a person's
own drain reason is never overwritten and repeated faults do not rewrite ours.

scontrol takes more than node names where a node name goes: `ALL`, host lists (`gpu[01-04]`,
`a,b`) and node-set names. The first two are refused by name; every action first reads the node
(`scontrol show node NAME --oneliner`) and goes ahead only when that names exactly one node called
NAME, so a node set (or a name Slurm does not know) is never acted on.

With `requeue` (`--slurm-requeue`) the reboot also requeues the jobs still running on the node
through Slurm's own mechanism: `squeue --nodelist=NODE --format=%A` lists them (one job id per
line, array elements each their own) and `scontrol requeue Incomplete <ids>` puts the batch jobs
back to pending (Slurm refuses non-batch and `--no-requeue` jobs; that is said in the record and
the reboot goes ahead: ASAP waits for those jobs to end).
"""

from __future__ import annotations

import getpass
import logging
import re
import shlex
import subprocess
from dataclasses import dataclass

from gpulens.httpclient import Deadline
from gpulens.remediate import slurmdiag
from gpulens.remediate.diagnose import Result, Verdict
from gpulens.remediate.episodes import Episode, Recovery
from gpulens.remediate.escape import printable
from gpulens.remediate.isolator import NodeFencesOnly
from gpulens.remediate.model import IsolationRequest, Outcome
from gpulens.remediate.recovery import Diagnosis, Progress, Recorded, Step

# A Slurm node name: a host name, no host-list syntax (brackets, commas) and no wildcards
_NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")
_RECORD_NAME = re.compile(r"^NodeName=(\S+)")
_BOOT = re.compile(r"\bBootTime=(\S+)")

_STATE = re.compile(r"\bState=(\S+)")
_JOB_ID = re.compile(r"[0-9]{1,12}")
MAX_REQUEUE = 4096  # jobs on one node: more is not a node's job list
# the job states `scontrol requeue Incomplete` acts on (its man page)
REQUEUE_STATES = "CONFIGURING,RUNNING,STOPPED,SUSPENDED"
_REASON = re.compile(r"\bReason=(.*?)(?:\s+\[[^\]]*\])?\s*$", re.M)
OUT_OF_SERVICE = frozenset({"DRAIN", "DRAINING", "DRAINED", "DOWN"})
REASON_PREFIX = "gpulens:"  # the start of every drain and reboot reason gpulens writes
log = logging.getLogger("gpulens.remediate")


class ScontrolError(Exception):
    """scontrol failed; the message is one line."""


@dataclass
class SlurmIsolator(NodeFencesOnly):
    scontrol: str = "scontrol"
    timeout_s: float = 30.0
    backend: str = "slurm"
    reboot_nextstate: str = "DOWN"
    requeue: bool = False
    squeue: str = "squeue"
    sbatch: str = "sbatch"
    diag_user: str = ""  # the reservation's user, who submits the diagnostic job (default: ours)

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

    def check_node(self, node: str) -> str | None:
        if node.upper() == "ALL":
            return f"node name {node!r} means every node to scontrol"
        if not _NODE_NAME.fullmatch(node):
            return f"node name {node!r} is not a single Slurm node name (no host lists or node sets)"
        return None

    def _run(self, command: list[str], deadline: Deadline) -> str:
        timeout = min(self.timeout_s, deadline.remaining())
        if timeout <= 0:
            raise ScontrolError(f"{shlex.join(command)}: not started, the action's deadline has passed")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except FileNotFoundError:
            raise ScontrolError(f"{self.scontrol}: not found") from None
        except subprocess.TimeoutExpired:
            raise ScontrolError(f"{shlex.join(command)}: no answer in {timeout:g}s") from None
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip().splitlines()
            first = message[0] if message else f"exit status {done.returncode}"
            raise ScontrolError(f"{shlex.join(command)}: {printable(first, 300)}")
        return done.stdout

    def show(self, node: str, deadline: Deadline) -> str:
        """The node's one-line record; ScontrolError unless it names exactly this one node."""
        shown = self._run([self.scontrol, "show", "node", node, "--oneliner"], deadline)
        names = [m.group(1) for line in shown.splitlines() if (m := _RECORD_NAME.match(line.strip()))]
        if names != [node]:
            raise ScontrolError(
                f"scontrol show node {node}: names {len(names)} nodes, not exactly node {node} "
                "(a node set or host list?): refused"
            )
        return shown

    def isolate(self, request: IsolationRequest, now: float, deadline: Deadline) -> Outcome:
        try:
            shown = self.show(request.node, deadline)
            state = _STATE.search(shown)
            flags = set(re.split(r"[+*]", state.group(1).upper())) if state else set()
            if flags & {"DRAIN", "DRAINING", "DRAINED"}:
                reason = _REASON.search(shown)
                text = reason.group(1).strip() if reason else ""
                owner = "by gpulens" if text.startswith("gpulens:") else "by someone else"
                return Outcome("already", f"node {request.node} already drained {owner} (Reason={text})")
            command = self.command(request)
            self._run(command, deadline)
            return Outcome("applied", shlex.join(command))
        except ScontrolError as exc:
            return Outcome("failed", str(exc))

    # ---- recovery and return (see recovery.Recoverer) ----------------------------------------------
    # Slurm has no per-GPU reset, so both the reset and the reboot class reboot the node, with
    # Slurm's own `scontrol reboot ASAP`: the node drains (running jobs finish), reboots when idle
    # and comes back in `nextstate`. DOWN (the default) keeps it out until gpulens returns it after
    # the hold-down; RESUME lets Slurm put it back right after the boot (clearing the DRAIN flag and
    # the reason), skipping the hold-down; and without nextstate ASAP means UNDRAIN, the same.

    def reboot_command(self, episode: Episode) -> list[str]:
        reason = f"gpulens: {printable(episode.alertname, 128)} {episode.recovery.value}"
        return [
            self.scontrol,
            "reboot",
            "ASAP",
            f"nextstate={self.reboot_nextstate}",
            f"reason={reason}",
            episode.node,
        ]

    def jobs_command(self, node: str) -> list[str]:
        return [
            self.squeue,
            "--noheader",
            f"--nodelist={node}",
            "--format=%A",
            f"--states={REQUEUE_STATES}",
        ]

    def requeue_command(self, jobs: list[str]) -> list[str]:
        return [self.scontrol, "requeue", "Incomplete", ",".join(jobs)]

    def describe_recovery(self, episode: Episode) -> str:
        reboot = shlex.join(self.reboot_command(episode))
        if not self.requeue:
            return reboot
        listing = shlex.join(self.jobs_command(episode.node))
        return f"{reboot}; then {self.scontrol} requeue Incomplete <the jobs of: {listing}>"

    def requeue_jobs(self, node: str, deadline: Deadline) -> str:
        """Requeue the node's running jobs; what happened, in one line (never raises)."""
        try:
            listed = self._run(self.jobs_command(node), deadline)
        except ScontrolError as exc:
            return f"requeue failed: {exc}"
        jobs = [line.strip() for line in listed.splitlines() if line.strip()]
        bad = next((j for j in jobs if not _JOB_ID.fullmatch(j)), None)
        if bad is not None:
            return f"requeue refused: {self.squeue} printed {printable(bad, 60)!r}, not a job id"
        if len(jobs) > MAX_REQUEUE:
            return f"requeue refused: {len(jobs)} jobs listed on node {node} (at most {MAX_REQUEUE})"
        if not jobs:
            return f"no job to requeue on node {node}"
        jobs = sorted(set(jobs), key=int)
        command = self.requeue_command(jobs)
        try:
            self._run(command, deadline)
        except ScontrolError as exc:
            return f"requeue failed: {exc}"
        return f"requeued {len(jobs)} job(s): {shlex.join(command)}"

    def can_start(self, episode: Episode, deadline: Deadline) -> Progress:
        return Progress(Step.DONE, "scontrol reboot ASAP waits for running jobs itself")

    def start_recovery(self, episode: Episode, deadline: Deadline) -> Progress:
        try:
            boot = _boot_time(self.show(episode.node, deadline))
            command = self.reboot_command(episode)
            self._run(command, deadline)
        except ScontrolError as exc:
            return Progress(Step.FAILED, str(exc))
        detail = shlex.join(command)
        if self.requeue:  # after the reboot request: the drain stays whatever the requeue does
            detail += "; " + self.requeue_jobs(episode.node, deadline)
        return Progress(Step.DONE, detail, marker=boot)

    def recovery_progress(self, episode: Episode, deadline: Deadline) -> Progress:
        try:
            shown = self.show(episode.node, deadline)
        except ScontrolError as exc:
            return Progress(Step.PENDING, str(exc))  # a rebooting node may not answer: ask again
        flags = _flags(shown)
        boot = _boot_time(shown)
        if boot != episode.marker and not flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"}:
            return Progress(Step.DONE, f"node {episode.node} rebooted (BootTime={boot})")
        return Progress(
            Step.PENDING, f"node {episode.node} not rebooted yet (State={'+'.join(sorted(flags))})"
        )

    isolation_mark = (
        f"a drain (or DOWN after its reboot) with a Reason starting {REASON_PREFIX!r}, or while its "
        f"diagnostic runs the reservation {slurmdiag.RESERVATION_PREFIX}<node>"
    )

    def isolation_in_place(self, node: str, deadline: Deadline) -> bool | None:
        """gpulens' isolation is a DRAIN (DOWN after `reboot ASAP nextstate=DOWN`) whose reason
        starts with `gpulens:`, or, for a node resumed to run its diagnostic, gpulens' reservation of
        it; a person's `State=RESUME` clears the drain (deleting the reservation ends the other),
        their own drain has their reason."""
        try:
            shown = self.show(node, deadline)
            reason = _REASON.search(shown)
            text = reason.group(1).strip() if reason else ""
            if _flags(shown) & OUT_OF_SERVICE:
                return text.startswith(REASON_PREFIX)
            return self._reservation(node, deadline)
        except ScontrolError as exc:
            log.warning("node %s: its state cannot be read: %s", node, exc)
            return None

    def recovery_returns_node(self, episode: Episode) -> bool:
        # with nextstate=RESUME Slurm resumes the node (clearing the drain and its reason) at boot
        rebooted = episode.recovery in (Recovery.RESET_GPU, Recovery.REBOOT_NODE)
        done = episode.action_finished_at is not None
        return self.reboot_nextstate.upper() == "RESUME" and rebooted and done

    # ---- the return diagnostic (recovery.Recoverer; the commands in slurmdiag.py) --------------------
    # A drained node starts no job, so the node goes into a maintenance reservation of its own, is
    # resumed into it (only jobs in the reservation run there) and takes the diagnostic as a batch
    # job in it. Once the job is over the node is drained again (reason: passed, or RMA) and then
    # the reservation deleted, so it is never open to other jobs in between; the return resumes it.
    # Each step reads the node (and the reservation) first: a person's change stops it.

    def diagnostic_unavailable(self, episode: Episode) -> str:
        return ""

    def _user(self) -> str:
        return self.diag_user or getpass.getuser()

    def describe_diagnostic(self, episode: Episode, level: int) -> str:
        steps = [
            slurmdiag.create_reservation(self.scontrol, episode.node, self._user()),
            self.return_command(episode.node),
            slurmdiag.sbatch_command(self.sbatch, episode, level, 0),
        ]
        return (
            "; ".join(shlex.join(s) for s in steps)
            + " (with --gres=gpu:<the node's GPUs>); at its end State=DRAIN again and "
            + shlex.join(slurmdiag.delete_reservation(self.scontrol, episode.node))
        )

    def _reservation(self, node: str, deadline: Deadline) -> bool:
        """Whether gpulens' diagnostic reservation of `node` exists (ScontrolError if unknown)."""
        try:
            shown = self._run(slurmdiag.show_reservation(self.scontrol, node), deadline)
        except ScontrolError as exc:
            if "not found" in str(exc):
                return False
            raise
        if not slurmdiag.holds(shown, node, self._user()):
            raise ScontrolError(
                f"reservation {slurmdiag.reservation_name(node)} exists but does not hold node {node} "
                f"for {self._user()}: refused"
            )
        return True

    def _drain_and_release(self, episode: Episode, reason: str, deadline: Deadline) -> str:
        """Drain the node again (reason `gpulens: ...`), then delete the reservation; what was done."""
        node = episode.node
        self._run([self.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], deadline)
        try:
            self._run(slurmdiag.delete_reservation(self.scontrol, node), deadline)
        except ScontrolError as exc:  # the return deletes it too: the drain is what holds the node
            return f"drained again ({reason}); the reservation stays for the return to delete: {exc}"
        return f"drained again ({reason}), reservation {slurmdiag.reservation_name(node)} deleted"

    def start_diagnostic(self, episode: Episode, level: int, deadline: Deadline) -> Progress:
        node = episode.node
        name = slurmdiag.reservation_name(node)
        try:
            shown = self.show(node, deadline)
            reserved = self._reservation(node, deadline)
            if not _flags(shown) & OUT_OF_SERVICE and not reserved:
                return Progress(Step.PENDING, f"node {node} is no longer held by gpulens: nothing started")
            if not _flags(shown) & OUT_OF_SERVICE:
                # in service inside our reservation: another episode's diagnostic, or ours whose
                # answer a crash lost; a job still queued there is waited for
                queued = self._run(
                    [self.squeue, "--noheader", f"--reservation={name}", "--format=%A"], deadline
                )
                if queued.strip():
                    return Progress(Step.PENDING, f"waiting: a diagnostic job runs on node {node} ({name})")
            else:
                if not reserved:
                    self._run(slurmdiag.create_reservation(self.scontrol, node, self._user()), deadline)
                if not self.isolation_in_place(node, deadline):  # a person's step in between
                    self._run(slurmdiag.delete_reservation(self.scontrol, node), deadline)
                    return Progress(Step.PENDING, f"node {node} changed: reservation {name} deleted again")
                self._run(self.return_command(node), deadline)
            gpus = slurmdiag.gpu_count(shown)
            command = slurmdiag.sbatch_command(self.sbatch, episode, level, gpus)
        except ScontrolError as exc:
            return Progress(Step.FAILED, str(exc))
        try:
            job = slurmdiag.job_id(self._run(command, deadline))
            if job is None:
                raise ScontrolError(f"{self.sbatch} printed no job id")
        except ScontrolError as exc:  # resumed but no job: hold the node out again first
            why = f"the diagnostic job could not be submitted: {exc}"
            reason = f"{REASON_PREFIX} {printable(episode.alertname, 128)} RMA: diagnostic not started"
            try:
                return Progress(Step.FAILED, f"{why}; {self._drain_and_release(episode, reason, deadline)}")
            except ScontrolError as again:
                return Progress(Step.FAILED, f"{why}; draining node {node} again failed too: {again}")
        return Progress(Step.DONE, f"Slurm job {job} in reservation {name}: {shlex.join(command)}", job)

    def diagnostic_progress(self, episode: Episode, deadline: Deadline) -> Diagnosis:
        job = episode.marker
        try:
            shown = self._run([self.scontrol, "show", "job", job, "--oneliner"], deadline)
            verdict = slurmdiag.job_verdict(shown, job)
        except ScontrolError as exc:
            if "Invalid job id" not in str(exc):
                return Diagnosis(Step.PENDING, detail=str(exc))
            # gone from slurmctld (MinJobAge passed while the receiver could not ask): no verdict
            verdict = Verdict(
                Result.ERROR, slurmdiag.check_name(job), f"Slurm job {job} is gone (no verdict)"
            )
        if verdict is None:
            return Diagnosis(Step.PENDING, detail=f"Slurm job {job} on node {episode.node} not finished")
        alert = printable(episode.alertname, 128)
        passed = verdict.result is Result.PASSED
        reason = f"{REASON_PREFIX} {alert} " + (
            "diagnostic passed" if passed else f"RMA: diagnostic {verdict.result.value}"
        )
        try:
            done = self._drain_and_release(episode, reason, deadline)
        except ScontrolError as exc:  # the node must be held before the verdict counts: next pass
            return Diagnosis(Step.PENDING, detail=f"verdict {verdict.result.value}, but drain failed: {exc}")
        return Diagnosis(Step.DONE, verdict, detail=done)

    def return_command(self, node: str) -> list[str]:
        return [self.scontrol, "update", f"NodeName={node}", "State=RESUME"]

    def describe_return(self, node: str) -> str:
        return shlex.join(self.return_command(node))

    def return_node(self, node: str, deadline: Deadline) -> Outcome:
        try:
            shown = self.show(node, deadline)
            flags = _flags(shown)
            reason = _REASON.search(shown)
            text = reason.group(1).strip() if reason else ""
            released = ""
            if self._reservation(node, deadline):  # left by a diagnostic (or `return --force` during one)
                command = slurmdiag.delete_reservation(self.scontrol, node)
                self._run(command, deadline)
                released = shlex.join(command)
            if not flags & {"DRAIN", "DRAINING", "DRAINED", "DOWN"}:
                if released:
                    return Outcome("applied", released)
                return Outcome("already", f"node {node} is in service already")
            if not text.startswith("gpulens:"):
                return Outcome(
                    "failed", f"node {node} is out of service by someone else (Reason={text}): left alone"
                )
            command = self.return_command(node)
            self._run(command, deadline)
            return Outcome("applied", "; ".join(filter(None, [released, shlex.join(command)])))
        except ScontrolError as exc:
            return Outcome("failed", str(exc))

    def record(self, episode: Episode, deadline: Deadline) -> None:
        return None  # the drain and reboot reasons name gpulens; the audit log keeps the rest

    def recorded(self, deadline: Deadline) -> Recorded:
        # Slurm keeps a node's state and reason, not an episode: the audit log is the only record
        return Recorded([], {})


def _flags(shown: str) -> set[str]:
    state = _STATE.search(shown)
    return set(re.split(r"[+*]", state.group(1).upper())) if state else set()


def _boot_time(shown: str) -> str:
    match = _BOOT.search(shown)
    return match.group(1) if match else ""
