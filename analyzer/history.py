"""The history format: what `gpulens simulate` and `gpulens import-trace` write and `--history` reads.

A history is a directory with three files (documented in docs/analyzer.md):

- `samples.parquet`: a long table, one row per sample: `timestamp` (seconds since epoch, float),
  `metric` (family name from docs/metrics.md), `value` (float), then one string column per label in
  `LABELS` ("" when the series lacks that label).
- `metrics.om`: the same samples as OpenMetrics text with timestamps, grouped by family and by
  series, ending in `# EOF`, so `promtool tsdb create-blocks-from openmetrics` can backfill a real
  Prometheus and the analyzer's PromQL path can be checked against the file path.
- `meta.json`: provenance and shape (`format`, `version`, `source`, `start`, `end`, `step_s`, ...).

Writing streams: rows are buffered and flushed to Parquet in row groups, and `metrics.om` is built
family by family from the Parquet file afterwards, so memory stays bounded by one family.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TextIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpulens import atomicfile
from gpulens.analyzer.errors import AnalyzerError
from gpulens.analyzer.memlimit import usable_memory
from gpulens.analyzer.serving import FAMILIES as SERVING_FAMILIES
from gpulens.analyzer.serving import LABELS as SERVING_LABELS
from gpulens.analyzer.units import gib_fixed
from gpulens.safeload import InputError, load_json_file, read_text

FORMAT = "gpulens-history"
VERSION = 1
SAMPLES_FILE = "samples.parquet"
OPENMETRICS_FILE = "metrics.om"
META_FILE = "meta.json"
CSV_FILE = "samples.csv"  # accepted on input instead of Parquet (same columns)
MAX_META_BYTES = 16 << 20  # a meta.json is a few KiB (a trace's adds its file list)
HISTORY_FILES = frozenset({SAMPLES_FILE, OPENMETRICS_FILE, META_FILE, CSV_FILE})

# labels kept in histories: the ones the analyzer reads (identity and joins); others are dropped
LABELS: tuple[str, ...] = (
    "instance",
    "gpu",
    "uuid",
    "model",
    "gpu_instance",
    "mig_profile",
    "job_id",
    "job_source",
    "job_user",
    "job_name",
    "job_namespace",
    "job_pod",
    "job_container",
    "sharing",
    "gpu_spec",
    "qos",
    "phase",
    "peer",  # gpu_topology_info: the peer GPU's index and uuid, and the link to it
    "peer_uuid",
    "link",
    *SERVING_LABELS,  # inference servers' series: the pod they join to, the KV cache config
)

# families kept in histories (docs/metrics.md names, plus the trace-only request families)
FAMILIES: tuple[str, ...] = (
    "gpu_info",
    "gpu_memory_total_bytes",
    "gpu_memory_used_bytes",
    "gpu_utilization_ratio",
    "gpu_sm_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_dram_active_ratio",
    "gpu_mig_instance_info",
    "gpu_mig_memory_total_bytes",
    "gpu_mig_memory_used_bytes",
    "gpu_mig_sm_active_ratio",
    "gpu_mig_tensor_active_ratio",
    "gpu_mig_dram_active_ratio",
    "gpu_job_info",
    "gpu_job_memory_used_bytes",
    "gpu_job_sm_utilization_ratio",
    "gpu_job_sm_unattributed_ratio",
    "gpu_job_mps_active_thread_ratio",  # the thread cap an MPS client runs under, as measured
    "gpu_job_duty_cycle_ratio",  # the time a job ran kernels: with its cap, whether the cap held it
    "gpu_topology_info",
    *SERVING_FAMILIES,  # vLLM / SGLang series of a scraped pod (analyzer/serving.py)
    "gpulens_trace_job_requested_gpus",
    "gpulens_trace_job_lifetime_seconds",
    "gpulens_trace_node_gpus",
)

HELP = {
    "gpulens_trace_job_requested_gpus": "GPUs a trace job requested (fractions for shared GPUs)",
    "gpulens_trace_job_lifetime_seconds": "lifetime of a trace job in seconds",
    "gpulens_trace_node_gpus": "GPUs of a trace node",
}

SCHEMA = pa.schema(
    [("timestamp", pa.float64()), ("metric", pa.string()), ("value", pa.float64())]
    + [(label, pa.string()) for label in LABELS]
)


@dataclass
class History:
    """A loaded history: its metadata and the long sample table."""

    path: Path
    meta: dict[str, Any]
    samples: pd.DataFrame
    # per-family frames with only the columns asked for (`read_history(families=...)`); the long
    # table `samples` is then left empty, so 20 M samples need a fraction of the memory
    families: dict[str, pd.DataFrame] | None = None

    @property
    def step_s(self) -> float:
        return float(self.meta["step_s"])

    @property
    def kind(self) -> str:
        """`usage` (time series of GPU use) or `requests` (trace of requests only)."""
        return str(self.meta.get("kind", "usage"))


class HistoryWriter:
    """Streams samples into a history directory; call `close()` (or use `with`) to finish it.

    The history is built in a hidden directory beside `out_dir` and swapped in as a unit when
    `close()` succeeds (`gpulens.atomicfile.replace_directory`). `meta.json` describes
    `samples.parquet` (its rows, families, start and end), so replacing the files one by one could
    leave a new meta beside an old or truncated samples file; swapping the directory means any
    failure (a full disk, a signal, an exception while sampling) leaves the previous history at
    `out_dir` exactly as it was and removes the partial one. Leaving a `with` block by an exception
    aborts instead of closing. Errors name the file and the cause in one line.
    """

    def __init__(self, out_dir: str | Path, meta: Mapping[str, Any], flush_rows: int = 200_000) -> None:
        self.out_dir = Path(out_dir)
        self.meta = dict(meta)
        self.flush_rows = flush_rows
        self._columns: dict[str, list[object]] = {name: [] for name in SCHEMA.names}
        self._rows = 0
        self._families: set[str] = set()
        self._tmin = math.inf
        self._tmax = -math.inf
        # two stacks: the samples file is finished (fsynced) before the directory is swapped in
        self._directory = contextlib.ExitStack()
        self._samples = contextlib.ExitStack()
        try:
            tmp = self._directory.enter_context(atomicfile.replace_directory(self.out_dir, _not_a_history))
        except atomicfile.WriteFailed as exc:
            raise AnalyzerError(str(exc)) from None
        self._tmp = tmp
        self._writer: pq.ParquetWriter | None = None
        try:
            handle = self._samples.enter_context(atomicfile.create_file(tmp / SAMPLES_FILE))
            self._writer = pq.ParquetWriter(handle, SCHEMA, compression="zstd")
        except OSError as exc:
            self._fail(SAMPLES_FILE, exc)

    @property
    def rows(self) -> int:
        """Samples written so far (flushed or buffered)."""
        return self._rows + len(self._columns["timestamp"])

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    def _fail(self, name: str, exc: OSError) -> NoReturn:
        """Discard the partial history and raise one line naming the file and the cause."""
        self.abort()
        cause = exc.strerror or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise AnalyzerError(f"{self.out_dir / name}: cannot write: {cause}") from None

    def abort(self) -> None:
        """Drop the partial history; the previous one (if any) stays at `out_dir`."""
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        failed = AnalyzerError(f"{self.out_dir}: history not written")
        with contextlib.suppress(Exception):
            self._samples.__exit__(AnalyzerError, failed, None)
        self._directory.__exit__(AnalyzerError, failed, None)

    def add(self, timestamp: float, metric: str, value: float, labels: Mapping[str, str]) -> None:
        """One sample; labels outside `LABELS` are dropped, families outside `FAMILIES` rejected."""
        if metric not in FAMILIES:
            raise ValueError(f"family {metric!r} is not part of the history format")
        cols = self._columns
        cols["timestamp"].append(float(timestamp))
        cols["metric"].append(metric)
        cols["value"].append(float(value))
        for label in LABELS:
            cols[label].append(str(labels.get(label, "") or ""))
        self._families.add(metric)
        self._tmin = min(self._tmin, timestamp)
        self._tmax = max(self._tmax, timestamp)
        if len(cols["timestamp"]) >= self.flush_rows:
            self._flush()

    def add_frame(self, frame: pd.DataFrame) -> None:
        """Many samples at once: a frame with timestamp, metric, value and some label columns."""
        frame = frame.copy()
        for label in LABELS:
            if label not in frame:
                frame[label] = ""
            frame[label] = frame[label].fillna("").astype(str)
        unknown = set(frame["metric"].unique()) - set(FAMILIES)
        if unknown:
            raise ValueError(f"families {sorted(unknown)} are not part of the history format")
        self._flush()
        table = pa.Table.from_pandas(frame[list(SCHEMA.names)], schema=SCHEMA, preserve_index=False)
        self._write(table)
        self._rows += len(frame)
        if len(frame):
            self._families.update(frame["metric"].unique())
            self._tmin = min(self._tmin, float(frame["timestamp"].min()))
            self._tmax = max(self._tmax, float(frame["timestamp"].max()))

    def _write(self, table: pa.Table) -> None:
        if self._writer is None:
            raise AnalyzerError(f"{self.out_dir}: the history writer is closed")
        try:
            self._writer.write_table(table)
        except OSError as exc:
            self._fail(SAMPLES_FILE, exc)

    def _flush(self) -> None:
        n = len(self._columns["timestamp"])
        if not n:
            return
        table = pa.Table.from_pydict(self._columns, schema=SCHEMA)
        self._write(table)
        self._rows += n
        self._columns = {name: [] for name in SCHEMA.names}

    def close(self) -> None:
        """Finish samples.parquet, derive metrics.om, write meta.json, swap the directory in."""
        if self._writer is None:
            return
        self._flush()
        writer, self._writer = self._writer, None
        name = SAMPLES_FILE
        try:
            writer.close()
            self._samples.close()  # flush + fsync samples.parquet
            name = OPENMETRICS_FILE
            with atomicfile.create_text(self._tmp / OPENMETRICS_FILE) as out:
                write_openmetrics(self._tmp / SAMPLES_FILE, out)
            meta = {
                "format": FORMAT,
                "version": VERSION,
                "kind": "usage",
                **self.meta,
                "samples": self._rows,
                "families": sorted(self._families),
            }
            if self._rows:
                meta.setdefault("start", self._tmin)
                meta.setdefault("end", self._tmax)
            name = META_FILE
            with atomicfile.create_text(self._tmp / META_FILE) as out:
                out.write(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            self._fail(name, exc)
        except BaseException:
            self.abort()
            raise
        try:
            self._directory.close()  # the swap
        except atomicfile.WriteFailed as exc:
            raise AnalyzerError(str(exc)) from None


def _not_a_history(existing: Path) -> str | None:
    """Why `existing` must not be replaced by a history, or None (empty, or a history itself).

    Replacing swaps the whole directory, so a directory holding anything else (`--out ~`) is
    refused rather than deleted.
    """
    try:
        names = sorted(p.name for p in existing.iterdir() if not atomicfile.is_temp(p))
    except OSError as exc:
        return exc.strerror or str(exc)
    others = [n for n in names if n not in HISTORY_FILES]
    if not others:
        return None
    shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
    return f"exists and holds files that are not part of a history ({shown}); choose a new or empty directory"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    """OpenMetrics float text: NaN and +Inf/-Inf spelled as the format wants."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def write_openmetrics(samples_path: Path, out: TextIO) -> None:
    """Render the Parquet samples as OpenMetrics text, one family at a time, series contiguous."""
    parquet = pq.ParquetFile(samples_path)
    families = set()
    for i in range(parquet.num_row_groups):
        families.update(parquet.read_row_group(i, columns=["metric"]).column(0).unique().to_pylist())
    for family in sorted(families):
        table = pq.read_table(samples_path, filters=[("metric", "=", family)])
        frame = table.to_pandas()
        present = [label for label in LABELS if (frame[label] != "").any()]
        frame = frame.sort_values([*present, "timestamp"], kind="stable")
        out.write(f"# TYPE {family} gauge\n")
        if family in HELP:
            out.write(f"# HELP {family} {HELP[family]}\n")
        for key, series in frame.groupby(present, sort=False) if present else [((), frame)]:
            values = key if isinstance(key, tuple) else (key,)
            pairs = [f'{name}="{_escape(v)}"' for name, v in zip(present, values, strict=True) if v]
            prefix = family + ("{" + ",".join(pairs) + "}" if pairs else "") + " "
            out.writelines(
                f"{prefix}{format_value(v)} {format_value(t)}\n"
                for v, t in zip(series["value"].to_numpy(), series["timestamp"].to_numpy(), strict=True)
            )
    out.write("# EOF\n")


