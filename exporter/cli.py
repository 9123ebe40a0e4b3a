"""`gpulens-exporter`: parse flags (with `GPULENS_*` environment fallbacks) and run the daemon.

The web and log flags are exporter-toolkit's (`--web.listen-address`, `--web.config.file`,
`--web.telemetry-path`, `--web.max-requests`, `--log.level`, `--log.format logfmt|json`), as every
Prometheus exporter has them; the names gpulens used before (`--listen`, `--web.config-file`,
`--log-level`, `--log-format text`) stay as aliases (ALIASES below, docs/exporter.md).

Every flag that takes a value falls back to the environment variable named after it: upper case,
`GPULENS_` prefix, dots and dashes as underscores (`--web.listen-address` ->
`GPULENS_WEB_LISTEN_ADDRESS`); an alias's variable (`GPULENS_LISTEN`) is read when the main one is
unset. Switches take `1/true/yes` or `0/false/no` there (`GPULENS_NO_ATTRIBUTION_PROCFS=1`).
Collectors use node_exporter's `--collector.<name>` / `--no-collector.<name>`. A bad flag, variable
or file prints one line naming it and exits with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import sys
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from gpulens import __version__, exits
from gpulens.exporter.collectors import DEFAULT_ENABLED, REGISTRY
from gpulens.exporter.config import (
    DEFAULT_LISTEN,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_TELEMETRY_PATH,
    LOG_FORMAT_ALIASES,
    LOG_FORMATS,
    LOG_LEVELS,
    PROFILING_MODES,
    ConfigError,
    ExporterConfig,
    parse_listen,
    validate,
)

PROG = "gpulens-exporter"
DEFAULT_POD_LOGS = ExporterConfig().pod_logs_dir
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _env_name(flag: str) -> str:
    return "GPULENS_" + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Prometheus exporter for NVIDIA GPUs: MIG, MPS, health, Xid and per-job usage.",
        epilog="Every value flag falls back to GPULENS_<FLAG> (e.g. GPULENS_WEB_LISTEN_ADDRESS, "
        "GPULENS_INTERVAL). --no-collector.<name> disables a collector that is on by default. "
        "Aliases kept from earlier releases: " + ", ".join(f"{old} = {new}" for old, new in ALIASES.items()),
    )
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    p.add_argument(
        "--web.listen-address",
        "--listen",
        dest="listen",
        metavar="[HOST]:PORT",
        help=f"address to listen on (default {DEFAULT_LISTEN})",
    )
    p.add_argument(
        "--web.telemetry-path",
        dest="telemetry_path",
        metavar="PATH",
        help=f"path under which metrics are served (default {DEFAULT_TELEMETRY_PATH})",
    )
    p.add_argument(
        "--web.max-requests",
        dest="max_requests",
        type=int,
        metavar="N",
        help=f"most scrapes served at once, more get 503 (default {DEFAULT_MAX_REQUESTS}, 0: no limit)",
    )
    p.add_argument(
        "--web.max-connections",
        dest="max_connections",
        type=int,
        metavar="N",
        help=f"most open connections; beyond it the one idle the longest is closed (default "
        f"{DEFAULT_MAX_CONNECTIONS}, at most half the open-files limit)",
    )
    p.add_argument(
        "--web.disable-exporter-metrics",
        dest="disable_exporter_metrics",
        action="store_true",
        default=None,
        help="leave out the process_* and python_* self-metrics (the exporter's CPU, memory, "
        "descriptors, garbage collector)",
    )
    p.add_argument("--interval", type=float, metavar="SECONDS", help="sampling interval (default 5)")
    p.add_argument(
        "--nvml.timeout",
        dest="nvml_timeout",
        type=float,
        metavar="SECONDS",
        help="deadline for one GPU's NVML reads per sample; slower GPUs are reported down (default 2)",
    )
    p.add_argument(
        "--nvml.slow-fields-every",
        dest="slow_every",
        type=int,
        metavar="N",
        help="read slowly changing values (power limit, temperature thresholds, max clock, PCIe link,"
        " modes, aggregate ECC) on every Nth sample only; fault values are read every sample"
        " (default 12; 1: everything every sample)",
    )
    p.add_argument(
        "--simulate", metavar="SCENARIO", help="serve a simulated node (built-in scenario name or YAML file)"
    )
    p.add_argument("--sim-seed", dest="sim_seed", type=int, metavar="N", help="simulation seed (default 0)")
    p.add_argument(
        "--sim-speed",
        dest="sim_speed",
        type=float,
        metavar="X",
        help="simulated time per real second (default 1)",
    )
    p.add_argument("--procfs", type=Path, metavar="DIR", help="procfs root for attribution (default /proc)")
    p.add_argument(
        "--job-mapping-dir",
        dest="job_mapping_dir",
        type=Path,
        metavar="DIR",
        help="directory of job mapping files (dcgm-exporter or jobstats format)",
    )
    p.add_argument(
        "--job-mapping-max-files",
        dest="job_mapping_max_files",
        type=int,
        metavar="N",
        help="most entries of the job mapping directory read; beyond it one line is logged and the "
        "rest are ignored (default 10000)",
    )
    p.add_argument(
        "--pod-resources-socket",
        dest="pod_resources_socket",
        type=Path,
        metavar="PATH",
        help="kubelet pod-resources socket (default /var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    p.add_argument(
        "--pod-logs-dir",
        dest="pod_logs_dir",
        type=Path,
        metavar="DIR",
        help="pod log directory used to name pods by UID (default /var/log/pods)",
    )
    for source, help_text in (
        ("procfs", "process cgroup/environment attribution"),
        ("mapping", "job mapping files"),
        ("kubernetes", "kubelet pod-resources attribution"),
    ):
        p.add_argument(
            f"--no-attribution.{source}",
            dest=f"no_attribution_{source}",
            action="store_true",
            default=None,
            help=f"disable {help_text}",
        )
    p.add_argument("--log.level", "--log-level", dest="log_level", choices=LOG_LEVELS, help="default info")
    p.add_argument(
        "--log.format",
        "--log-format",
        dest="log_format",
        choices=(*LOG_FORMATS, *LOG_FORMAT_ALIASES),
        help="logfmt (default) or json; text is an alias of logfmt",
    )
    p.add_argument(
        "--web.config.file",
        "--web.config-file",
        dest="web_config_file",
        type=Path,
        metavar="FILE",
        help="TLS and basic auth configuration (exporter-toolkit format)",
    )
    p.add_argument(
        "--profiling",
        choices=PROFILING_MODES,
        help="profiling source: auto (DCGM if reachable, else GPM where supported), dcgm, gpm, off",
    )
    p.add_argument(
        "--dcgm-bindings",
        dest="dcgm_bindings",
        type=Path,
        metavar="PATH",
        help="directory of DCGM's Python bindings (default: the DCGM 4, then DCGM 3 install path)",
    )
    p.add_argument(
        "--dcgm-address",
        dest="dcgm_address",
        metavar="ADDR",
        help="standalone nv-hostengine, HOST[:PORT] or unix:///PATH (default: embedded host engine)",
    )
    p.add_argument(
        "--compat",
        metavar="MODE[,MODE]",
        help="also emit another exporter's names, units and labels: dcgm (dcgm-exporter 4.8.2), "
        "dcgm=<version> (e.g. dcgm=4.8.3: the hostname label), jobstats (Princeton jobstats)",
    )
    p.add_argument(
        "--collector.pcie_nvlink.per-link",
        dest="nvlink_per_link",
        action="store_true",
        default=None,
        help="NVLink byte and error counters per link (default: summed per GPU; link state stays per link)",
    )
    p.add_argument(
        "--metrics.allow",
        dest="metrics_allow",
        metavar="GLOB[,GLOB]",
        help="serve only these metric families (e.g. 'gpu_memory_*,gpu_power_watts'); gpulens_* always",
    )
    p.add_argument(
        "--metrics.deny",
        dest="metrics_deny",
        metavar="GLOB[,GLOB]",
        help="never serve these metric families (e.g. 'gpu_clock_event_*')",
    )
    p.add_argument(
        "--collector.processes.max",
        dest="processes_max",
        type=int,
        metavar="N",
        help="most per-process series the processes collector exports (default 100)",
    )
    group = p.add_argument_group("collectors")
    for name, spec in REGISTRY.items():
        state = "on" if spec.default_enabled else "off"
        group.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action="store_true",
            default=None,
            help=f"enable the {name} collector: {spec.help} (default {state})",
        )
        group.add_argument(
            f"--no-collector.{name}",
            dest=f"collector_{name}",
            action="store_false",
            default=None,
            help=argparse.SUPPRESS,
        )
    return p


def _from_env(name: str, env: Mapping[str, str], convert: Any) -> Any:
    raw = env.get(name)
    if raw is None:
        return None
    try:
        return convert(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: cannot parse {raw!r}") from None


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ValueError(raw)


def _globs(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


VALUE_FLAGS: tuple[tuple[str, str, Any], ...] = (
    # (flag, dest, converter); an alias's environment variable is read after the flag's own
    ("--web.listen-address", "listen", str),
    ("--web.telemetry-path", "telemetry_path", str),
    ("--web.max-requests", "max_requests", int),
    ("--web.max-connections", "max_connections", int),
    ("--interval", "interval", float),
    ("--nvml.timeout", "nvml_timeout", float),
    ("--nvml.slow-fields-every", "slow_every", int),
    ("--simulate", "simulate", str),
    ("--sim-seed", "sim_seed", int),
    ("--sim-speed", "sim_speed", float),
    ("--procfs", "procfs", Path),
    ("--job-mapping-dir", "job_mapping_dir", Path),
    ("--job-mapping-max-files", "job_mapping_max_files", int),
    ("--pod-resources-socket", "pod_resources_socket", Path),
    ("--pod-logs-dir", "pod_logs_dir", Path),
    ("--log.level", "log_level", str),
    ("--log.format", "log_format", str),
    ("--web.config.file", "web_config_file", Path),
    ("--profiling", "profiling", str),
    ("--dcgm-bindings", "dcgm_bindings", Path),
    ("--dcgm-address", "dcgm_address", str),
    ("--compat", "compat", str),
    ("--collector.processes.max", "processes_max", int),
    ("--metrics.allow", "metrics_allow", _globs),
    ("--metrics.deny", "metrics_deny", _globs),
)

# earlier flag names -> exporter-toolkit's (both work; docs/exporter.md lists them)
ALIASES: dict[str, str] = {
    "--listen": "--web.listen-address",
    "--web.config-file": "--web.config.file",
    "--log-level": "--log.level",
    "--log-format": "--log.format",
}
_ALIASES_OF = {new: old for old, new in ALIASES.items()}


def parse_config(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ExporterConfig:
    """Flags, then environment, then defaults; raises ConfigError (one line) on bad input."""
    env = os.environ if env is None else env
    args = build_parser().parse_args(list(argv))
    values: dict[str, Any] = {}
    for flag, dest, convert in VALUE_FLAGS:
        value = getattr(args, dest)
        if isinstance(value, str) and convert is _globs:
            value = _globs(value)
        for name in (flag, _ALIASES_OF.get(flag)):
            if value is None and name is not None:
                value = _from_env(_env_name(name), env, convert)
        if value is not None:
            values[dest] = value
    if "log_format" in values:
        values["log_format"] = LOG_FORMAT_ALIASES.get(values["log_format"], values["log_format"])
    per_link = args.nvlink_per_link
    if per_link is None:
        per_link = _from_env(_env_name("--collector.pcie_nvlink.per-link"), env, _bool)
    values["nvlink_per_link"] = bool(per_link)
    no_self = args.disable_exporter_metrics
    if no_self is None:
        no_self = _from_env(_env_name("--web.disable-exporter-metrics"), env, _bool)
    values["disable_exporter_metrics"] = bool(no_self)
    for source in ("procfs", "mapping", "kubernetes"):
        disabled = getattr(args, f"no_attribution_{source}")
        if disabled is None:
            disabled = _from_env(_env_name(f"--no-attribution.{source}"), env, _bool)
        values[f"attribution_{source}"] = not disabled
    enabled = set(DEFAULT_ENABLED)
    for name in REGISTRY:
        choice = getattr(args, f"collector_{name}")
        if choice is None:
            choice = _from_env(_env_name(f"--collector.{name}"), env, _bool)
        if choice is True:
            enabled.add(name)
        elif choice is False:
            enabled.discard(name)
    values["collectors"] = frozenset(enabled)
    return validate(ExporterConfig(**values))


class Signals:
    """SIGTERM, SIGINT and SIGHUP, recorded for the main loop.

    Installed before anything is built, so a signal during start-up (or a SIGHUP at any time) never
    takes the default action, which would kill the process and leave the simulator's files behind.

    The main thread sleeps in `select` on a wake-up pipe (`signal.set_wakeup_fd`): the C-level
    handler writes to it from whichever thread the kernel delivered the signal to, so the main
    thread wakes to run Python's handler. It used to wake every 0.5 s to look, which costs an
    idle exporter ~0.2 ms of CPU a second on a virtual machine; `SAFETY_WAKEUP_S` remains as a
    net only.
    """

    SAFETY_WAKEUP_S = 10.0

    def __init__(self) -> None:
        self._received: list[int] = []
        self._wake_read, wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(wake_write, False)
        exits.clear()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._record)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)

    def _record(self, signum: int, _frame: Any) -> None:
        self._received.append(signum)
        if signum != signal.SIGHUP:
            exits.request(signum)  # long parsing in the main thread stops at its next check

    def next(self) -> int:
        """Block until a signal arrives and return it (oldest first)."""
        while not self._received:
            # woken by the pipe; the handler runs at the loop's next check, before the condition
            select.select([self._wake_read], [], [], self.SAFETY_WAKEUP_S)
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_read, 512)
        return self._received.pop(0)


# `--simulate` needs a simulated node, which the simulator provides; exporter/ holds only what runs on
# a GPU node and never imports gpulens.sim (the simulator imports the exporter: `gpulens simulate`
# samples with it). The simulator registers its node factory under this entry point group instead
# (pyproject.toml: gpulens.sim.node:simulated_node), found through the installed package's metadata.
SIMULATED_NODE_GROUP = "gpulens.simulated_node"
SIMULATED_NODE_NAME = "default"


def simulated_node_factory() -> Any:
    """The installed simulator's `simulated_node` context manager factory, or a one-line ConfigError."""
    from importlib.metadata import distributions

    # every distribution's entry points, not `entry_points()`: that keeps only the first metadata
    # of each name on sys.path, and a stale gpulens.egg-info in the working directory (a source
    # checkout's build leftover) would hide the installed package's
    found = [
        ep
        for dist in distributions()
        for ep in dist.entry_points
        if ep.group == SIMULATED_NODE_GROUP and ep.name == SIMULATED_NODE_NAME
    ]
    if not found:
        raise ConfigError(
            f"--simulate: no simulator installed: entry point {SIMULATED_NODE_NAME!r} of group "
            f"{SIMULATED_NODE_GROUP!r} is missing (install gpulens with pip: pip install gpulens)"
        )
    try:
        return found[0].load()
    except ImportError as exc:
        raise ConfigError(f"--simulate: the simulator cannot be loaded: {exc}") from exc


