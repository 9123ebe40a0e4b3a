"""A stand-in for `nvidia-cuda-mps-control` in client mode, answering for a simulated node.

The real program, run without `-d`, reads commands from stdin (one per line), asks the control
daemon behind `$CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`) over its `control` socket and
prints each answer. The simulated node has no daemon: it leaves what its daemon would answer in
`<pipe directory>/gpulens-sim-mps.json` (`procfs.NodeFiles`), which this reads. It is the orchestrator
stood in for at its own interface (the exporter runs it as it runs the real one, `--mps-control`).

Answered, as the MPS documentation lists them: `get_server_list` (server pids, one per line),
`get_default_active_thread_percentage`, `get_active_thread_percentage <server pid>`. Without a
state file (no daemon behind that pipe directory) it fails as a client without a daemon does:
a message on stderr, exit status 1.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
STATE_FILE = "gpulens-sim-mps.json"
MAX_STATE_BYTES = 64 * 1024


@dataclass(frozen=True)
class DaemonState:
    """What a simulated control daemon would answer: its default and each server's percentage."""

    default_active_thread_percentage: float
    servers: Mapping[int, float]  # server pid (as the daemon sees it) -> active thread percentage

    def to_json(self) -> str:
        return json.dumps(
            {
                "default_active_thread_percentage": self.default_active_thread_percentage,
                "servers": [
                    {"pid": pid, "active_thread_percentage": pct} for pid, pct in sorted(self.servers.items())
                ],
            }
        )


def client_argv() -> tuple[str, ...]:
    """The program and arguments that run this stand-in under the running Python: the exporter's
    `--mps-control` when it samples a simulated node."""
    return (sys.executable, "-m", "gpulens.sim.mpscontrol")


def client_command() -> str:
    """`client_argv` as one shell-quoted command line (`--mps-control "..."`)."""
    return shlex.join(client_argv())


def read_state(pipe_dir: Path) -> DaemonState | None:
    """The daemon state left in `pipe_dir`, or None when there is none (no daemon there)."""
    try:
        with open(pipe_dir / STATE_FILE, "rb") as f:
            raw = json.loads(f.read(MAX_STATE_BYTES))
        servers = {int(s["pid"]): float(s["active_thread_percentage"]) for s in raw["servers"]}
        return DaemonState(float(raw["default_active_thread_percentage"]), servers)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _format(pct: float) -> str:
    return f"{pct:.1f}"


def answer(state: DaemonState, command: str) -> str:
    """One command's output lines (without the final newline)."""
    words = command.split()
    if not words:
        return ""
    name, args = words[0], words[1:]
    if name == "get_server_list" and not args:
        return "\n".join(str(pid) for pid in sorted(state.servers))
    if name == "get_default_active_thread_percentage" and not args:
        return _format(state.default_active_thread_percentage)
    if name == "get_active_thread_percentage" and len(args) == 1:
        try:
            pid = int(args[0])
        except ValueError:
            return f"Invalid server PID {args[0]}"
        if pid not in state.servers:
            return f"Server {pid} not found"
        return _format(state.servers[pid])
    return f"Unsupported command {command.strip()!r} (gpulens simulated MPS control daemon)"


def run(stdin: TextIO, stdout: TextIO, stderr: TextIO, environ: Mapping[str, str]) -> int:
    pipe_dir = Path(environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIRECTORY)
    state = read_state(pipe_dir)
    if state is None:
        stderr.write(f"Cannot find MPS control daemon process (pipe directory {pipe_dir})\n")
        return 1
    for line in stdin:
        out = answer(state, line)
        if out:
            stdout.write(out + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args:  # `-d`/`-f` start a daemon: the simulated node keeps its own
        sys.stderr.write("gpulens sim: only client mode is simulated (commands on stdin)\n")
        return 2
    return run(sys.stdin, sys.stdout, sys.stderr, os.environ)


if __name__ == "__main__":
    raise SystemExit(main())
