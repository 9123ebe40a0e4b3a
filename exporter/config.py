"""The exporter's configuration: one frozen record built from flags and `GPULENS_*` variables.

`cli.py` parses; this module holds the record, its defaults and the checks whose failure is a
user error (`ConfigError`, one line naming the flag or file and what was expected).
"""

from __future__ import annotations

import fnmatch
import math
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpulens.exporter.attribution.mps_control import DEFAULT_COMMAND
from gpulens.exporter.attribution.procfs import parse_pipe_dir
from gpulens.exporter.compat import HELP as COMPAT_HELP
from gpulens.exporter.compat import CompatError, CompatSpec, parse_compat

# shared with the receiver (one set of conventions for both servers), re-exported for the exporter
from gpulens.serverflags import LOG_FORMAT_ALIASES as LOG_FORMAT_ALIASES
from gpulens.serverflags import LOG_FORMATS as LOG_FORMATS
from gpulens.serverflags import LOG_LEVELS as LOG_LEVELS
from gpulens.serverflags import ConfigError as ConfigError
from gpulens.serverflags import parse_listen as parse_listen
from gpulens.settings import (
    at_least,
    check,
    existing_directory,
    existing_file,
    http_url,
    setting,
    telemetry_path,
)

DEFAULT_PORT = 9842
DEFAULT_LISTEN = f":{DEFAULT_PORT}"
DEFAULT_TELEMETRY_PATH = "/metrics"
DEFAULT_MAX_REQUESTS = 40  # exporter-toolkit's default; 0 means no limit
DEFAULT_MAX_CONNECTIONS = 512  # also capped at half the open-files limit (gpulens.httpd)
RESERVED_PATHS = ("/", "/-/healthy", "/-/ready")
PROFILING_MODES = ("auto", "dcgm", "gpm", "off")
MUST_BE = "must be >="  # the exporter's phrasing of a lower bound (the receiver's: "expected at least")

# samples between reads of the slow tier (backends/nvml.py SLOW_FIELDS): 12 x the default 5 s = 1 min
DEFAULT_SLOW_EVERY = 12
DEFAULT_POD_LOGS = Path("/var/log/pods")
DEFAULT_MPS_CONTROL: tuple[str, ...] = DEFAULT_COMMAND


def _positive(unit: str) -> Callable[[float], str | None]:
    def problem(value: float) -> str | None:
        return None if 0 < value < math.inf else f"must be > 0{unit} and finite, got {value:g}"

    return problem


def _interval(value: float) -> str | None:
    if not 0 < value < math.inf:
        return f"must be > 0 seconds and finite, got {value:g}"
    return None if value >= 0.1 else f"must be >= 0.1 s (GPM needs 100 ms windows), got {value:g}"


def _listen(value: str) -> str | None:
    try:
        parse_listen(value)
    except ConfigError as exc:
        return str(exc).partition(": ")[2]
    return None


def _not_a_file(value: Path | None) -> str | None:
    """A directory that may not exist yet (created by the job scheduler later), but not a file."""
    if value is None or not value.exists() or value.is_dir():
        return None
    return f"{value} is not a directory"


def _pipe_dir(value: str) -> str | None:
    """`--mps-pipe-dir`: unset, or an absolute path that may not exist yet (the node's MPS control
    daemon creates it when it starts) but is not a file."""
    if not value:
        return None
    if parse_pipe_dir(value) != value:
        return f"expected an absolute path of at most 256 characters without `..`, got {value!r}"
    return _not_a_file(Path(value))


def _words(raw: str) -> tuple[str, ...]:
    """A command line split as a shell would (no expansion); ValueError on an open quote."""
    return tuple(shlex.split(raw))