def run(config: ExporterConfig) -> int:
    """Start sampling and serve until SIGTERM/SIGINT; with `--simulate`, on a simulated node.

    SIGHUP re-reads `--web.config.file` (as Prometheus' exporters do); a file that no longer loads
    is one error line and the running configuration stays.
    """
    signals = Signals()
    if not config.simulate:
        return serve(config, signals=signals)
    # the context manager removes the node and its files on every path
    simulated_node = simulated_node_factory()
    use_dcgm = config.profiling in ("auto", "dcgm") and (
        config.profiling == "dcgm" or config.dcgm_bindings is not None
    )
    with ExitStack() as stack:
        try:
            sim = stack.enter_context(
                simulated_node(config.simulate, seed=config.sim_seed, speed=config.sim_speed, dcgm=use_dcgm)
            )
        except (OSError, ValueError) as exc:  # ScenarioError is a ValueError with a one-line message
            raise ConfigError(f"--simulate: {exc}") from exc
        paths = sim.paths
        config = replace(
            config,
            procfs=config.procfs or paths.procfs,
            pod_logs_dir=config.pod_logs_dir if config.pod_logs_dir != DEFAULT_POD_LOGS else paths.pod_logs,
            job_mapping_dir=config.job_mapping_dir or paths.job_mapping,
            dcgm_bindings=config.dcgm_bindings or sim.dcgm_bindings,
        )
        return serve(config, node=sim.node, signals=signals)


