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
  (the only format gpulens asks for; others are refused as unsupported here).

Every call's argv is appended (JSON) to the `record` file. The state file is rewritten in place.
"""

from __future__ import annotations

import fcntl
import json
import sys
import time


def _line(name: str, node: dict) -> str:
    line = (
        f"NodeName={name} Arch=x86_64 CPUTot=128 State={node.get('State', 'MIXED')} Gres=gpu:h100:8 "
        f"Partitions=gpu BootTime={node.get('BootTime', '2026-11-29T08:00:00')}"
    )
    if node.get("Reason"):
        line += f" Reason={node['Reason']} [root@2026-11-29T20:00:00]"
    return line


def _node(state: dict, name: str) -> dict | None:
    nodes = state.setdefault("nodes", {})
    if name not in nodes and state.get("any_node", True):
        nodes[name] = dict(state.get("default", {"State": "MIXED"}))
    return nodes.get(name)


def _option(args: list[str], key: str) -> str | None:
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and name.lower() == key.lower():
            return value
    return None


def main(path: str, args: list[str]) -> int:
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel calls (one per node) see each other's changes
        if args[:1] == ["--squeue"]:
            return _squeue(path, args[1:])
        return _run(path, args)


def _squeue(path: str, args: list[str]) -> int:
    with open(path) as handle:
        state = json.load(handle)
    with open(state["record"], "a") as handle:
        handle.write(json.dumps(["squeue", *args]) + "\n")
    node = _option(args, "--nodelist")
    if "--noheader" not in args or _option(args, "--format") != "%A" or not node:
        print(f"squeue: unsupported here: {' '.join(args)}", file=sys.stderr)
        return 1
    for job in state.get("jobs", {}).get(node, []):
        print(job)
    return 0


def _run(path: str, args: list[str]) -> int:
    with open(path) as handle:
        state = json.load(handle)
    with open(state["record"], "a") as handle:
        handle.write(json.dumps(args) + "\n")
    time.sleep(float(state.get("delay_s", 0)))
    code = 0
    if args[:2] == ["show", "node"]:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
