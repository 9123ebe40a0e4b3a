"""A stand-in for Slurm's `scontrol` and `squeue`, driven by a JSON state file:
`fake_scontrol.py STATE ARGS...` (scontrol) and `fake_scontrol.py STATE --squeue ARGS...` (squeue).

It answers the commands gpulens runs the way Slurm does at its command-line interface:

- `show node NAME --oneliner`: one `NodeName=...` line per node NAME expands to (a node set in
  `sets` expands to several); `Node NAME not found` and exit status 1 for a name it does not know.
- `update NodeName=NAME State=DRAIN Reason=...` / `State=RESUME`: exit status `update_exit`
  (with Slurm's message when not 0); with `stateful` the node's state and reason change.
- `reboot ASAP nextstate=DOWN|RESUME reason=... NAME`: with `stateful` the reboot happens at once
  (a new BootTime, the state after it as `nextstate` says) unless `reboot` is `"pending"`.
- `requeue [Incomplete] ID[,ID...]`: each ID must be a job of `jobs` (node -> job ids) not in
  `no_requeue` (a non-batch or --no-requeue job), else Slurm's error for it and exit status 1;
  the requeued jobs leave their node and are appended to `requeued`.
- squeue `--noheader --nodelist=NAME --format=%A [--states=...]`: the node's `jobs`, one id a line
  (the only format gpulens asks for; others are refused as unsupported here); `--reservation=RES`
  instead of `--nodelist`: the pending and running batch jobs submitted into that reservation.
- Reservations (slurm.schedmd.com/reservations.html): `create reservation ReservationName=R
  StartTime=now Duration=... Nodes=NAME Users=U Flags=...` (refused when R exists or the node is
  unknown), `show reservation R --oneliner` (`Reservation R not found`, exit 1), `delete
  ReservationName=R`. While R exists its nodes take only jobs submitted into it.
- `sbatch --parsable --reservation=R --nodelist=NAME ... --wrap=CMD` (`sbatch STATE --sbatch ...`):
  refused as Slurm refuses it at submission (an unknown reservation, a caller not in its `Users`, a
  node outside it); otherwise queued (`submitted`, its id printed). On every call the queue is
  scheduled the way slurmctld would: a pending job starts only on a node that is not drained or down,
  and on a reserved node only inside that reservation (else it stays PENDING with Slurm's reason).
  A started job runs CMD here at once (`gpulens ...` as this Python's `-m gpulens.cli`, with the
  caller's environment, as `--export=ALL` does) and ends COMPLETED or FAILED with its exit status,
  unless `hold_jobs` keeps it RUNNING. The caller is `user` (default: this process's user).
- `show job ID --oneliner`: `JobId=... JobState=... Reason=... ExitCode=N:0 NodeList=...
  Reservation=...`; `Invalid job id specified` (exit 1) for an unknown one.
- `hang`: {node: release file}: once gpulens has drained that node (its Reason starts `gpulens:`),
  every call naming it waits, outside the lock so other nodes' calls go on, until the file exists
  (a node whose RPCs hang; the caller's timeout kills the wait). A waiting call appends "NODE PID"
  to `record + ".hanging"`, and every recorded call also goes to `record + ".during"` with the nodes
  that had a call hanging (still alive) at that moment: {"call": argv, "hanging": [nodes]}.

Every call's argv is appended (JSON) to the `record` file. The state file is rewritten in place.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _line(name: str, node: dict[str, Any]) -> str:
    line = (
        f"NodeName={name} Arch=x86_64 CPUTot=128 State={node.get('State', 'MIXED')} Gres=gpu:h100:8 "
        f"Partitions=gpu BootTime={node.get('BootTime', '2026-11-29T08:00:00')}"
    )
    if node.get("Reason"):
        line += f" Reason={node['Reason']} [root@2026-11-29T20:00:00]"
    return line


def _node(state: dict[str, Any], name: str) -> dict[str, Any] | None:
    nodes = state.setdefault("nodes", {})
    if name not in nodes and state.get("any_node", True):
        nodes[name] = dict(state.get("default", {"State": "MIXED"}))
    doc: dict[str, Any] | None = nodes.get(name)
    return doc


def _option(args: list[str], key: str) -> str | None:
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and name.lower() == key.lower():
            return value
    return None


def main(path: str, args: list[str]) -> int:
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path) as handle:
            state = json.load(handle)
    _hang(state, args)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel calls (one per node) see each other's changes
        if args[:1] == ["--squeue"]:
            return _squeue(path, args[1:])
        if args[:1] == ["--sbatch"]:
            return _sbatch(path, args[1:])
        return _run(path, args)


def _hang(state: dict[str, Any], args: list[str]) -> None:
    """A call naming a hung node (once gpulens drained it) waits until its release file exists,
    without holding the lock: every other node's calls go on meanwhile."""
    for node, release in state.get("hang", {}).items():
        named = {node, f"NodeName={node}", f"--nodelist={node}", f"Nodes={node}"}
        drained = state.get("nodes", {}).get(node, {}).get("Reason", "").startswith("gpulens:")
        if named & set(args) and drained:
            with open(state["record"] + ".hanging", "a") as handle:
                handle.write(f"{node} {os.getpid()}\n")
            while not Path(release).exists():
                time.sleep(0.05)