def _globs(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _family_globs(patterns: tuple[str, ...]) -> str | None:
    for pattern in patterns:
        if not pattern or not all(c.isalnum() or c in "_:*?[]!" for c in pattern):
            return f"expected metric family names or globs (gpu_*), got {pattern!r}"
    return None


def _compat(value: str) -> str | None:
    try:
        parse_compat(value)
    except CompatError as exc:
        return str(exc).partition(": ")[2] or str(exc)
    return None


def _dcgm_address(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        _check_dcgm_address(value)
    except ConfigError as exc:
        return str(exc).partition(": ")[2]
    return None


SECONDS = {"metavar": "SECONDS", "parse": float, "expected": "a number of seconds"}
COUNT = {"metavar": "N", "parse": int, "expected": "a whole number"}


@dataclass(frozen=True)
class ExporterConfig:
    """Every exporter setting, declared once: its flag, aliases, help and check are the field's
    metadata (`gpulens.settings`), from which `cli.py` builds the parser and the environment
    fallbacks and docs/exporter.md's flag table is generated (tests/exporter/test_flag_docs.py)."""

    listen: str = field(
        default=DEFAULT_LISTEN,
        metadata=setting(
            flag="--web.listen-address",
            aliases=("--listen",),
            metavar="[HOST]:PORT",
            help="address; an empty host listens on all interfaces (IPv4 and IPv6)",
            check=_listen,
        ),
    )
    telemetry_path: str = field(
        default=DEFAULT_TELEMETRY_PATH,
        metadata=setting(
            flag="--web.telemetry-path",
            metavar="PATH",
            help="where the metrics are served",
            check=telemetry_path(RESERVED_PATHS, "(landing page or health)"),
        ),
    )
    # concurrent scrapes served; more get 503 (0: no limit)
    max_requests: int = field(
        default=DEFAULT_MAX_REQUESTS,
        metadata=setting(
            flag="--web.max-requests",
            **COUNT,
            help="most requests handled at once (an answer being sent holds no slot; `/-/healthy` and "
            "`/-/ready` take none); more are answered 503 at once instead of queueing (0: no limit)",
            check=at_least(0, " (0: no limit)", wording=MUST_BE),
        ),
    )
    max_connections: int = field(
        default=DEFAULT_MAX_CONNECTIONS,
        metadata=setting(
            flag="--web.max-connections",
            **COUNT,
            help="open connections; beyond it the one idle the longest is closed (connections that "
            "never completed a request first); capped at half the open-files limit",
            check=at_least(1, wording=MUST_BE),
        ),
    )
    web_config_file: Path | None = field(
        default=None,
        metadata=setting(
            flag="--web.config.file",
            aliases=("--web.config-file",),
            metavar="FILE",
            parse=Path,
            help="TLS, basic auth and response headers (below); re-read on SIGHUP",
            check=existing_file,
        ),
    )
    log_level: str = field(
        default="info",
        metadata=setting(
            flag="--log.level",
            aliases=("--log-level",),
            metavar="debug|info|warn|error",
            choices=LOG_LEVELS,
            help="logs go to stderr",
        ),
    )
    log_format: str = field(
        default="logfmt",
        metadata=setting(
            flag="--log.format",
            aliases=("--log-format",),
            metavar="logfmt|json",
            choices=LOG_FORMATS,
            value_aliases=tuple(LOG_FORMAT_ALIASES.items()),
            help='`time=… level=… logger=… msg="…"`, or the same keys as one JSON object per line '
            "(`text` is the earlier name of logfmt, deprecated)",
        ),
    )
    disable_exporter_metrics: bool = field(
        default=False,
        metadata=setting(
            flag="--web.disable-exporter-metrics",
            help="leave out the `process_*` and `python_*` self-metrics (docs/metrics.md)",
        ),
    )
    interval: float = field(
        default=5.0,
        metadata=setting(flag="--interval", **SECONDS, help="sampling interval (≥ 0.1)", check=_interval),
    )
    # deadline for one GPU's reads in a sample (capped below the interval)
    nvml_timeout: float = field(
        default=2.0,
        metadata=setting(
            flag="--nvml.timeout",
            **SECONDS,
            help="deadline for one GPU's reads in a sample; slower GPUs are reported down",
            check=_positive(" seconds"),
        ),
    )
    # the slow tier (limits, thresholds, modes, PCIe link, aggregate ECC) is read on every Nth sample
    slow_every: int = field(
        default=DEFAULT_SLOW_EVERY,
        metadata=setting(
            flag="--nvml.slow-fields-every",
            **COUNT,
            help="read the slow tier (below) on every Nth sample only, repeating its last values in "
            "between; 1 reads everything every sample",
            check=at_least(1, " (1: every sample)", wording=MUST_BE),
        ),
    )
    simulate: str | None = field(
        default=None,
        metadata=setting(
            flag="--simulate",
            metavar="SCENARIO",
            help="serve a simulated node: a built-in scenario (`gpulens sim list`) or a scenario YAML "
            "file (docs/simulator.md)",
        ),
    )
    sim_seed: int = field(default=0, metadata=setting(flag="--sim-seed", **COUNT, help="simulation seed"))
    sim_speed: float = field(
        default=1.0,
        metadata=setting(
            flag="--sim-speed",
            metavar="X",
            parse=float,
            expected="a number",
            help="simulated seconds per real second",
            check=_positive(""),
        ),
    )
    # None: /proc, or the simulated node's procfs root
    procfs: Path | None = field(
        default=None,
        metadata=setting(
            flag="--path.procfs",
            aliases=("--procfs",),
            metavar="DIR",
            parse=Path,
            default_doc="`/proc` (simulated: the node's fake procfs)",
            help="where process cgroups/environments are read (node_exporter's name)",
            check=existing_directory,
        ),
    )
    job_mapping_dir: Path | None = field(
        default=None,
        metadata=setting(
            flag="--job-mapping-dir",
            metavar="DIR",
            parse=Path,
            default_doc="none (simulated: the node's mapping dir)",
            help="dcgm-exporter / jobstats mapping files",
            check=_not_a_file,
        ),
    )
    # directory entries read; beyond, one log line (mapping_dir.py)
    job_mapping_max_files: int = field(
        default=10_000,
        metadata=setting(
            flag="--job-mapping-max-files",
            **COUNT,
            help="most entries of the mapping directory read; past it one line is logged and the rest "
            "ignored (docs/attribution.md)",
            check=at_least(1, wording=MUST_BE),
        ),
    )
    pod_resources_socket: Path | None = field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        metadata=setting(
            flag="--pod-resources-socket", metavar="PATH", parse=Path, help="kubelet pod-resources API"
        ),
    )
    pod_logs_dir: Path = field(
        default=DEFAULT_POD_LOGS,
        metadata=setting(
            flag="--pod-logs-dir",
            metavar="DIR",
            parse=Path,
            default_doc="`/var/log/pods` (simulated: the node's fake one)",
            help="pod names from log directory names",
        ),
    )
    attribution_procfs: bool = field(
        default=True,
        metadata=setting(
            flag="--no-attribution.procfs",
            negated=True,
            help="disable process cgroup/environment attribution",
        ),
    )
    attribution_mapping: bool = field(
        default=True,
        metadata=setting(flag="--no-attribution.mapping", negated=True, help="disable job mapping files"),
    )
    attribution_kubernetes: bool = field(
        default=True,
        metadata=setting(
            flag="--no-attribution.kubernetes", negated=True, help="disable kubelet pod-resources attribution"
        ),
    )
    # the control client asked for MPS clients' caps (exporter/attribution/mps_control.py)
    mps_control: tuple[str, ...] = field(
        default=DEFAULT_MPS_CONTROL,
        metadata=setting(
            flag="--mps-control",
            metavar="COMMAND",
            parse=_words,
            expected="a command line (shell words, quotes closed)",
            default_doc="`nvidia-cuda-mps-control` (simulated: the simulator's stand-in)",
            help="MPS control client asked what active-thread percentage MPS clients' servers run "
            "under; empty: not asked ([docs/attribution.md](attribution.md#mps-thread-caps))",
        ),
    )
    # an MPS client whose own view the exporter cannot reach (its environ or /proc/<pid>/root
    # refused) is asked through this daemon (exporter/attribution/mps_control.py)
    mps_pipe_dir: str = field(
        default="",
        metadata=setting(
            flag="--mps-pipe-dir",
            metavar="DIR",
            default_doc="unset (Helm: the device plugin's `<mps root>/nvidia.com/gpu/pipe`)",
            check=_pipe_dir,
            help="the node's MPS control daemon's pipe directory as the exporter sees it, asked for "
            "MPS clients whose own environment or root cannot be read "
            "([docs/attribution.md](attribution.md#mps-thread-caps))",
        ),
    )
    # DRA devices named only by (driver, pool, device) get their GPU UUID from the node's
    # ResourceSlices (exporter/attribution/resourceslices.py): the exporter's only API-server call
    kubernetes_api_url: str = field(
        default="",
        metadata=setting(
            flag="--kubernetes.api-url",
            metavar="URL",
            default_doc="in-cluster, when a service-account token is mounted",
            check=http_url(" of the API server"),
            help="API server whose ResourceSlices name DRA-allocated GPUs "
            "([docs/attribution.md](attribution.md#dynamic-resource-allocation-dra))",
        ),
    )
    kubernetes_token_file: Path | None = field(
        default=None,
        metadata=setting(
            flag="--kubernetes.token-file",
            metavar="PATH",
            parse=Path,
            default_doc="the service-account token with the in-cluster URL",
            help="bearer token for `--kubernetes.api-url` (re-read on every call)",
        ),
    )
    kubernetes_ca_file: Path | None = field(
        default=None,
        metadata=setting(
            flag="--kubernetes.ca-file",
            metavar="PATH",
            parse=Path,
            default_doc="the service-account CA with the in-cluster URL, else the system's",
            help="CA bundle for an https `--kubernetes.api-url`",
        ),
    )
    kubernetes_node_name: str = field(
        default="",
        metadata=setting(
            flag="--kubernetes.node-name",
            metavar="NAME",
            default_doc="`$NODE_NAME`",
            help="this node's name, whose ResourceSlices are read; none: no ResourceSlice lookups",
        ),
    )
    profiling: str = field(
        default="auto",
        metadata=setting(
            flag="--profiling",
            metavar="auto|dcgm|gpm|off",
            choices=PROFILING_MODES,
            help="auto: DCGM if its host engine is reachable, else GPM where the GPU supports it "
            "(Hopper+), else only NVML utilization; `off` skips profiling reads ([docs/dcgm.md](dcgm.md))",
        ),
    )
    # directory with DCGM's pydcgm.py (None: the standard paths)
    dcgm_bindings: Path | None = field(
        default=None,
        metadata=setting(
            flag="--dcgm-bindings",
            metavar="PATH",
            parse=Path,
            default_doc="DCGM 4, then DCGM 3 install path",
            help="directory of DCGM's Python bindings",
            check=existing_directory,
        ),
    )
    # nv-hostengine "host[:port]" or "unix:///path"; None: embedded
    dcgm_address: str | None = field(
        default=None,
        metadata=setting(
            flag="--dcgm-address",
            metavar="ADDR",
            default_doc="embedded host engine",
            help="standalone nv-hostengine, `HOST[:PORT]` or `unix:///PATH`",
            check=_dcgm_address,
        ),
    )
    # "dcgm[=<version>]" and/or "jobstats", comma-separated (see compat.py)
    compat: str = field(
        default="",
        metadata=setting(
            flag="--compat",
            metavar="MODE[,MODE]",
            default_doc="off",
            help=COMPAT_HELP,
            check=_compat,
        ),
    )
    # None: the defaults; empty: only the exporter's own metrics (cli.py: --collector.<name>)
    collectors: frozenset[str] | None = None
    processes_max: int = field(
        default=100,
        metadata=setting(
            flag="--collector.processes.max",
            **COUNT,
            help="most per-process series",
            check=at_least(0, wording=MUST_BE),
        ),
    )
    # per-link NVLink counters instead of per-GPU sums
    nvlink_per_link: bool = field(
        default=False,
        metadata=setting(
            flag="--collector.pcie_nvlink.per-link",
            help="NVLink byte and error counters per link (default: summed per GPU; link state stays "
            "per link)",
        ),
    )
    metrics_allow: tuple[str, ...] = field(
        default=(),
        metadata=setting(
            flag="--metrics.allow",
            metavar="GLOB[,GLOB]",
            parse=_globs,
            default_doc="all",
            help="serve only these metric families (e.g. `gpu_memory_*,gpu_power_watts`); the "
            "exporter's own `gpulens_*` always",
            check=_family_globs,
        ),
    )
    metrics_deny: tuple[str, ...] = field(
        default=(),
        metadata=setting(
            flag="--metrics.deny",
            metavar="GLOB[,GLOB]",
            parse=_globs,
            default_doc="none",
            help="never serve these metric families (e.g. `gpu_clock_event_*`)",
            check=_family_globs,
        ),
    )
    # (old name, new name) of deprecated flags and variables used; logged once at start
    deprecated: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def compat_spec(self) -> CompatSpec:
        """The parsed `compat` value (validate() has checked that it parses)."""
        return parse_compat(self.compat)

    def serves_family(self, name: str, exposed: str) -> bool:
        """Whether the allow/deny lists let a family through; `exposed` is its name on the wire
        (`<name>_total` for a counter). The exporter's own `gpulens_*` families ignore the allow
        list (they say whether the exporter works) but obey the deny list."""
        names = (name, exposed)
        if any(fnmatch.fnmatchcase(n, p) for p in self.metrics_deny for n in names):
            return False
        if not self.metrics_allow or name.startswith("gpulens_"):
            return True
        return any(fnmatch.fnmatchcase(n, p) for p in self.metrics_allow for n in names)

    def read_deadline(self) -> float:
        """Seconds one GPU's reads may take before the GPU is reported hung."""
        return max(0.05, min(self.nvml_timeout, self.interval * 0.8))


def validate(config: ExporterConfig, given_as: Mapping[str, str] | None = None) -> ExporterConfig:
    """Check every setting (its declared check); returns the config unchanged or raises ConfigError
    naming the flag (or the alias or variable it was given as: `given_as`)."""
    check(config, given_as)
    return config


def _check_dcgm_address(address: str) -> None:
    """`host`, `host:port` or `unix:///absolute/path` (what nv-hostengine listens on)."""
    if address.startswith("unix://"):
        if not address[len("unix://") :].startswith("/"):
            raise ConfigError(f"--dcgm-address: expected unix:///absolute/path, got {address!r}")
        return
    host, sep, port = address.removeprefix("tcp://").rpartition(":")
    if not sep:
        host, port = port, "5555"
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"--dcgm-address: expected HOST[:PORT] or unix:///PATH, got {address!r}")
