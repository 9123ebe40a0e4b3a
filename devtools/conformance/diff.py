"""Compare two conformance records (real GPU vs simulator) and list what the simulator gets wrong.

Only behaviour is compared, not values that legitimately differ between two machines: which
calls raise and with which NVML error, return types, list/tuple shapes, struct and object field
names and their types. Counts (processes, MIG devices) are reported when one side has none, as that
usually hides a shape difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mismatch:
    where: str  # "system", "gpu0", "gpu0/mig0"
    probe: str
    detail: str

    def __str__(self) -> str:
        return f"{self.where:12} {self.probe}: {self.detail}"


def _outcome(desc: dict[str, Any]) -> str:
    if "error" in desc:
        return f"raises {desc['error']}({desc.get('code')})"
    return f"returns {desc.get('type')}"


def compare_values(real: dict[str, Any], sim: dict[str, Any], path: str = "") -> list[str]:
    """Differences in shape between two `describe()` outputs (empty list = same shape)."""
    if ("error" in real) != ("error" in sim) or real.get("error") != sim.get("error"):
        return [f"{path or 'result'}: real {_outcome(real)}, simulator {_outcome(sim)}"]
    if "error" in real:
        return (
            []
            if real.get("code") == sim.get("code")
            else [f"{path or 'result'}: error code real {real.get('code')} vs simulator {sim.get('code')}"]
        )
    if real.get("type") != sim.get("type"):
        # an int that happens to be None on one side is a real difference (e.g. usedGpuMemory)
        return [f"{path or 'result'}: type real {real.get('type')} vs simulator {sim.get('type')}"]
    out: list[str] = []
    if "fields" in real:
        real_fields, sim_fields = real["fields"], sim.get("fields", {})
        for name in sorted(set(real_fields) - set(sim_fields)):
            out.append(f"{path}.{name}: missing in simulator")
        for name in sorted(set(sim_fields) - set(real_fields)):
            out.append(f"{path}.{name}: only in simulator")
        for name in sorted(set(real_fields) & set(sim_fields)):
            out.extend(compare_values(real_fields[name], sim_fields[name], f"{path}.{name}"))
    if "items" in real:
        if real["items"] and sim.get("items"):
            out.extend(compare_values(real["items"][0], sim["items"][0], f"{path}[0]"))
        elif real["items"] and not sim.get("items"):
            out.append(f"{path or 'result'}: real has {real['len']} items, simulator none (shape unchecked)")
        if real["type"] == "tuple" and real.get("len") != sim.get("len"):
            out.append(
                f"{path or 'result'}: tuple length real {real.get('len')} vs simulator {sim.get('len')}"
            )
    if real.get("type") == "float" and real.get("nan") != sim.get("nan"):
        out.append(f"{path or 'result'}: NaN real {real.get('nan')} vs simulator {sim.get('nan')}")
    return out


def _compare_probes(where: str, real: dict[str, Any], sim: dict[str, Any]) -> list[Mismatch]:
    out: list[Mismatch] = []
    for name in sorted(real):
        if name not in sim:
            out.append(Mismatch(where, name, "not probed on the simulator"))
            continue
        out.extend(Mismatch(where, name, d) for d in compare_values(real[name], sim[name]))
    return out


def compare_records(real: dict[str, Any], sim: dict[str, Any]) -> list[Mismatch]:
    """Everything the simulator does differently from the real record."""
    if "init_error" in real or "init_error" in sim:
        if real.get("init_error") != sim.get("init_error"):
            return [
                Mismatch(
                    "system", "nvmlInit", f"real {real.get('init_error')} vs sim {sim.get('init_error')}"
                )
            ]
        return []
    out = _compare_probes("system", real.get("system", {}), sim.get("system", {}))
    for i, real_gpu in enumerate(real.get("gpus", [])):
        sim_gpus = sim.get("gpus", [])
        if i >= len(sim_gpus):
            out.append(Mismatch(f"gpu{i}", "*", "simulator has fewer GPUs"))
            continue
        out.extend(_compare_probes(f"gpu{i}", real_gpu["probes"], sim_gpus[i]["probes"]))
        sim_migs = sim_gpus[i].get("mig", [])
        for j, real_mig in enumerate(real_gpu.get("mig", [])):
            if j >= len(sim_migs):
                out.append(Mismatch(f"gpu{i}/mig{j}", "*", "simulator has fewer MIG devices"))
                continue
            out.extend(_compare_probes(f"gpu{i}/mig{j}", real_mig["probes"], sim_migs[j]["probes"]))
    return out


def render(mismatches: list[Mismatch]) -> str:
    if not mismatches:
        return "simulator matches the real record: no differences in errors, types or shapes"
    lines = [f"{len(mismatches)} difference(s) between the real GPU and the simulator:"]
    lines += [f"  {m}" for m in mismatches]
    return "\n".join(lines)
