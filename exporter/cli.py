"""`gpulens-exporter`: parse flags (with `GPULENS_*` environment fallbacks) and run the daemon.

Every setting is declared once, on its ExporterConfig field (exporter/config.py): flag, aliases,
help and check; the parser and environment fallbacks come from there (`gpulens.settings`). The web
and log flags are exporter-toolkit's (`--web.listen-address`, `--web.config.file`,
`--web.telemetry-path`, `--web.max-requests`, `--log.level`, `--log.format logfmt|json`), as every
Prometheus exporter has them; the names gpulens used before (`--listen`, `--web.config-file`,
`--log-level`, `--log-format text`, `--procfs`) keep working and log a deprecation warning.

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
from typing import Any, NoReturn

from gpulens import __version__, exits
from gpulens.exporter.app import Exporter
from gpulens.exporter.collectors import DEFAULT_ENABLED, SWITCHABLE
from gpulens.exporter.config import (
    DEFAULT_MPS_CONTROL,
    DEFAULT_POD_LOGS,
    ConfigError,
    ExporterConfig,
    parse_listen,
    validate,
)
from gpulens.exporter.server import HttpServer
from gpulens.httpd.webconfig import WebConfig, load_web_config
from gpulens.logsetup import setup_logging
from gpulens.settings import add_arguments, aliases_of, env_name, parse_bool, resolve

PROG = "gpulens-exporter"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    """Options from ExporterConfig's declared settings, then the per-collector switches."""
    aliases = aliases_of(ExporterConfig)
    p = _Parser(
        prog=PROG,
        description="Prometheus exporter for NVIDIA GPUs: MIG, MPS, health, Xid and per-job usage.",
        epilog="Every flag falls back to GPULENS_<FLAG> (e.g. GPULENS_WEB_LISTEN_ADDRESS, "
        "GPULENS_INTERVAL). --no-collector.<name> disables a collector that is on by default. "
        "Deprecated names kept from earlier releases: "
        + ", ".join(f"{old} = {new}" for old, new in aliases.items()),
    )
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    add_arguments(p, ExporterConfig)
    group = p.add_argument_group("collectors")
    group.add_argument(
        DISABLE_DEFAULTS,
        dest="collector_disable_defaults",
        action="store_true",
        default=None,
        help="start from no collector: only those enabled with --collector.<name> run (node_exporter's flag)",
    )
    for name, spec in SWITCHABLE.items():
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


DISABLE_DEFAULTS = "--collector.disable-defaults"
# docs/exporter.md's rows for the flags declared here rather than in ExporterConfig
COLLECTOR_FLAG_ROWS = (
    ("`--collector.<name>` / `--no-collector.<name>`", "see below", "enable / disable a collector"),
    (f"`{DISABLE_DEFAULTS}`", "off", "start from no collector: only those enabled by name run"),
)


def _switch(args: argparse.Namespace, dest: str, flag: str, env: Mapping[str, str]) -> bool | None:
    """A collector switch from its flag, else its variable (None: neither given)."""
    value = getattr(args, dest)
    if value is not None:
        return bool(value)
    raw = env.get(env_name(flag))
    if raw is None:
        return None
    try:
        return parse_bool(raw)
    except ValueError:
        raise ConfigError(f"{env_name(flag)}: expected 1/true/yes or 0/false/no, got {raw!r}") from None


def parse_config(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ExporterConfig:
    """Flags, then environment, then defaults; raises ConfigError (one line) on bad input."""
    env = os.environ if env is None else env
    argv = list(argv)
    args = build_parser().parse_args(argv)
    resolved = resolve(ExporterConfig, args, argv, env)
    enabled = (
        set() if _switch(args, "collector_disable_defaults", DISABLE_DEFAULTS, env) else set(DEFAULT_ENABLED)
    )
    for name in SWITCHABLE:
        choice = _switch(args, f"collector_{name}", f"--collector.{name}", env)
        if choice is True:
            enabled.add(name)
        elif choice is False:
            enabled.discard(name)
    return validate(
        ExporterConfig(**resolved.values, collectors=frozenset(enabled), deprecated=resolved.deprecated),
        resolved.given_as,
    )


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
            # the simulated node's daemons answer through the simulator's stand-in control client
            mps_control=(
                config.mps_control if config.mps_control != DEFAULT_MPS_CONTROL else paths.mps_control
            ),
            job_mapping_dir=config.job_mapping_dir or paths.job_mapping,
            dcgm_bindings=config.dcgm_bindings or sim.dcgm_bindings,
        )
        return serve(config, node=sim.node, signals=signals)


def serve(config: ExporterConfig, node: Any = None, signals: Signals | None = None) -> int:
    """Sample `node` (simulated) or the real NVML library and serve until SIGTERM/SIGINT."""
    log = setup_logging(config.log_level, config.log_format)
    for old, new in config.deprecated:
        log.warning("%s is deprecated: use %s", old, new)
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
    except exits.Terminated:  # asked to stop while starting (parsing --web.config.file): as asked
        return 0
    finally:
        exits.clear()


if __name__ == "__main__":
    sys.exit(main())