def read_openmetrics(path: Path) -> pd.DataFrame:
    """The long table from an OpenMetrics file with timestamps (input fallback when no Parquet)."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    rows: dict[str, list[object]] = {name: [] for name in SCHEMA.names}
    try:
        for family in text_string_to_metric_families(read_text(path)):
            for sample in family.samples:
                if sample.name not in FAMILIES:
                    continue
                if sample.timestamp is None:
                    raise AnalyzerError(f"{path}: sample of {sample.name} has no timestamp")
                rows["timestamp"].append(float(sample.timestamp))
                rows["metric"].append(sample.name)
                rows["value"].append(float(sample.value))
                for label in LABELS:
                    rows[label].append(sample.labels.get(label, ""))
    except InputError as exc:
        raise AnalyzerError(str(exc)) from exc
    except (ValueError, OSError) as exc:
        raise AnalyzerError(f"{path}: not valid OpenMetrics: {str(exc).splitlines()[0]}") from exc
    return pd.DataFrame(rows)


def write_history(out_dir: str | Path, frame: pd.DataFrame, meta: Mapping[str, Any]) -> Path:
    """Write a whole sample frame as a history (tests and importers)."""
    with HistoryWriter(out_dir, meta) as writer:
        writer.add_frame(frame)
    return Path(out_dir)


# what a row of the long table costs in memory once read: timestamp and value (float64) and a
# dictionary code per label column; Parquet's uncompressed sizes understate it for constant
# columns (a dictionary page of one value stands for any number of rows)
BYTES_PER_ROW = 8 + 8 + 4 * len(LABELS)


@dataclass(frozen=True)
class InputLimits:
    """How much of an input file the analyzer agrees to expand into memory (`--max-samples`,
    `--max-memory`). Checked from the Parquet footer (rows, uncompressed sizes) or the file size
    before anything is read, so a small, highly compressed file cannot expand into many GiB."""

    max_rows: int = 1_000_000_000
    # half of what the process may use: the machine's memory or its cgroup's limit, the smaller
    max_bytes: int = field(default_factory=lambda: usable_memory() // 2)

    def check_parquet(self, path: Path, columns: Iterable[str] | None = None) -> None:
        try:
            metadata = pq.ParquetFile(path).metadata
        except (OSError, pa.ArrowException) as exc:
            raise AnalyzerError(f"{path}: not a readable Parquet file: {_reason(exc)}") from exc
        rows = metadata.num_rows
        if rows > self.max_rows:
            raise AnalyzerError(
                f"{path}: {rows:,} rows, more than the limit of {self.max_rows:,} (--max-samples)"
            )
        wanted = None if columns is None else set(columns)
        stored = 0
        for i in range(metadata.num_row_groups):
            group = metadata.row_group(i)
            for j in range(group.num_columns):
                column = group.column(j)
                if wanted is None or column.path_in_schema in wanted:
                    stored += column.total_uncompressed_size
        need = max(stored, rows * BYTES_PER_ROW)
        if need > self.max_bytes:
            raise AnalyzerError(
                f"{path}: would expand to about {_gib(need)} in memory ({rows:,} rows), more than the "
                f"limit of {_gib(self.max_bytes)} (--max-memory)"
            )

    def check_text(self, path: Path, size: int | None = None) -> None:
        """A text input (CSV, OpenMetrics) costs about its size a few times over once parsed."""
        try:
            size = path.stat().st_size if size is None else size
        except OSError as exc:
            raise AnalyzerError(f"{path}: cannot read: {exc.strerror}") from exc
        if size * TEXT_EXPANSION > self.max_bytes:
            raise AnalyzerError(
                f"{path}: {_gib(size)} of text would need about {_gib(size * TEXT_EXPANSION)} in "
                f"memory, more than the limit of {_gib(self.max_bytes)} (--max-memory)"
            )


TEXT_EXPANSION = 4  # pandas' frame of a numeric CSV is about 2-4x the text


def _gib(n: float) -> str:
    return gib_fixed(n, 2) if n >= 1024**2 else f"{n:,.0f} bytes"


# ceilings no real sample reaches: the largest GPU holds well under 1 TiB, a ratio is 0..1 (a
# little above from rounding), a timestamp is after 1970 and before 2242
MAX_TIMESTAMP = 2.0**33
MAX_MEMORY_BYTES = 2.0**50
RATIO_TOLERANCE = 0.05


def _value_bounds(family: str) -> tuple[float, float] | None:
    if family.endswith("_ratio"):
        return 0.0, 1.0 + RATIO_TOLERANCE
    if family.endswith("_bytes"):
        return 0.0, MAX_MEMORY_BYTES
    if family in ("gpulens_trace_job_requested_gpus", "gpulens_trace_node_gpus"):
        return 0.0, 1024.0
    if family == "gpulens_trace_job_lifetime_seconds":
        return 0.0, MAX_TIMESTAMP
    return None


def check_samples(where: Path, family: str, timestamps: np.ndarray, values: np.ndarray) -> None:
    """One line naming the file, family and column when a sample cannot be real.

    A history is gpulens' own validated format (or a file converted into it), so an impossible
    sample means the file is corrupt or in other units: refused, not dropped. NaN values are gaps.
    """
    ts = np.asarray(timestamps, dtype=float)
    bad = ~(np.isfinite(ts) & (ts >= 0) & (ts <= MAX_TIMESTAMP))
    if bad.any():
        raise AnalyzerError(
            f"{where}: {family}: column timestamp: expected seconds since 1970 (finite, before 2242), "
            f"found {ts[bad][0]!r} ({int(bad.sum())} samples)"
        )
    vs = np.asarray(values, dtype=float)
    bounds = _value_bounds(family)
    with np.errstate(invalid="ignore"):
        if bounds is None:
            bad = np.isinf(vs)
            expected = "a finite number or NaN"
        else:
            lo, hi = bounds
            bad = ~np.isnan(vs) & ~((vs >= lo) & (vs <= hi))
            expected = f"{lo:g}..{hi:g} or NaN"
    if bad.any():
        raise AnalyzerError(
            f"{where}: {family}: column value: expected {expected}, found {vs[bad][0]!r} "
            f"({int(bad.sum())} samples)"
        )


def read_meta(root: Path) -> dict[str, Any]:
    if not root.is_dir():
        raise AnalyzerError(f"{root}: history directory not found")
    meta_path = root / META_FILE
    try:
        meta = load_json_file(meta_path, max_bytes=MAX_META_BYTES)
    except FileNotFoundError as exc:
        raise AnalyzerError(f"{meta_path}: missing (not a gpulens history directory)") from exc
    except InputError as exc:  # not UTF-8, or larger than any meta.json
        raise AnalyzerError(str(exc)) from exc
    except (OSError, ValueError) as exc:
        raise AnalyzerError(f"{meta_path}: not valid JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise AnalyzerError(f'{meta_path}: expected "format": "{FORMAT}"')
    if meta.get("version") != VERSION:
        found = meta.get("version")
        raise AnalyzerError(f"{meta_path}: unsupported history version {found!r}, expected {VERSION}")
    try:
        step = float(meta["step_s"])
    except (KeyError, TypeError, ValueError) as exc:
        raise AnalyzerError(f'{meta_path}: field "step_s" must be a number of seconds') from exc
    if not step > 0:
        raise AnalyzerError(f'{meta_path}: field "step_s" must be positive')
    return meta


def _column_kind(kind: pa.DataType) -> str:
    """What a Parquet column holds, in the words of `check_schema`'s errors."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return "number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "string"
    if pa.types.is_null(kind):
        return "null"
    return str(kind)


