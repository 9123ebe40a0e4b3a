"""Convert public GPU traces into the history format (`gpulens import-trace`).

- `alibaba-genai-2026` (GenTD26, SoCC '25): per-pod GPU duty cycle (percent, i.e. NVML
  utilization.gpu, not SM activity) and GPU memory used, about one sample a minute. Each pod
  becomes a job alone on one GPU (`sharing="exclusive"`); the trace does not name the GPU model, so
  the caller must (`--gpu-model`). Missing values (empty, `None`, `NULL`) become gaps.
- `alibaba-gpu-v2023` (ATC '23): GPU requests only (no usage): one `gpulens_trace_*` sample per pod
  (requested GPUs, lifetime) and per node (GPU count, model), for packing arithmetic.

Sources may be the directory with the files as published (tarballs or extracted CSVs) or one
file. Every problem is reported as one line naming the file and what was expected.

Impossible values, two policies:
- a time that cannot be placed (not finite, negative, after 2242) refuses the file: the trace is
  corrupt or not the one named, and dropping rows would silently move the analysis window;
- an impossible measurement (infinite, negative, a memory value above the GPU's memory, a duty
  cycle above 100 % beyond rounding, a pod deleted before it was created, a request of more GPUs
  than a node holds) drops that row, counted in `meta["trace"]["dropped"]` and printed as one
  warning line per file and column, as a monitoring pipeline drops a glitched sample. When more
  than `MAX_DROPPED_FRACTION` of a file's rows are impossible the file is refused instead: that
  is a wrong column or unit, not a glitch.
Files are bounded before they are read (`InputLimits`): a tarball member or CSV that would expand
beyond the memory limit is refused with one line.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.history import MAX_TIMESTAMP, InputLimits, write_history
from gpulens.catalog import GpuModel

TRACES = ("alibaba-genai-2026", "alibaba-gpu-v2023")
NA_VALUES = ["", "None", "NULL", "null", "NaN", "nan"]
GENAI_UTIL = "pod_gpu_duty_cycle_anon"
GENAI_MEMORY = "pod_gpu_memory_used_bytes_anon"
GENAI_COLUMNS = {
    GENAI_UTIL: ("value", "timestamp_anon", "container_ip"),
    GENAI_MEMORY: ("timestamp_anon", "value", "container_ip"),
}
V2023_PODS = "openb_pod_list_default.csv"
V2023_NODES = "openb_node_list_gpu_node.csv"
V2023_COLUMNS = (
    "name",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
)
# the v2023 trace counts seconds from its own zero; histories place that zero here (2023-01-01Z)
V2023_EPOCH = 1_672_531_200.0
MAX_DROPPED_FRACTION = 0.01
DUTY_TOLERANCE = 1.05  # NVML's duty cycle is 0..100; averaging can round a little above
MEMORY_TOLERANCE = 1.05  # used memory above the GPU's total is impossible (beyond rounding)
MAX_GPUS_PER_POD = 64


def _find(src: Path, stem: str) -> Path:
    """The CSV or tarball for `stem` in `src` (a directory) or `src` itself."""
    if src.is_file():
        if src.name.startswith(stem):
            return src
        raise AnalyzerError(f"{src}: expected a file named {stem}.csv or {stem}.tar.gz")
    for name in (f"{stem}.csv", f"{stem}.tar.gz", f"{stem}.tgz"):
        if (src / name).is_file():
            return src / name
    raise AnalyzerError(f"{src}: no {stem}.csv or {stem}.tar.gz found")


def _read_csv(path: Path, columns: tuple[str, ...], limits: InputLimits) -> pd.DataFrame:
    """Read a CSV (plain or the single member of a tarball) and check its columns."""
    try:
        if path.name.endswith((".tar.gz", ".tgz")):
            with tarfile.open(path, "r:gz") as tar:
                member = next((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".csv")), None)
                if member is None:
                    raise AnalyzerError(f"{path}: the archive holds no .csv file")
                limits.check_text(Path(f"{path}:{member.name}"), member.size)  # before decompressing
                handle = tar.extractfile(member)
                assert handle is not None
                frame = pd.read_csv(io.BytesIO(handle.read()), na_values=NA_VALUES, keep_default_na=True)
        else:
            limits.check_text(path)
            frame = pd.read_csv(path, na_values=NA_VALUES, keep_default_na=True)
    except AnalyzerError:
        raise
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise AnalyzerError(f"{path}: cannot read archive: {exc}") from exc
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise AnalyzerError(f"{path}: not a readable CSV: {str(exc).splitlines()[0]}") from exc
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise AnalyzerError(f"{path}: missing columns {missing}; expected {list(columns)}")
    return frame


def _numeric(frame: pd.DataFrame, column: str, path: Path) -> pd.Series:
    values = pd.to_numeric(frame[column], errors="coerce")
    bad = values.isna() & frame[column].notna()
    if bad.any():
        example = frame.loc[bad, column].iloc[0]
        raise AnalyzerError(
            f"{path}: column {column!r} must be numeric, got {example!r} ({int(bad.sum())} rows)"
        )
    return values


class Dropped:
    """Rows dropped for impossible values, per file and column (what `meta["trace"]["dropped"]` holds)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def keep(
        self, frame: pd.DataFrame, ok: pd.Series, path: Path, column: str, expected: str
    ) -> pd.DataFrame:
        """`frame` without the rows where `ok` is False (NaN values are gaps, never dropped)."""
        bad = ~ok.fillna(True).astype(bool)
        n = int(bad.sum())
        if not n:
            return frame
        first = bad[bad].index[0]
        if n > MAX_DROPPED_FRACTION * len(frame):
            raise AnalyzerError(
                f"{path}: column {column!r}: expected {expected}, found {frame.loc[first, column]!r} in "
                f"{n} of {len(frame)} rows (first row {int(first) + 1}): not a glitch, a wrong column or unit"
            )
        self.entries.append(
            {
                "file": str(path),
                "column": column,
                "expected": expected,
                "rows": n,
                "first_row": int(first) + 1,
                "first_value": float(frame.loc[first, column]),
            }
        )
        return frame[~bad]


