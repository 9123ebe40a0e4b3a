"""Scenario files: read one (a built-in by name or a YAML file), validate it whole, return a Scenario.

Loading is strict: unknown keys, wrong types, unknown models or profiles, impossible MIG layouts,
duplicate pids and dangling references are all errors, reported as ONE line (`checks.py`). The
sections are parsed by `parse_gpus.py`, `parse_processes.py` and `parse_faults.py`; what spans
sections (pids used twice, memory of processes that run together) is checked here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpulens.catalog import MigProfile
from gpulens.safeload import InputError, NestingError, load_yaml_file
from gpulens.sim.checks import Check, gib
from gpulens.sim.defaults import gpu_reserved_bytes, instance_reserved_bytes
from gpulens.sim.parse_faults import parse_faults
from gpulens.sim.parse_gpus import parse_driver, parse_gpus
from gpulens.sim.parse_processes import parse_process
from gpulens.sim.scenario import (
    MAX_RESTARTING,
    MAX_SEED,
    MAX_UID,
    RESTART_PID_BASE,
    GpuSpec,
    ProcessSpec,
    Scenario,
    ScenarioError,
    instance_profiles,
)
from gpulens.sim.topology import default_topology, parse_topology

BUILTIN_DIR = Path(__file__).resolve().parent / "scenarios"


def parse_scenario(data: Any, source: str, name: str | None = None) -> Scenario:
    """Validate parsed YAML (`data`) read from `source` (used in error messages)."""
    c = Check(source)
    top = c.mapping(
        "",
        data,
        ("gpus",),
        ("name", "description", "seed", "node", "users", "processes", "faults", "topology"),
    )
    scenario_name = c.string("name", top.get("name", name or Path(source).stem))
    description = c.string("description", top["description"]) if "description" in top else ""
    seed = c.integer("seed", top.get("seed", 0), 0, MAX_SEED)
    hostname, driver = parse_driver(c, top.get("node", {}))
    node = top.get("node", {})
    k8s_defaults = c.mapping(
        "node.kubernetes", node.get("kubernetes", {}), (), ("driver", "runtime", "cgroup")
    )
    users_raw = c.any_mapping("users", top.get("users", {}))
    users = {str(u): c.integer(f"users.{u}", uid, 0, MAX_UID) for u, uid in users_raw.items()}
    gpus = parse_gpus(c, top["gpus"], hostname, users)
    topology = parse_topology(top["topology"], gpus, c.fail) if "topology" in top else default_topology(gpus)
    faults, repeat = parse_faults(c, top.get("faults"), gpus)
    instances = {g.index: instance_profiles(g, faults) for g in gpus}
    processes: list[ProcessSpec] = []
    owners: dict[int, str] = {}
    for g in gpus:
        if g.mps is not None:
            owners[g.mps.server_pid] = f"gpus[{g.index}].mps.server_pid"
            owners[g.mps.restart_pid] = f"gpus[{g.index}].mps.restart_pid"
    for i, entry in enumerate(c.list_("processes", top.get("processes", []) or [])):
        path = f"processes[{i}]"
        proc = parse_process(
            c, path, entry, gpus, users, {str(k): str(v) for k, v in k8s_defaults.items()}, instances
        )
        if proc.pid in owners:
            raise c.expected(
                f"{path}.pid", f"a pid not used elsewhere (already {owners[proc.pid]})", proc.pid
            )
        owners[proc.pid] = f"{path}.pid"
        processes.append(proc)
    _check_restart_pids(c, processes, owners)
    _check_memory_fits(c, gpus, processes, instances)
    return Scenario(
        name=scenario_name,
        source=source,
        description=description,
        seed=seed,
        hostname=hostname,
        driver=driver,
        gpus=gpus,
        processes=tuple(processes),
        faults=faults,
        repeat=repeat,
        users=tuple(sorted(users.items())),
        kubernetes_defaults=tuple(sorted((str(k), str(v)) for k, v in k8s_defaults.items())),
        topology=topology,
    )


def _check_restart_pids(c: Check, processes: list[ProcessSpec], owners: dict[int, str]) -> None:
    """Processes that can restart take their new pids from RESTART_PID_BASE up: the scenario's own
    pids stay below it, so a restart never takes a pid the scenario uses."""
    restarting = sum(1 for p in processes if p.memory_limit_bytes is not None)
    if not restarting:
        return
    if restarting > MAX_RESTARTING:
        raise c.fail(
            "processes",
            f"expected at most {MAX_RESTARTING} processes with a memory limit, found {restarting}",
        )
    for pid, where in owners.items():
        if pid >= RESTART_PID_BASE:
            raise c.expected(
                where, f"a pid below {RESTART_PID_BASE} (restarted processes take the pids above)", pid
            )


def _check_memory_fits(
    c: Check,
    gpus: tuple[GpuSpec, ...],
    processes: list[ProcessSpec],
    instances: dict[int, dict[int, MigProfile]],
) -> None:
    """Processes that run at the same time in one container must fit its memory together (at their
    peak), as the driver would refuse the allocation that does not."""
    by_container: dict[tuple[int, int | None], list[int]] = {}
    for i, proc in enumerate(processes):
        by_container.setdefault((proc.gpu, proc.instance), []).append(i)
    for (gpu_index, instance), members in by_container.items():
        gpu = gpus[gpu_index]
        if instance is None:
            capacity = gpu.model.memory_bytes - gpu_reserved_bytes(gpu.model)
            capacity -= gpu.mps.memory_bytes if gpu.mps is not None else 0
            what = f"GPU {gpu_index}"
        else:
            profile = instances[gpu_index][instance]
            capacity = profile.memory_bytes - instance_reserved_bytes(profile)
            what = f"GPU {gpu_index} instance {instance} ({profile.name})"
        # sweep start/end times; ends sort before starts at the same time
        events = sorted(
            [(processes[i].start, 1, i) for i in members] + [(processes[i].end, 0, i) for i in members]
        )
        running: dict[int, int] = {}
        for when, starting, i in events:
            if not starting:
                running.pop(i, None)
                continue
            limit = processes[i].memory_limit_bytes
            held = processes[i].workload.memory_bytes
            running[i] = held if limit is None else min(held, limit)  # past its limit it fails
            total = sum(running.values())
            if total > capacity:
                pids = ", ".join(str(processes[j].pid) for j in running)
                raise c.fail(
                    f"processes[{i}].workload.memory",
                    f"expected processes running together on {what} to fit its {gib(capacity)},"
                    f" found {gib(total)} (pids {pids} at {when:g}s)",
                )


def list_builtin() -> list[str]:
    """Names of the scenarios shipped with gpulens."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load a built-in scenario by name, or a scenario file by path."""
    text_name = str(name_or_path)
    builtin = BUILTIN_DIR / f"{text_name}.yaml"
    if "/" not in text_name and not text_name.endswith((".yaml", ".yml")) and builtin.is_file():
        path, shown = builtin, builtin.name
    else:
        path, shown = Path(text_name), text_name
        if not path.is_file():
            known = ", ".join(list_builtin())
            raise ScenarioError(
                f"{shown}: expected a built-in scenario name ({known}) or a YAML file, found neither"
            )
    try:
        data = load_yaml_file(path, shown)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "file"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if isinstance(e, NestingError):
            raise ScenarioError(f"{shown}: expected a scenario, found a document {problem}") from None
        raise ScenarioError(
            f"{shown}: {where}: expected valid YAML, found a syntax error ({problem})"
        ) from None
    except OSError as e:
        raise ScenarioError(f"{shown}: expected a readable file, found {e.strerror}") from None
    except InputError as e:  # not UTF-8, or over the YAML byte bound
        raise ScenarioError(str(e)) from None
    return parse_scenario(data, shown, name=path.stem)