def _record(state: dict[str, Any], argv: list[str]) -> None:
    """Append the call to the record, and to the `.during` record with the nodes hanging now."""
    with open(state["record"], "a") as handle:
        handle.write(json.dumps(argv) + "\n")
    hanging = Path(state["record"] + ".hanging")
    lines = hanging.read_text().split("\n") if hanging.exists() else []
    live = sorted({n for n, pid in (line.split() for line in lines if line) if _alive(int(pid))})
    with open(state["record"] + ".during", "a") as handle:
        handle.write(json.dumps({"call": argv, "hanging": live}) + "\n")


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "\nState:\tZ" not in status.read_text()
    except OSError:
        return False


def _squeue(path: str, args: list[str]) -> int:
    with open(path) as handle:
        state = json.load(handle)
    _record(state, ["squeue", *args])
    node = _option(args, "--nodelist")
    reservation = _option(args, "--reservation")
    if "--noheader" not in args or _option(args, "--format") != "%A" or not (node or reservation):
        print(f"squeue: unsupported here: {' '.join(args)}", file=sys.stderr)
        return 1
    if reservation:
        for job_id, job in state.get("batch", {}).items():
            if job["Reservation"] == reservation and job["JobState"] in ("PENDING", "RUNNING"):
                print(job_id)
        return 0
    for job in state.get("jobs", {}).get(node, []):
        print(job)
    return 0


def _sbatch(path: str, args: list[str]) -> int:
    """Submission as slurmctld checks it; the job then waits for the scheduler (`_schedule`)."""
    with open(path) as handle:
        state = json.load(handle)
    _record(state, ["sbatch", *args])
    node = _option(args, "--nodelist") or ""
    name = _option(args, "--reservation") or ""
    wrap = _option(args, "--wrap")
    user = state.get("user") or getpass.getuser()
    reservations = state.setdefault("reservations", {})
    error = ""
    if wrap is None or "--parsable" not in args:
        error = f"unsupported here: {' '.join(args)}"
    elif _node(state, node) is None:
        error = "Invalid node name specified"
    elif name and name not in reservations:
        error = "Requested reservation is invalid"
    elif name and user not in reservations[name]["Users"].split(","):
        error = "Access denied to requested reservation"
    elif name and node not in reservations[name]["Nodes"].split(","):
        error = "Requested node configuration is not available"
    if error:
        print(f"sbatch: error: Batch job submission failed: {error}", file=sys.stderr)
        return 1
    batch = state.setdefault("batch", {})
    job_id = str(1000 + len(batch))
    batch[job_id] = {
        "JobState": "PENDING",
        "Reason": "None",
        "ExitCode": "0:0",
        "NodeList": node,
        "Reservation": name,
        "UserId": user,
        "wrap": wrap,
        "env": dict(os.environ),
    }
    _schedule(state, path)
    with open(path, "w") as handle:
        json.dump(state, handle)
    print(job_id)
    return 0


def _schedule(state: dict[str, Any], path: str) -> None:
    """One pass of slurmctld's scheduler over the pending batch jobs."""
    reservations = state.get("reservations", {})
    for job_id, job in state.get("batch", {}).items():
        if job["JobState"] == "RUNNING" and not state.get("hold_jobs"):
            _finish(job_id, job, path)
        if job["JobState"] != "PENDING":
            continue
        node = state.get("nodes", {}).get(job["NodeList"], {})
        flags = set(node.get("State", "MIXED").upper().replace("*", "+").split("+"))
        reserved = [r for r, res in reservations.items() if job["NodeList"] in res["Nodes"].split(",")]
        if flags & {"DRAIN", "DRAINED", "DRAINING", "DOWN"}:
            job["Reason"] = "ReqNodeNotAvail,_UnavailableNodes:" + job["NodeList"]
        elif reserved and job["Reservation"] not in reserved:
            job["Reason"] = "ReqNodeNotAvail,_Reserved_for_maintenance"
        else:
            job["JobState"], job["Reason"] = "RUNNING", "None"
            if not state.get("hold_jobs"):
                _finish(job_id, job, path)


def _finish(job_id: str, job: dict[str, Any], path: str) -> None:
    """Run the job's command on "its node" (here), as the batch script would."""
    command = shlex.split(job["wrap"])
    if command[:1] == ["gpulens"]:
        command = [sys.executable, "-m", "gpulens.cli", *command[1:]]
    out = Path(f"{path}.job-{job_id}.out")
    done = subprocess.run(command, capture_output=True, text=True, env=job["env"], timeout=120, check=False)
    out.write_text(done.stdout + done.stderr)
    job["JobState"] = "COMPLETED" if done.returncode == 0 else "FAILED"
    job["ExitCode"] = f"{done.returncode}:0"
    job["StdOut"] = str(out)