def warnings(meta: Mapping[str, Any]) -> list[str]:
    """One line per file and column with dropped rows, for the CLI's stderr."""
    return [
        f"{d['file']}: dropped {d['rows']} rows with column {d['column']!r} not {d['expected']} "
        f"(first: row {d['first_row']}, {d['first_value']!r})"
        for d in meta.get("trace", {}).get("dropped", [])
    ]


def _times(frame: pd.DataFrame, column: str, path: Path, offset: float = 0.0) -> None:
    """Refuse the file when a time cannot be placed (see the module docstring)."""
    t = frame[column] + offset
    bad = frame[column].notna() & ~(np.isfinite(t) & (t >= 0) & (t <= MAX_TIMESTAMP))
    if bad.any():
        first = bad[bad].index[0]
        raise AnalyzerError(
            f"{path}: column {column!r}: expected a time in seconds (finite, 1970..2242), found "
            f"{frame.loc[first, column]!r} (row {int(first) + 1}, {int(bad.sum())} rows)"
        )


def import_genai_2026(
    src: Path, out: Path, model: GpuModel, limits: InputLimits | None = None
) -> dict[str, Any]:
    """Per-pod utilisation and memory -> a usage history on `model`; returns meta."""
    limits = InputLimits() if limits is None else limits
    dropped = Dropped()
    util_path, mem_path = _find(src, GENAI_UTIL), _find(src, GENAI_MEMORY)
    util = _read_csv(util_path, GENAI_COLUMNS[GENAI_UTIL], limits)
    mem = _read_csv(mem_path, GENAI_COLUMNS[GENAI_MEMORY], limits)
    util, mem = (
        frame.assign(
            value=_numeric(frame, "value", path), timestamp_anon=_numeric(frame, "timestamp_anon", path)
        )
        for frame, path in ((util, util_path), (mem, mem_path))
    )
    _times(util, "timestamp_anon", util_path)
    _times(mem, "timestamp_anon", mem_path)
    util = dropped.keep(
        util,
        (util["value"] >= 0) & (util["value"] <= 100 * DUTY_TOLERANCE) | util["value"].isna(),
        util_path,
        "value",
        f"a duty cycle of 0..{100 * DUTY_TOLERANCE:g} %",
    )
    limit = model.memory_bytes * MEMORY_TOLERANCE
    mem = dropped.keep(
        mem,
        (mem["value"] >= 0) & (mem["value"] <= limit) | mem["value"].isna(),
        mem_path,
        "value",
        f"0..{limit:.4g} bytes (the {model.key}'s memory)",
    )
    util, mem = (
        frame.dropna(subset=["timestamp_anon", "container_ip"]).reset_index(drop=True)
        for frame in (util, mem)
    )
    if util.empty or mem.empty:
        raise AnalyzerError(f"{src}: the trace has no usable rows")
    stamps = pd.Series(sorted(set(util["timestamp_anon"]) | set(mem["timestamp_anon"])))
    step = float(stamps.diff().median()) if len(stamps) > 1 else 60.0
    pods = sorted(set(util["container_ip"]) | set(mem["container_ip"]))
    ids = {pod: pod[:12] for pod in pods}
    if len(set(ids.values())) != len(ids):
        ids = {pod: pod for pod in pods}
    node = "alibaba-genai-2026"

    def labelled(frame: pd.DataFrame) -> pd.DataFrame:
        out = pd.DataFrame({"timestamp": frame["timestamp_anon"].astype(float)})
        out["job_id"] = frame["container_ip"].map(ids).map(lambda s: f"pod-{s}")
        out["uuid"] = frame["container_ip"].map(ids).map(lambda s: f"GPU-trace-{s}")
        out["instance"] = node
        out["gpu"] = "0"
        return out

    util_rows = labelled(util).assign(
        metric="gpu_utilization_ratio", value=(util["value"] / 100.0).clip(0, 1).values
    )
    mem_rows = labelled(mem).assign(metric="gpu_job_memory_used_bytes", value=mem["value"].values)
    present = pd.concat([util_rows, mem_rows])[
        ["timestamp", "job_id", "uuid", "instance", "gpu"]
    ].drop_duplicates()
    info = present.assign(
        metric="gpu_job_info", value=1.0, job_source="unknown", job_pod=present["job_id"], sharing="exclusive"
    )
    gpu_info = present.drop(columns="job_id").assign(metric="gpu_info", value=1.0, model=model.nvml_name)
    frame = pd.concat(
        [info, gpu_info, util_rows, mem_rows.assign(job_id=mem_rows["job_id"])], ignore_index=True
    )
    meta = {
        "kind": "usage",
        "source": "alibaba-genai-2026",
        "gpu_model": model.key,
        "step_s": step,
        "trace": {
            "origin": "alibaba/clusterdata cluster-trace-v2026-GenAI",
            "files": [str(util_path), str(mem_path)],
            "pods": len(pods),
            "activity_signal": "NVML utilization (duty cycle), not SM activity",
            "dropped": dropped.entries,
        },
    }
    write_history(out, frame, meta)
    return meta


