"""The exporter's configuration: one frozen record built from flags and `GPULENS_*` variables.

`cli.py` parses; this module holds the record, its defaults and the checks whose failure is a
user error (`ConfigError`, one line naming the flag or file and what was expected).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from gpulens.exporter.compat import CompatError, CompatSpec, parse_compat

# shared with the receiver (one set of conventions for both servers), re-exported for the exporter
from gpulens.serverflags import LOG_FORMAT_ALIASES as LOG_FORMAT_ALIASES
from gpulens.serverflags import LOG_FORMATS as LOG_FORMATS
from gpulens.serverflags import LOG_LEVELS as LOG_LEVELS
from gpulens.serverflags import ConfigError as ConfigError
from gpulens.serverflags import parse_listen as parse_listen

DEFAULT_PORT = 9842
DEFAULT_LISTEN = f":{DEFAULT_PORT}"
DEFAULT_TELEMETRY_PATH = "/metrics"
DEFAULT_MAX_REQUESTS = 40  # exporter-toolkit's default; 0 means no limit
DEFAULT_MAX_CONNECTIONS = 512  # also capped at half the open-files limit (gpulens.httpd)
RESERVED_PATHS = ("/", "/-/healthy", "/-/ready")
PROFILING_MODES = ("auto", "dcgm", "gpm", "off")

# samples between reads of the slow tier (backends/nvml.py SLOW_FIELDS): 12 x the default 5 s = 1 min
DEFAULT_SLOW_EVERY = 12


@dataclass(frozen=True)
class ExporterConfig:
    listen: str = DEFAULT_LISTEN
    interval: float = 5.0
    nvml_timeout: float = 2.0  # deadline for one GPU's reads in a sample (capped below the interval)
    # the slow tier (limits, thresholds, modes, PCIe link, aggregate ECC) is read on every Nth sample
    slow_every: int = DEFAULT_SLOW_EVERY
    simulate: str | None = None
    sim_seed: int = 0
    sim_speed: float = 1.0
    procfs: Path | None = None  # None: /proc, or the simulated node's procfs root
    job_mapping_dir: Path | None = None
    job_mapping_max_files: int = 10_000  # directory entries read; beyond, one log line (mapping_dir.py)
    pod_resources_socket: Path | None = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    pod_logs_dir: Path = Path("/var/log/pods")
    attribution_procfs: bool = True
    attribution_mapping: bool = True
    attribution_kubernetes: bool = True
    log_level: str = "info"
    log_format: str = "logfmt"
    web_config_file: Path | None = None
    telemetry_path: str = DEFAULT_TELEMETRY_PATH
    max_requests: int = DEFAULT_MAX_REQUESTS  # concurrent scrapes served; more get 503 (0: no limit)
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # open connections; the oldest idle closed beyond
    disable_exporter_metrics: bool = False  # True: no process_* / python_* self-metrics
    collectors: frozenset[str] | None = None  # None: the defaults; empty: only the exporter's own metrics
    processes_max: int = 100
    profiling: str = "auto"
    dcgm_bindings: Path | None = None  # directory with DCGM's pydcgm.py (None: the standard paths)
    dcgm_address: str | None = None  # nv-hostengine "host[:port]" or "unix:///path"; None: embedded
    compat: str = ""  # "dcgm[=<version>]" and/or "jobstats", comma-separated (see compat.py)
    nvlink_per_link: bool = False  # per-link NVLink counters instead of per-GPU sums
    metrics_allow: tuple[str, ...] = ()  # family name globs to serve (empty: all)
    metrics_deny: tuple[str, ...] = ()  # family name globs never served

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


def validate(config: ExporterConfig) -> ExporterConfig:
    """Check values argparse cannot; returns the config unchanged or raises ConfigError."""
    parse_listen(config.listen)
    if not config.interval > 0:
        raise ConfigError(f"--interval: must be > 0 seconds, got {config.interval}")
    if config.interval < 0.1:
        raise ConfigError(f"--interval: must be >= 0.1 s (GPM needs 100 ms windows), got {config.interval}")
    if not config.nvml_timeout > 0:
        raise ConfigError(f"--nvml.timeout: must be > 0 seconds, got {config.nvml_timeout}")
    if config.slow_every < 1:
        raise ConfigError(
            f"--nvml.slow-fields-every: must be >= 1 (1: every sample), got {config.slow_every}"
        )
    if not config.sim_speed > 0:
        raise ConfigError(f"--sim-speed: must be > 0, got {config.sim_speed}")
    if config.log_level not in LOG_LEVELS:
        raise ConfigError(f"--log.level: expected one of {', '.join(LOG_LEVELS)}, got {config.log_level!r}")
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(f"--log.format: expected logfmt or json, got {config.log_format!r}")
    _check_telemetry_path(config.telemetry_path)
    if config.max_requests < 0:
        raise ConfigError(f"--web.max-requests: must be >= 0 (0: no limit), got {config.max_requests}")
    if config.max_connections < 1:
        raise ConfigError(f"--web.max-connections: must be >= 1, got {config.max_connections}")
    for flag, patterns in (
        ("--metrics.allow", config.metrics_allow),
        ("--metrics.deny", config.metrics_deny),
    ):
        for pattern in patterns:
            if not pattern or not all(c.isalnum() or c in "_:*?[]!" for c in pattern):
                raise ConfigError(f"{flag}: expected metric family names or globs (gpu_*), got {pattern!r}")
    if config.profiling not in PROFILING_MODES:
        raise ConfigError(
            f"--profiling: expected one of {', '.join(PROFILING_MODES)}, got {config.profiling!r}"
        )
    try:
        parse_compat(config.compat)
    except CompatError as exc:
        raise ConfigError(str(exc)) from None
    if config.dcgm_bindings is not None and not config.dcgm_bindings.is_dir():
        raise ConfigError(f"--dcgm-bindings: {config.dcgm_bindings} is not a directory")
    if config.dcgm_address is not None:
        _check_dcgm_address(config.dcgm_address)
    if config.processes_max < 0:
        raise ConfigError(f"--collector.processes.max: must be >= 0, got {config.processes_max}")
    if config.procfs is not None and not config.procfs.is_dir():
        raise ConfigError(f"--procfs: {config.procfs} is not a directory")
    if (
        config.job_mapping_dir is not None
        and config.job_mapping_dir.exists()
        and not config.job_mapping_dir.is_dir()
    ):
        raise ConfigError(f"--job-mapping-dir: {config.job_mapping_dir} is not a directory")
    if config.job_mapping_max_files < 1:
        raise ConfigError(f"--job-mapping-max-files: must be >= 1, got {config.job_mapping_max_files}")
    if config.web_config_file is not None and not config.web_config_file.is_file():
        raise ConfigError(f"--web.config.file: {config.web_config_file} does not exist")
    return config


def _check_telemetry_path(path: str) -> None:
    """An absolute URL path of printable characters that no other endpoint uses."""
    if not path.startswith("/") or not path.isprintable() or any(c in path for c in " ?#"):
        raise ConfigError(f"--web.telemetry-path: expected an absolute URL path like /metrics, got {path!r}")
    if path in RESERVED_PATHS:
        raise ConfigError(f"--web.telemetry-path: {path} is already served (landing page or health)")


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
