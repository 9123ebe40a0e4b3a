"""The exporter's configuration: one frozen record built from flags and `GPULENS_*` variables.

`cli.py` parses; this module holds the record, its defaults and the checks whose failure is a
user error (`ConfigError`, one line naming the flag or file and what was expected).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 9842
DEFAULT_LISTEN = f":{DEFAULT_PORT}"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
PROFILING_MODES = ("auto", "dcgm", "gpm", "off")
COMPAT_MODES = ("dcgm",)


class ConfigError(ValueError):
    """A bad flag, variable or file; `str()` is one line naming it."""


@dataclass(frozen=True)
class ExporterConfig:
    listen: str = DEFAULT_LISTEN
    interval: float = 5.0
    nvml_timeout: float = 2.0  # deadline for one GPU's reads in a sample (capped below the interval)
    simulate: str | None = None
    sim_seed: int = 0
    sim_speed: float = 1.0
    procfs: Path | None = None  # None: /proc, or the simulated node's procfs root
    job_mapping_dir: Path | None = None
    pod_resources_socket: Path | None = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    pod_logs_dir: Path = Path("/var/log/pods")
    attribution_procfs: bool = True
    attribution_mapping: bool = True
    attribution_kubernetes: bool = True
    log_level: str = "info"
    log_format: str = "text"
    web_config_file: Path | None = None
    collectors: frozenset[str] | None = None  # None: the defaults; empty: only the exporter's own metrics
    processes_max: int = 100
    profiling: str = "auto"
    dcgm_bindings: Path | None = None  # directory with DCGM's pydcgm.py (None: the standard paths)
    dcgm_address: str | None = None  # nv-hostengine "host[:port]" or "unix:///path"; None: embedded
    compat: str = ""  # "dcgm": also emit dcgm-exporter's names, units and labels

    def read_deadline(self) -> float:
        """Seconds one GPU's reads may take before the GPU is reported hung."""
        return max(0.05, min(self.nvml_timeout, self.interval * 0.8))


def parse_listen(value: str) -> tuple[str, int]:
    """':9842' -> ('', 9842); '127.0.0.1:1' -> ('127.0.0.1', 1); '[::1]:9842' -> ('::1', 9842)."""
    host, sep, port_text = value.rpartition(":")
    if not sep:
        raise ConfigError(f"--listen: expected [HOST]:PORT, got {value!r}")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"--listen: port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"--listen: port must be 0..65535, got {port}")
    return host, port


def validate(config: ExporterConfig) -> ExporterConfig:
    """Check values argparse cannot; returns the config unchanged or raises ConfigError."""
    parse_listen(config.listen)
    if not config.interval > 0:
        raise ConfigError(f"--interval: must be > 0 seconds, got {config.interval}")
    if config.interval < 0.1:
        raise ConfigError(f"--interval: must be >= 0.1 s (GPM needs 100 ms windows), got {config.interval}")
    if not config.nvml_timeout > 0:
        raise ConfigError(f"--nvml.timeout: must be > 0 seconds, got {config.nvml_timeout}")
    if not config.sim_speed > 0:
        raise ConfigError(f"--sim-speed: must be > 0, got {config.sim_speed}")
    if config.log_level not in LOG_LEVELS:
        raise ConfigError(f"--log-level: expected one of {', '.join(LOG_LEVELS)}, got {config.log_level!r}")
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(f"--log-format: expected text or json, got {config.log_format!r}")
    if config.profiling not in PROFILING_MODES:
        raise ConfigError(
            f"--profiling: expected one of {', '.join(PROFILING_MODES)}, got {config.profiling!r}"
        )
    if config.compat and config.compat not in COMPAT_MODES:
        raise ConfigError(f"--compat: expected one of {', '.join(COMPAT_MODES)}, got {config.compat!r}")
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
    if config.web_config_file is not None and not config.web_config_file.is_file():
        raise ConfigError(f"--web.config-file: {config.web_config_file} does not exist")
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