def check_schema(path: Path, schema: pa.Schema) -> None:
    """One line naming the file, the column and the type expected when a column has another type.

    `timestamp` and `value` are numbers, `metric` and the labels strings (dictionary-encoded or
    not; a label column of nulls reads as empty). Checked from the footer, before anything is read:
    a label column of lists or structs would otherwise fail deep in Arrow or pandas.
    """
    allowed: tuple[str, ...]
    for name, kind in zip(schema.names, schema.types, strict=True):
        found = _column_kind(kind)
        if name in ("timestamp", "value"):
            expected, allowed = "numbers (float64)", ("number",)
        elif name == "metric":
            expected, allowed = "strings", ("string",)
        elif name in LABELS:
            expected, allowed = "strings", ("string", "null")
        else:
            continue  # other columns are never read
        if found not in allowed:
            raise AnalyzerError(f"{path}: column {name}: expected {expected}, found {found}")
    names = schema.names
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise AnalyzerError(f"{path}: column {twice[0]} appears more than once")


def _read_samples(root: Path, limits: InputLimits) -> tuple[Path, pd.DataFrame]:
    samples_path = root / SAMPLES_FILE
    if samples_path.exists():
        limits.check_parquet(samples_path)
        try:
            check_schema(samples_path, pq.read_schema(samples_path))
        except (OSError, pa.ArrowException) as exc:
            raise AnalyzerError(f"{samples_path}: not a readable Parquet file: {_reason(exc)}") from exc
        try:
            # dictionary-encoded -> categoricals: a third of the memory and CPU for joins and filters
            samples = pq.read_table(samples_path, read_dictionary=["metric", *LABELS]).to_pandas()
        except (OSError, pa.ArrowException) as exc:
            raise AnalyzerError(f"{samples_path}: not a readable Parquet file: {_reason(exc)}") from exc
    elif (root / CSV_FILE).exists():
        samples_path = root / CSV_FILE
        limits.check_text(samples_path)
        try:
            samples = pd.read_csv(samples_path, dtype={label: str for label in LABELS}, keep_default_na=False)
        except (OSError, ValueError, pd.errors.ParserError) as exc:
            raise AnalyzerError(
                f"{samples_path}: not a readable CSV file: {str(exc).splitlines()[0]}"
            ) from exc
        samples["value"] = pd.to_numeric(samples.get("value"), errors="coerce")
    elif (root / OPENMETRICS_FILE).exists():
        samples_path = root / OPENMETRICS_FILE
        limits.check_text(samples_path)
        samples = read_openmetrics(samples_path)
    else:
        raise AnalyzerError(f"{root}: no {SAMPLES_FILE}, {CSV_FILE} or {OPENMETRICS_FILE}")
    return samples_path, samples