def import_gpu_v2023(src: Path, out: Path, limits: InputLimits | None = None) -> dict[str, Any]:
    """GPU requests per pod and GPUs per node -> a requests history; returns meta."""
    limits = InputLimits() if limits is None else limits
    dropped = Dropped()
    pods_path = _find(src, V2023_PODS.removesuffix(".csv"))
    pods = _read_csv(pods_path, V2023_COLUMNS, limits)
    for column in ("num_gpu", "gpu_milli", "creation_time", "deletion_time"):
        pods[column] = _numeric(pods, column, pods_path)
    for column in ("creation_time", "deletion_time"):
        _times(pods, column, pods_path, V2023_EPOCH)
    pods = dropped.keep(
        pods,
        (pods["num_gpu"] >= 0) & (pods["num_gpu"] <= MAX_GPUS_PER_POD) | pods["num_gpu"].isna(),
        pods_path,
        "num_gpu",
        f"0..{MAX_GPUS_PER_POD} GPUs",
    )
    pods = dropped.keep(
        pods,
        (pods["gpu_milli"] >= 0) & (pods["gpu_milli"] <= 1000) | pods["gpu_milli"].isna(),
        pods_path,
        "gpu_milli",
        "0..1000 thousandths of a GPU",
    )
    pods = dropped.keep(
        pods,
        (pods["deletion_time"] >= pods["creation_time"]) | pods["deletion_time"].isna(),
        pods_path,
        "deletion_time",
        "a time after creation_time",
    )
    pods = pods[pods["num_gpu"] > 0].dropna(subset=["num_gpu", "gpu_milli", "creation_time"])
    if pods.empty:
        raise AnalyzerError(f"{pods_path}: no GPU pods (num_gpu > 0)")
    requested = pods["num_gpu"].where(pods["num_gpu"] != 1, pods["gpu_milli"].clip(upper=1000) / 1000.0)
    # a pod without a deletion time still held its request when the trace ended
    end = pods["deletion_time"].fillna(pods[["creation_time", "deletion_time"]].max().max())
    # A pod holds its GPUs from when it was scheduled (creation_time is when it was asked for)
    # until deletion, whatever its final phase: a Failed pod held them until it failed. One never
    # scheduled held nothing: its lifetime is 0. Without the column, from creation.
    if "scheduled_time" in pods:
        scheduled = pd.to_numeric(pods["scheduled_time"], errors="coerce")
        held_from = scheduled.clip(lower=pods["creation_time"]).fillna(end)
    else:
        held_from = pods["creation_time"].astype(float)
    spec = pods["gpu_spec"].astype(object).where(pods["gpu_spec"].notna(), "").astype(str)
    labels = pd.DataFrame(
        {
            "job_id": pods["name"].astype(str),
            "gpu_spec": spec,
            "qos": pods["qos"].astype(str),
            "phase": pods["pod_phase"].astype(str),
            "timestamp": V2023_EPOCH + held_from.astype(float),
        }
    )
    rows = [
        labels.assign(metric="gpulens_trace_job_requested_gpus", value=requested.values),
        labels.assign(
            metric="gpulens_trace_job_lifetime_seconds",
            value=(end - held_from).clip(lower=0).values,
        ),
    ]
    files = [str(pods_path)]
    try:
        nodes_path = _find(src, V2023_NODES.removesuffix(".csv")) if src.is_dir() else None
    except AnalyzerError:
        nodes_path = None
    if nodes_path is not None:
        nodes = _read_csv(nodes_path, ("sn", "gpu", "model"), limits)
        nodes["gpu"] = _numeric(nodes, "gpu", nodes_path)
        nodes = dropped.keep(
            nodes,
            (nodes["gpu"] >= 0) & (nodes["gpu"] <= MAX_GPUS_PER_POD) | nodes["gpu"].isna(),
            nodes_path,
            "gpu",
            f"0..{MAX_GPUS_PER_POD} GPUs",
        )
        rows.append(
            pd.DataFrame(
                {
                    "timestamp": V2023_EPOCH,
                    "metric": "gpulens_trace_node_gpus",
                    "value": nodes["gpu"].astype(float),
                    "instance": nodes["sn"].astype(str),
                    "model": nodes["model"].astype(str),
                }
            )
        )
        files.append(str(nodes_path))
    meta = {
        "kind": "requests",
        "source": "alibaba-gpu-v2023",
        "step_s": 1.0,
        "time_offset_s": V2023_EPOCH,
        "trace": {
            "origin": "alibaba/clusterdata cluster-trace-gpu-v2023",
            "files": files,
            "pods": len(pods),
            "dropped": dropped.entries,
        },
    }
    write_history(out, pd.concat(rows, ignore_index=True), meta)
    return meta


def import_trace(
    name: str, src: str | Path, out: str | Path, model: GpuModel | None, limits: InputLimits | None = None
) -> dict[str, Any]:
    """Dispatch by trace name; `model` is required for traces that do not name the GPU."""
    source = Path(src)
    if not source.exists():
        raise AnalyzerError(f"{source}: trace source not found")
    if name == "alibaba-genai-2026":
        if model is None:
            raise AnalyzerError(
                "alibaba-genai-2026 does not name the GPU model: pass --gpu-model (e.g. A100-80GB)"
            )
        return import_genai_2026(source, Path(out), model, limits)
    if name == "alibaba-gpu-v2023":
        return import_gpu_v2023(source, Path(out), limits)
    raise AnalyzerError(f"unknown trace {name!r}; known: {', '.join(TRACES)}")
