"""`dcgmi diag` of the simulated node: the JSON answer `dcgmi diag -r <level> -j` prints.

Every test of the level passes on every GPU, except where the scenario has a `diag_fail` fault
active on a GPU: its named test fails there (from the level that runs it), with a warning, as
DCGM reports a failed test. NVML shows nothing of such a fault: only a diagnostic finds it.

As a program (`python -m gpulens.sim.dcgm.dcgmi diag -r 2 -j [-i 0,1]`, put on the PATH as
`dcgmi` by a wrapper) it reads the scenario named by `GPULENS_SIM_SCENARIO` at
`GPULENS_SIM_AT` seconds into it (default 0), prints the JSON and exits 0 when every test passed,
1 otherwise; anything else it is asked is an error (exit 2, one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from gpulens.sim.scenario import DIAG_TESTS, DiagFailFault, Scenario, ScenarioError
from gpulens.sim.scenariofile import load_scenario

# DCGM's categories, in its order, and which test goes in which
CATEGORIES = {
    "Deployment": ("software",),
    "Integration": ("pcie",),
    "Hardware": ("memory", "diagnostic", "memtest", "pulse_test"),
    "Stress": ("targeted_stress", "targeted_power", "memory_bandwidth"),
}


def failing(scenario: Scenario, at: float) -> dict[tuple[int, str], str]:
    """(GPU, test) -> why, for the diag_fail faults active at `at`."""
    found: dict[tuple[int, str], str] = {}
    for fault in scenario.faults:
        active = isinstance(fault, DiagFailFault) and fault.at <= at < fault.at + fault.duration
        if active and isinstance(fault, DiagFailFault) and fault.gpu is not None:
            found[(fault.gpu, fault.test)] = f"the {fault.test} test failed on GPU {fault.gpu}"
    return found


def diag_answer(scenario: Scenario, level: int, gpus: list[int] | None, at: float) -> dict[str, Any]:
    """What `dcgmi diag -r <level> -j [-i gpus]` prints for the scenario's node at `at`."""
    ids = list(range(len(scenario.gpus))) if gpus is None else gpus
    fails = failing(scenario, at)
    categories = []
    for category, names in CATEGORIES.items():
        tests = []
        for name in names:
            if DIAG_TESTS[name] > level:
                continue
            results = []
            for gpu in ids:
                why = fails.get((gpu, name))
                result: dict[str, Any] = {"gpu_id": str(gpu), "status": "Fail" if why else "Pass"}
                if why:
                    result["warnings"] = [{"warning": why, "error_id": 0, "error_category": 0}]
                results.append(result)
            tests.append({"name": name, "results": results})
        if tests:
            categories.append({"category": category, "tests": tests})
    return {"DCGM GPU Diagnostic": {"test_categories": categories}}


def passed(answer: dict[str, Any]) -> bool:
    return all(
        r["status"] != "Fail"
        for c in answer["DCGM GPU Diagnostic"]["test_categories"]
        for t in c["tests"]
        for r in t["results"]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dcgmi")
    sub = parser.add_subparsers(dest="command", required=True)
    diag = sub.add_parser("diag")
    diag.add_argument("-r", dest="level", type=int, choices=(1, 2, 3, 4), required=True)
    diag.add_argument("-j", dest="json", action="store_true")
    diag.add_argument("-i", dest="gpus", default="")
    args = parser.parse_args(argv)
    source = os.environ.get("GPULENS_SIM_SCENARIO", "")
    try:
        scenario = load_scenario(source)
        at = float(os.environ.get("GPULENS_SIM_AT", "0"))
        gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    except (ScenarioError, ValueError) as exc:
        print(f"dcgmi: GPULENS_SIM_SCENARIO / GPULENS_SIM_AT / -i: {exc}", file=sys.stderr)
        return 2
    if gpus is not None and not all(0 <= g < len(scenario.gpus) for g in gpus):
        print(f"dcgmi: -i {args.gpus}: expected GPU ids from 0 to {len(scenario.gpus) - 1}", file=sys.stderr)
        return 2
    answer = diag_answer(scenario, args.level, gpus, at)
    print(json.dumps(answer, indent=2) if args.json else ("Pass" if passed(answer) else "Fail"))
    return 0 if passed(answer) else 1


if __name__ == "__main__":
    sys.exit(main())
