"""The return diagnostic on Slurm: its commands and how their answers read (slurm.py runs them).

A drained or DOWN node starts no job, the diagnostic's included, so the node is handed to a
maintenance reservation of its own first: `scontrol create reservation ReservationName=
gpulens-diag-<node> StartTime=now Duration=UNLIMITED Nodes=<node> Users=<the receiver's user>
Flags=MAINT,IGNORE_JOBS`, then `State=RESUME`. While a reservation holds a node, only jobs
submitted into it run there (slurm.schedmd.com/reservations.html: "jobs using that reservation can
use only those resources ... and no other jobs can use those resources"), so the resumed node takes
the diagnostic job and nothing else. UNLIMITED because a receiver that dies mid-diagnostic must
leave the node held, not returned when a duration runs out; the receiver deletes the reservation
itself once the verdict is in, after draining the node again.

The job is `sbatch --parsable --reservation=<it> --nodelist=<node> --exclusive --gres=gpu:<all>
--wrap='gpulens remediate diag ...'`: the whole node with every GPU (cgroup device confinement
would otherwise hide the GPU under test), its verdict the exit status (0 passed, 1 failed, 2 error,
diagnose.Result), read back with `scontrol show job <id>`; the verdict line itself is in the job's
StdOut on the node.
"""

from __future__ import annotations

import re
import shlex

from gpulens.remediate.diagnose import DCGMI_TIMEOUT_S, Result, Verdict
from gpulens.remediate.episodes import Episode

RESERVATION_PREFIX = "gpulens-diag-"
_GRES_GPU = re.compile(r"^gpu(?::[^:(]+)?:(\d+)")
_JOB_STATE = re.compile(r"\bJobState=(\S+)")
_EXIT_CODE = re.compile(r"\bExitCode=(\d+):(\d+)")
_JOB_REASON = re.compile(r"\bReason=(\S+)")
_STDOUT = re.compile(r"\bStdOut=(\S+)")
_RES_NODES = re.compile(r"\bNodes=(\S+)")
_RES_USERS = re.compile(r"\bUsers=(\S+)")
# job states that are not over yet (squeue's and scontrol's names)
UNFINISHED = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STOPPED"}
)


def reservation_name(node: str) -> str:
    """One reservation per node: a second episode's diagnostic waits for the first's to end."""
    return RESERVATION_PREFIX + node


def create_reservation(scontrol: str, node: str, user: str) -> list[str]:
    return [
        scontrol,
        "create",
        "reservation",
        f"ReservationName={reservation_name(node)}",
        "StartTime=now",
        "Duration=UNLIMITED",
        f"Nodes={node}",
        f"Users={user}",
        # MAINT: accounted as maintenance, and allowed on nodes another reservation holds;
        # IGNORE_JOBS: created although jobs may still run on a drained (not yet idle) node
        "Flags=MAINT,IGNORE_JOBS",
    ]


def delete_reservation(scontrol: str, node: str) -> list[str]:
    return [scontrol, "delete", f"ReservationName={reservation_name(node)}"]


def show_reservation(scontrol: str, node: str) -> list[str]:
    return [scontrol, "show", "reservation", reservation_name(node), "--oneliner"]


def holds(shown: str, node: str, user: str) -> bool:
    """Whether `scontrol show reservation` says it holds exactly `node` for `user`."""
    nodes, users = _RES_NODES.search(shown), _RES_USERS.search(shown)
    return bool(nodes and users and nodes.group(1) == node and user in users.group(1).split(","))


def gpu_count(shown_node: str) -> int:
    """The node's GPUs from its `Gres=gpu[:type]:N[(S:..)],...` (0 when it names none)."""
    match = re.search(r"\bGres=(\S+)", shown_node)
    items = match.group(1).split(",") if match else []
    return sum(int(m.group(1)) for item in items if (m := _GRES_GPU.match(item)))


def diag_command(episode: Episode, level: int) -> list[str]:
    """What the job runs: the same command as the Kubernetes diagnostic Job."""
    command = ["gpulens", "remediate", "diag", "--level", str(level)]
    if episode.gpu:
        command += ["--gpu", episode.gpu]
    if episode.uuid:
        command += ["--uuid", episode.uuid]
    return command


def sbatch_command(sbatch: str, episode: Episode, level: int, gpus: int) -> list[str]:
    minutes = DCGMI_TIMEOUT_S[level] // 60 + 5
    return [
        sbatch,
        "--parsable",
        "--job-name=gpulens-diag",
        f"--reservation={reservation_name(episode.node)}",
        f"--nodelist={episode.node}",
        "--nodes=1",
        "--exclusive",
        *([f"--gres=gpu:{gpus}"] if gpus else []),
        f"--time={minutes}",
        f"--wrap={shlex.join(diag_command(episode, level))}",
    ]


def job_id(answer: str) -> str | None:
    """`sbatch --parsable` prints `<id>[;<cluster>]`."""
    first = answer.strip().splitlines()[0] if answer.strip() else ""
    found = first.split(";")[0]
    return found if re.fullmatch(r"[0-9]{1,12}", found) else None


def check_name(job: str) -> str:
    return f"gpulens remediate diag (Slurm job {job})"


def job_verdict(shown_job: str, job: str) -> Verdict | None:
    """The verdict of a finished diagnostic job from `scontrol show job`; None while it runs.
    Exit status 0 passed, 1 failed, 2 error; any other end (cancelled, timed out, node failure,
    killed by a signal) is an error."""
    check = check_name(job)
    state = _JOB_STATE.search(shown_job)
    if state is None:
        return Verdict(Result.ERROR, check, "scontrol show job printed no JobState")
    name = state.group(1).upper()
    if name in UNFINISHED:
        return None
    code = _EXIT_CODE.search(shown_job)
    status, signal = (int(code.group(1)), int(code.group(2))) if code else (-1, 0)
    out = _STDOUT.search(shown_job)
    where = f"; its verdict line is in {out.group(1)} on the node" if out else ""
    by_status = {0: Result.PASSED, 1: Result.FAILED, 2: Result.ERROR}
    if name in ("COMPLETED", "FAILED") and not signal and status in by_status:
        result = by_status[status]
        return Verdict(result, check, f"JobState={name} ExitCode={status}:0{where}")
    reason = _JOB_REASON.search(shown_job)
    why = f"JobState={name} ExitCode={status}:{signal}" + (f" Reason={reason.group(1)}" if reason else "")
    return Verdict(Result.ERROR, check, f"ended without a verdict ({why}){where}")