def _reason(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _check_columns(samples_path: Path, samples: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in ("timestamp", "metric", "value") if c not in samples]
    if missing:
        raise AnalyzerError(f"{samples_path}: missing columns {missing}")
    for label in LABELS:
        if label not in samples:
            samples[label] = ""
    stamps = samples["timestamp"]
    if not pd.api.types.is_numeric_dtype(stamps):  # CSV: an empty cell is a missing time, refused below
        blank = stamps.astype(str).str.strip() == ""
        converted = pd.to_numeric(stamps.where(~blank, None), errors="coerce")
        if (converted.isna() & ~blank).any():
            raise AnalyzerError(f"{samples_path}: columns timestamp and value must be numbers")
        samples["timestamp"] = converted
    try:
        samples["timestamp"] = samples["timestamp"].astype(float)
        samples["value"] = samples["value"].astype(float)
    except (TypeError, ValueError) as exc:
        raise AnalyzerError(f"{samples_path}: columns timestamp and value must be numbers") from exc
    for family, rows in samples.groupby("metric", sort=False, observed=True):
        check_samples(samples_path, str(family), rows["timestamp"].to_numpy(), rows["value"].to_numpy())
    return samples


def _sole_family(metadata: pq.FileMetaData, group: int, metric: int) -> str | None:
    """The one family a row group holds by its footer statistics (min = max, no nulls), or None.

    Writers that write a family at a time (the bench, importers) leave such row groups; reading
    one needs only that family's columns and no filter over the metric column.
    """
    stats = metadata.row_group(group).column(metric).statistics
    if stats is None or not stats.has_min_max or not stats.has_null_count or stats.null_count:
        return None
    low, high = stats.min, stats.max
    return low if isinstance(low, str) and low == high else None


def _only(metric: pa.ChunkedArray, family: str) -> bool:
    """Whether every value of a dictionary-encoded metric column is `family` (checks the footer)."""
    return all(
        isinstance(chunk, pa.DictionaryArray)
        and chunk.null_count == 0
        and set(chunk.dictionary.to_pylist()) <= {family}
        for chunk in metric.chunks
    )


def _in_window(
    table: pa.Table, bounds: tuple[float, float] | None, start: float | None, end: float | None
) -> pa.Table:
    """Rows with start < timestamp <= end; untouched when the footer's range lies inside."""
    if start is None and end is None:
        return table
    low = -math.inf if start is None else start
    high = math.inf if end is None else end
    if bounds is not None and bounds[0] > low and bounds[1] <= high:
        return table
    ts = pc.cast(table.column("timestamp"), pa.float64())
    keep = pc.greater(ts, low)
    if end is not None:
        keep = pc.and_(keep, pc.less_equal(ts, end))
    return table.filter(keep)


def _time_bounds(metadata: pq.FileMetaData, group: int, column: int) -> tuple[float, float] | None:
    stats = metadata.row_group(group).column(column).statistics
    if stats is None or not stats.has_min_max or stats.null_count:
        return None
    try:
        return float(stats.min), float(stats.max)
    except (TypeError, ValueError):
        return None


def _split_by_metric(table: pa.Table, wanted: Mapping[str, list[str]]) -> dict[str, pa.Table]:
    """The rows of each wanted family in a mixed row group, by dictionary code (no string compares)."""
    metric = table.column("metric")
    out: dict[str, pa.Table] = {}
    offset = 0
    for chunk in metric.chunks:
        if not isinstance(chunk, pa.DictionaryArray):
            chunk = chunk.dictionary_encode()
        part = table.slice(offset, len(chunk))
        offset += len(chunk)
        codes = chunk.indices.to_numpy(zero_copy_only=False)
        valid = chunk.is_valid().to_numpy(zero_copy_only=False) if chunk.null_count else None
        names = chunk.dictionary.to_pylist()
        for name in dict.fromkeys(n for n in names if n in wanted):
            # every code of the name at once, so the rows keep their order in the file
            mask = np.isin(codes, [k for k, n in enumerate(names) if n == name])
            rows = np.flatnonzero(mask if valid is None else mask & valid)
            if len(rows):
                out.setdefault(name, []).append(part.take(rows).select(wanted[name]))
    return {name: pa.concat_tables(parts) for name, parts in out.items()}


@contextlib.contextmanager
def _reading_pool() -> Iterator[None]:
    """Arrow's jemalloc pool while a history is read, the previous default pool restored after.

    pyarrow's default pool (mimalloc) returns freed pages to the system eagerly: reading 20 M
    samples one row group at a time then page-faulted the decompression buffers back in again and
    again (4-6 s of system time and 1.5 GB peak RSS for 750 MB of columns); jemalloc reuses them
    (0.5 s, 0.9 GB). Buffers remember their pool, so tables read here are freed correctly later.
    """
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc: keep its default
        yield
        return
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def _stream_families(
    samples_path: Path,
    families: Mapping[str, Iterable[str]],
    start: float | None,
    end: float | None,
    progress: TextIO | None,
    limits: InputLimits,
) -> dict[str, pd.DataFrame]:
    """Per-family frames read one row group at a time, keeping only the wanted rows and columns.

    A row group whose footer says it holds one family is read with that family's columns only
    (and skipped when the family is not wanted); a mixed one is read with every wanted column and
    split by the metric's dictionary codes. Label columns stay dictionary-encoded (categoricals):
    peak memory is about the size of the kept columns, not of the whole long table.
    """
    try:
        parquet = pq.ParquetFile(samples_path)
        check_schema(samples_path, parquet.schema_arrow)
        present = set(parquet.schema_arrow.names)
        missing = [c for c in ("timestamp", "metric", "value") if c not in present]
        if missing:
            raise AnalyzerError(f"{samples_path}: missing columns {missing}")
        wanted = {family: ["timestamp", "value", *labels] for family, labels in families.items()}
        readable = {family: [c for c in cols if c in present] for family, cols in wanted.items()}
        columns = sorted({c for cols in readable.values() for c in cols} | {"metric"})
        limits.check_parquet(samples_path, columns)
        dictionary = [c for c in columns if c in LABELS or c == "metric"]
        parquet = pq.ParquetFile(samples_path, read_dictionary=dictionary)
        metadata = parquet.metadata
        names = parquet.schema_arrow.names
        metric_at, time_at = names.index("metric"), names.index("timestamp")
        parts: dict[str, list[pa.Table]] = {family: [] for family in families}
        groups = parquet.num_row_groups
        for i in range(groups):
            bounds = _time_bounds(metadata, i, time_at)
            family = _sole_family(metadata, i, metric_at)
            table = None
            if family is not None:
                if family not in wanted:
                    table = parquet.read_row_group(i, columns=["metric"])
                    if _only(table.column("metric"), family):
                        table = None  # a family the profile does not read
                        family = ""
                else:
                    table = parquet.read_row_group(i, columns=[*readable[family], "metric"])
                    if _only(table.column("metric"), family):
                        rows = _in_window(table, bounds, start, end).select(readable[family])
                        if rows.num_rows:
                            parts[family].append(rows)
                        family = ""
            if family != "":  # mixed, or the footer did not match the column
                table = _in_window(parquet.read_row_group(i, columns=columns), bounds, start, end)
                for name, rows in _split_by_metric(table, readable).items():
                    parts[name].append(rows)
            del table
            if progress is not None and (i + 1) % max(1, groups // 10) == 0:
                print(f"gpulens: reading {samples_path.name}: {i + 1}/{groups} row groups", file=progress)
    except (OSError, pa.ArrowException) as exc:
        raise AnalyzerError(f"{samples_path}: not a readable Parquet file: {_reason(exc)}") from exc
    out: dict[str, pd.DataFrame] = {}
    for family, cols in wanted.items():
        if not parts[family]:
            continue
        table = (
            pa.concat_tables(parts[family], promote_options="default").unify_dictionaries().combine_chunks()
        )
        parts[family] = []
        frame = table.to_pandas()
        del table
        for column in cols:
            if column not in frame:
                frame[column] = pd.Categorical.from_codes(np.zeros(len(frame), dtype=np.int8), [""])
        try:
            frame["timestamp"] = frame["timestamp"].astype(float)
            frame["value"] = frame["value"].astype(float)
        except (TypeError, ValueError) as exc:
            raise AnalyzerError(f"{samples_path}: columns timestamp and value must be numbers") from exc
        check_samples(samples_path, family, frame["timestamp"].to_numpy(), frame["value"].to_numpy())
        out[family] = frame[cols]
    return out


def read_history(
    path: str | Path,
    start: float | None = None,
    end: float | None = None,
    families: Mapping[str, Iterable[str]] | None = None,
    progress: TextIO | None = None,
    limits: InputLimits | None = None,
) -> History:
    """Load a history directory, optionally limited to samples with start < t <= end.

    With `families` (family -> label columns), a usage history comes back as `History.families`:
    one frame per family with timestamp, value and those labels, streamed from Parquet row group
    by row group (bounded memory); `samples` is then empty. Inputs larger than `limits` are refused
    before they are read; impossible samples (an infinite timestamp, a 1e30-byte memory value) are
    refused with one line naming the file, family and column.
    """
    limits = InputLimits() if limits is None else limits
    root = Path(path)
    meta = read_meta(root)
    kind = str(meta.get("kind", "usage"))
    if families is not None and kind == "usage" and (root / SAMPLES_FILE).exists():
        with _reading_pool():
            fams = _stream_families(root / SAMPLES_FILE, families, start, end, progress, limits)
        empty = pd.DataFrame(
            {
                name: pd.Series(dtype=float if name in ("timestamp", "value") else object)
                for name in SCHEMA.names
            }
        )
        return History(root, meta, empty, fams)
    samples_path, samples = _read_samples(root, limits)
    samples = _check_columns(samples_path, samples)
    if start is not None:
        samples = samples[samples["timestamp"] > start]
    if end is not None:
        samples = samples[samples["timestamp"] <= end]
    history = History(root, meta, samples.reset_index(drop=True))
    if families is not None and kind == "usage":
        history.families = {
            str(name): frame[["timestamp", "value", *families[str(name)]]]
            for name, frame in history.samples.groupby("metric", sort=False, observed=True)
            if str(name) in families
        }
    return history