def _run(path: str, args: list[str]) -> int:
    with open(path) as handle:
        state = json.load(handle)
    _record(state, args)
    time.sleep(float(state.get("delay_s", 0)))
    _schedule(state, path)
    code = 0
    if args[:2] == ["show", "reservation"]:
        found = state.get("reservations", {}).get(args[2])
        if found is None:
            print(f"Reservation {args[2]} not found", file=sys.stderr)
            code = 1
        else:
            print(f"ReservationName={args[2]} " + " ".join(f"{k}={v}" for k, v in found.items()))
    elif args[:2] == ["create", "reservation"]:
        code = _create_reservation(state, args[2:])
    elif args[:1] == ["delete"]:
        name = _option(args, "ReservationName") or ""
        if state.get("reservations", {}).pop(name, None) is None:
            print("delete_reservation: Requested reservation is invalid", file=sys.stderr)
            code = 1
        _schedule(state, path)
    elif args[:2] == ["show", "job"]:
        job = state.get("batch", {}).get(args[2])
        if job is None:
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            code = 1
        else:
            shown = {k: v for k, v in job.items() if k not in ("wrap", "env")}
            print(f"JobId={args[2]} JobName=gpulens-diag " + " ".join(f"{k}={v}" for k, v in shown.items()))
    elif args[:2] == ["show", "node"]:
        name = args[2]
        members = state.get("sets", {}).get(name, [name])
        lines = [(m, _node(state, m)) for m in members]
        if any(node is None for _, node in lines):
            print(f"Node {name} not found", file=sys.stderr)
            code = 1
        else:
            print("\n".join(_line(m, node) for m, node in lines if node is not None))
    elif args[:1] == ["update"]:
        code = int(state.get("update_exit", 0))
        if code:
            print("slurm_update error: Invalid node name specified", file=sys.stderr)
        elif state.get("stateful"):
            node = _node(state, _option(args, "NodeName") or "")
            wanted = (_option(args, "State") or "").upper()
            if node is not None and wanted == "DRAIN":
                base = node.get("State", "MIXED").split("+")[0]
                node["State"], node["Reason"] = f"{base}+DRAIN", _option(args, "Reason") or ""
            elif node is not None and wanted == "RESUME":
                node["State"], node["Reason"] = "IDLE", ""
            _schedule(state, path)
    elif args[:1] == ["requeue"]:
        ids = args[-1].split(",")
        jobs = state.setdefault("jobs", {})
        known = {str(j) for node_jobs in jobs.values() for j in node_jobs}
        refused = [j for j in ids if j not in known or j in map(str, state.get("no_requeue", []))]
        for job in refused:
            print(f"Requeue of JobId={job} returned an error: Only batch jobs are accepted", file=sys.stderr)
        done = [j for j in ids if j not in refused]
        for name, node_jobs in jobs.items():
            jobs[name] = [j for j in node_jobs if str(j) not in done]
        state.setdefault("requeued", []).extend(done)
        code = 1 if refused else 0
    elif args[:1] == ["reboot"]:
        code = int(state.get("update_exit", 0))
        if code:
            print("scontrol_reboot_nodes error: Invalid node name specified", file=sys.stderr)
        elif state.get("stateful"):
            node = _node(state, args[-1])
            if node is not None:
                reason = _option(args, "reason") or ""
                if state.get("reboot") == "pending":
                    node["State"] = node.get("State", "MIXED").split("+")[0] + "+DRAIN+REBOOT_REQUESTED"
                    node["Reason"] = reason
                else:
                    state["boots"] = int(state.get("boots", 0)) + 1
                    node["BootTime"] = f"2026-12-01T{state['boots']:02d}:00:00"
                    if (_option(args, "nextstate") or "").upper() == "RESUME":
                        node["State"], node["Reason"] = "IDLE", ""
                    else:
                        node["State"], node["Reason"] = "DOWN", reason
    else:
        print(f"scontrol: unsupported here: {' '.join(args)}", file=sys.stderr)
        code = 1
    with open(path, "w") as handle:
        json.dump(state, handle)
    return code


def _create_reservation(state: dict[str, Any], args: list[str]) -> int:
    name = _option(args, "ReservationName") or ""
    nodes = _option(args, "Nodes") or ""
    reservations = state.setdefault("reservations", {})
    if name in reservations:
        print("Error creating the reservation: Duplicate reservation name", file=sys.stderr)
        return 1
    if any(_node(state, n) is None for n in nodes.split(",")):
        print("Error creating the reservation: Invalid node name specified", file=sys.stderr)
        return 1
    reservations[name] = {
        "StartTime": _option(args, "StartTime") or "now",
        "Duration": _option(args, "Duration") or "",
        "Nodes": nodes,
        "Users": _option(args, "Users") or "",
        "Flags": _option(args, "Flags") or "",
        "State": "ACTIVE",
    }
    print(f"Reservation created: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
