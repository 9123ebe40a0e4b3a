"""`gpulens conformance`: prove the simulator against real NVML on a borrowed GPU machine.

`gpulens conformance run --out DIR` (or `python tools/gpu_conformance.py --out DIR` from a source
checkout that is not installed) records every probe on the real GPUs while a small CUDA workload
runs, records the same probes on the simulator configured as the same model (and MIG layout),
prints the differences, and runs the exporter on the real GPU for a few samples. Files written:
`real.json`, `sim.json`, `diff.txt`, `exporter.txt`, `exporter.prom` (the scrape), `summary.json`.

`gpulens conformance diff REAL.json` replays a committed real record against today's simulator:
that is the regression test once a GPU run has happened.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.catalog import model_for_nvml_name
from gpulens.devtools.conformance.diff import compare_records, render
from gpulens.devtools.conformance.exporter_check import run_exporter_check
from gpulens.devtools.conformance.record import record_node
from gpulens.devtools.conformance.workload import cuda_workload


@dataclass(frozen=True)
class RealShape:
    """What the simulated node copies from a real record so that both answer the same probes."""

    model: str | None  # catalog key of the first real GPU
    mig_profiles: tuple[str, ...] = ()  # MIG profile names seen on it
    nvlink: bool = True  # False: the real driver exposes no NVLink (PCIe card, VM passthrough)


def _real_shape(record: dict[str, Any]) -> RealShape:
    """The model, MIG layout and NVLink exposure of the first real GPU in a record."""
    gpus = record.get("gpus") or []
    if not gpus:
        return RealShape(None)
    probes = gpus[0]["probes"]
    name = probes.get("nvmlDeviceGetName", {}).get("value")
    model = model_for_nvml_name(name) if name else None
    profiles = []
    for mig in gpus[0].get("mig", []):
        mig_name = mig["probes"].get("nvmlDeviceGetName", {}).get("value", "")
        if " MIG " in mig_name:
            profiles.append(mig_name.split(" MIG ", 1)[1])
    # the link-0 state is NOT_SUPPORTED only when the driver exposes no NVLink at all
    nvlink = probes.get("nvmlDeviceGetNvLinkState(0)", {}).get("error") != "NVMLError_NotSupported"
    return RealShape(model.key if model else None, tuple(profiles), nvlink)


def simulated_record(
    model_key: str, mig_profiles: Sequence[str], gpus: int = 1, *, nvlink: bool = True
) -> dict[str, Any]:
    """Record the probes on a simulated node of `gpus` GPUs of `model_key` with one busy process;
    `nvlink=False` simulates GPUs whose NVLink the driver does not expose."""
    import pynvml

    # deferred: the GPU machine may lack the simulator's dependencies (PyYAML); cmd_run says so
    from gpulens.sim.engine import build_node
    from gpulens.sim.install import simulated
    from gpulens.sim.scenariofile import parse_scenario

    gpu_entry: dict[str, Any] = {"model": model_key, "count": gpus, "nvlink": nvlink}
    if mig_profiles:
        gpu_entry["mig"] = list(mig_profiles)
    data: dict[str, Any] = {"name": f"conformance-{model_key}", "gpus": [gpu_entry]}
    if not mig_profiles:
        data["processes"] = [
            {
                "pid": 4242,
                "gpu": 0,
                "name": "python",
                "workload": {"pattern": "constant", "sm": 0.9, "memory": "2GiB"},
            }
        ]
    scenario = parse_scenario(data, source="<conformance>")
    node = build_node(scenario, seed=1)
    with simulated(node):
        time.sleep(1.2)  # process-utilization samples need a window, as on the real GPU
        return record_node(pynvml, f"simulator {model_key}")


def _write(path: Path, content: str) -> None:
    path.write_text(content)
    print(f"wrote {path}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    import pynvml

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"started": time.time()}
    with cuda_workload(args.workload_seconds) as status:
        summary["workload"] = status
        print(status, file=sys.stderr)
        real = record_node(pynvml, "real")
    _write(out / "real.json", json.dumps(real, indent=1, sort_keys=True))
    shape = _real_shape(real)
    model_key, profiles = shape.model, list(shape.mig_profiles)
    summary["model"], summary["mig_profiles"], summary["nvlink"] = model_key, profiles, shape.nvlink
    if model_key is None:
        summary["diff"] = "no GPU model from the catalog found: nothing to compare"
    else:
        try:
            sim = simulated_record(model_key, profiles, nvlink=shape.nvlink)
            _write(out / "sim.json", json.dumps(sim, indent=1, sort_keys=True))
            mismatches = compare_records(real, sim)
            summary["differences"] = len(mismatches)
            summary["diff"] = render(mismatches)
        except Exception as exc:  # e.g. PyYAML missing on the GPU machine: diff later with `diff`
            summary["diff"] = (
                f"simulator half not run here ({type(exc).__name__}: {exc}); run `gpulens conformance diff`"
            )
    _write(out / "diff.txt", summary["diff"] + "\n")
    print(summary["diff"])
    if not args.no_exporter and "init_error" not in real:
        hopper = model_key is not None and model_key.startswith(("H1", "H2", "B2"))
        report = run_exporter_check([], seconds=args.exporter_seconds, hopper=hopper, mig=bool(profiles))
        text = "\n".join(report.problems) or "every expected family present and plausible; promtool clean"
        summary["exporter"] = {
            "problems": report.problems,
            "families": report.families,
            "promtool": report.promtool,
        }
        _write(out / "exporter.txt", text + "\n")
        if report.exposition:
            _write(out / "exporter.prom", report.exposition)
        print(f"exporter: {text}")
    summary["finished"] = time.time()
    _write(out / "summary.json", json.dumps(summary, indent=1, sort_keys=True))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    try:
        real = json.loads(Path(args.record).read_text())
    except (OSError, ValueError) as exc:
        print(
            f"gpulens conformance: {args.record}: expected a conformance JSON record: {exc}", file=sys.stderr
        )
        return 2
    shape = _real_shape(real)
    model_key = args.model or shape.model
    if model_key is None:
        print(
            f"gpulens conformance: {args.record}: no catalog GPU model in the record; pass --model",
            file=sys.stderr,
        )
        return 2
    gpus = len(real.get("gpus", [])) or 1
    mismatches = compare_records(
        real, simulated_record(model_key, shape.mig_profiles, gpus=gpus, nvlink=shape.nvlink)
    )
    print(render(mismatches))
    return 1 if mismatches and args.strict else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "conformance", help="compare the simulator with real NVML on a GPU machine"
    )
    sub = parser.add_subparsers(dest="conformance_command", required=True)
    run = sub.add_parser("run", help="record the real GPU, the simulator, their diff and an exporter check")
    run.add_argument("--out", default="conformance-out", help="output directory")
    run.add_argument("--workload-seconds", type=float, default=60.0, help="CUDA workload duration")
    run.add_argument("--exporter-seconds", type=float, default=4.0, help="how long the exporter samples")
    run.add_argument("--no-exporter", action="store_true", help="skip the exporter check")
    run.set_defaults(func=cmd_run)
    diff = sub.add_parser("diff", help="compare a recorded real JSON with the simulator")
    diff.add_argument("record", help="real.json from a GPU run")
    diff.add_argument("--model", help="catalog model to simulate (default: from the record)")
    diff.add_argument("--strict", action="store_true", help="exit 1 when there are differences")
    diff.set_defaults(func=cmd_diff)