def serve(config: ExporterConfig, node: Any = None, signals: Signals | None = None) -> int:
    """Sample `node` (simulated) or the real NVML library and serve until SIGTERM/SIGINT."""
    from gpulens.exporter.app import Exporter
    from gpulens.exporter.server import HttpServer
    from gpulens.httpd.webconfig import WebConfig, load_web_config
    from gpulens.logsetup import setup_logging

    log = setup_logging(config.log_level, config.log_format)
    signals = signals or Signals()
    web = load_web_config(config.web_config_file) if config.web_config_file else WebConfig()
    host, port = parse_listen(config.listen)
    exporter = Exporter(config, node=node, logger=log)
    try:
        try:
            server = HttpServer(
                exporter,
                host,
                port,
                web,
                max_requests=config.max_requests,
                max_connections=config.max_connections,
            )
        except OSError as exc:
            raise ConfigError(
                f"--web.listen-address {config.listen}: cannot listen: {exc.strerror or exc}"
            ) from exc
        exporter.start()
        server.start()
        log.info(
            "gpulens-exporter %s listening on %s:%d (%s, interval %gs, collectors: %s, TLS %s, "
            "basic auth %s, at most %d connections and %s requests at once)",
            __version__,
            host or "*",
            server.port,
            exporter.backend_name,
            config.interval,
            ",".join(exporter.enabled),
            "on" if web.tls else "off",
            "on" if web.basic_auth else "off",
            server.server.max_connections,
            config.max_requests or "unlimited",
        )
        try:
            while (signum := signals.next()) == signal.SIGHUP:
                reload_web_config(server, config, log)
        except exits.Terminated as stop:  # SIGTERM while a reload was parsing the file
            signum = stop.signum
        log.info("shutting down (%s)", signal.Signals(signum).name)
        server.stop()
        return 0
    finally:
        exporter.close()


def reload_web_config(server: Any, config: ExporterConfig, log: logging.Logger) -> None:
    """SIGHUP: re-read --web.config.file; a bad file is one error line and changes nothing."""
    from gpulens.httpd.webconfig import load_web_config

    if config.web_config_file is None:
        log.info("SIGHUP: no --web.config.file to reload; ignored")
        return
    try:
        web = load_web_config(config.web_config_file)
    except ConfigError as exc:
        log.error("SIGHUP: keeping the previous web configuration: %s", exc)
        return
    server.reload(web)
    log.info(
        "SIGHUP: reloaded --web.config.file %s (TLS %s, basic auth %s)",
        config.web_config_file,
        "on" if web.tls else "off",
        "on" if web.basic_auth else "off",
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv)
        return run(config)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except exits.Terminated:  # asked to stop while starting (parsing --web.config-file): as asked
        return 0
    finally:
        exits.clear()


if __name__ == "__main__":
    sys.exit(main())
