"""`gpulens remediate`: run the Alertmanager webhook receiver that isolates faulty GPUs' nodes.

The web and log flags are the exporter's (exporter-toolkit's names, `gpulens.serverflags`):
`--web.listen-address`, `--web.config.file` (TLS, basic auth users, headers), `--web.telemetry-path`,
`--web.disable-exporter-metrics`, `--log.level`, `--log.format`. The names the receiver used before
(`--listen`, `--log-level`, `--basic-auth-user` / `--basic-auth-password-file`) still work and log
one warning line naming the flag that replaces them. The bearer token Alertmanager sends stays
`--token-file`: the web config file has no place for one.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import signal
import sys
from pathlib import Path

from gpulens import httpclient, selfmetrics, serverflags
from gpulens.httpd.server import freeze_startup_heap
from gpulens.httpd.webconfig import WebConfig, load_web_config
from gpulens.logsetup import setup_logging
from gpulens.remediate import diagnose
from gpulens.remediate.audit import AuditError
from gpulens.remediate.auth import AuthConfigError, Authenticator, read_secret
from gpulens.remediate.breaker import BreakerStore, BreakerStoreError, CircuitBreaker, FileStore, MemoryStore
from gpulens.remediate.dra import DeviceTaints, DraMode
from gpulens.remediate.fencing import FencingKubernetesIsolator
from gpulens.remediate.health import AlertOnlyHealth, Health, PrometheusHealth
from gpulens.remediate.kubernetes import (
    DEFAULT_DIAG_IMAGE,
    DEFAULT_JOB_IMAGE,
    KubernetesClient,
    KubernetesIsolator,
)
from gpulens.remediate.kubestate import ConfigMapStore
from gpulens.remediate.loop import LoopPolicy
from gpulens.remediate.queue import NotificationQueue, QueueError
from gpulens.remediate.recovery import Backend
from gpulens.remediate.server import DEFAULT_TELEMETRY_PATH, RESERVED_PATHS, RemediateServer
from gpulens.remediate.service import Remediator
from gpulens.remediate.slurm import SlurmIsolator

DEFAULT_LISTEN = "127.0.0.1:9843"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
log = logging.getLogger("gpulens.remediate")


class UsageError(ValueError):
    """A bad option value; printed as one line."""


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `1h`, `1d` -> seconds (the exporter's durations: gpulens.serverflags)."""
    try:
        return serverflags.parse_duration(text)
    except serverflags.ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 90s, 30m or 1h") from None


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT`, or `:PORT` for every address, as the exporter's."""
    try:
        return serverflags.parse_listen(text)
    except serverflags.ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected [HOST]:PORT") from None


class DeprecatedFlag(argparse.Action):
    """An earlier flag name: stores its value where the new flag does and notes (old, new) in
    `deprecated_flags`, which `run` logs as one warning line each."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: object) -> None:
        self.new = new
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kwargs)  # type: ignore[arg-type]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        noted = getattr(namespace, "deprecated_flags", [])
        namespace.deprecated_flags = [*noted, (option_string or self.option_strings[0], self.new)]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "remediate",
        help="Alertmanager webhook receiver that isolates faulty GPU nodes",
        description=__doc__.splitlines()[0],
    )
    web = parser.add_argument_group("web and logs (the exporter's flags)")
    web.add_argument(
        "--web.listen-address",  # exporter-toolkit's name, as the exporter takes it
        dest="listen",
        type=parse_listen,
        default=parse_listen(DEFAULT_LISTEN),
        metavar="[HOST]:PORT",
        help=f"address to serve on (default {DEFAULT_LISTEN}; :PORT is every address)",
    )
    web.add_argument(
        "--listen",
        dest="listen",
        type=parse_listen,
        action=DeprecatedFlag,
        new="--web.listen-address",
        metavar="[HOST]:PORT",
        help="deprecated: --web.listen-address",
    )
    web.add_argument(
        "--web.config.file",
        dest="web_config_file",
        type=Path,
        metavar="FILE",
        help="TLS, basic auth users (bcrypt) and response headers, exporter-toolkit format",
    )
    web.add_argument(
        "--web.telemetry-path",
        dest="telemetry_path",
        default=DEFAULT_TELEMETRY_PATH,
        metavar="PATH",
        help=f"path of the receiver's own metrics (default {DEFAULT_TELEMETRY_PATH})",
    )
    web.add_argument(
        "--web.disable-exporter-metrics",
        dest="disable_exporter_metrics",
        action="store_true",
        help="leave out the process_* and python_* self-metrics",
    )
    web.add_argument(
        "--log.level",
        dest="log_level",
        default="info",
        choices=serverflags.LOG_LEVELS,
        help="log level (default info)",
    )
    web.add_argument(
        "--log-level",
        dest="log_level",
        choices=serverflags.LOG_LEVELS,
        action=DeprecatedFlag,
        new="--log.level",
        help="deprecated: --log.level",
    )
    web.add_argument(
        "--log.format",
        dest="log_format",
        default="logfmt",
        choices=(*serverflags.LOG_FORMATS, *serverflags.LOG_FORMAT_ALIASES),
        help="logfmt (default) or json",
    )
    parser.add_argument(
        "--backend",
        choices=["kubernetes", "slurm"],
        help="how to isolate: cordon + taint through the Kubernetes API, or scontrol drain (required)",
    )
    parser.add_argument(
        "--apply",
        action="store_true",
        help="really isolate; without it every action is only logged (dry-run)",
    )
    auth = parser.add_argument_group(
        "caller authentication (one of: --token-file, basic_auth_users in --web.config.file)"
    )
    auth.add_argument("--token-file", type=Path, help="file with the bearer token Alertmanager sends")
    auth.add_argument(
        "--basic-auth-user",
        action=DeprecatedFlag,
        new="--web.config.file (basic_auth_users)",
        help="deprecated: basic_auth_users in --web.config.file",
    )
    auth.add_argument(
        "--basic-auth-password-file",
        type=Path,
        action=DeprecatedFlag,
        new="--web.config.file (basic_auth_users)",
        help="deprecated: basic_auth_users in --web.config.file",
    )
    breaker = parser.add_argument_group("circuit breaker")
    breaker.add_argument(
        "--breaker-max-nodes",
        type=int,
        default=3,
        metavar="N",
        help="isolate at most N distinct nodes per window, then stop (default 3)",
    )
    breaker.add_argument(
        "--breaker-window",
        type=parse_duration,
        default=3600.0,
        metavar="DURATION",
        help="window of the breaker (default 1h)",
    )
    breaker.add_argument(
        "--breaker-state-configmap",
        metavar="NAMESPACE/NAME",
        help="kubernetes backend: keep the breaker's state in this ConfigMap (instead of --state-dir)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="directory for the receiver's durable state (breaker.json, audit.jsonl, the queue of "
        "acknowledged notifications queue.jsonl); without it a restart resets the breaker (unless "
        "--breaker-state-configmap) and loses the notifications not yet acted on",
    )
    parser.add_argument(
        "--action-timeout",
        type=parse_duration,
        default=60.0,
        metavar="DURATION",
        help="total deadline of one action on one node, every backend call included (default 60s)",
    )
    kube = parser.add_argument_group("kubernetes backend")
    default_api = ""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        default_api = (
            f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:"
            f"{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
        )
    kube.add_argument(
        "--kube-api-url",
        default=default_api or None,
        help="API server URL (default: the in-cluster service address)",
    )
    kube.add_argument(
        "--kube-token-file",
        type=Path,
        default=SERVICE_ACCOUNT / "token",
        help="bearer token for the API (default: the pod's service account token)",
    )
    kube.add_argument(
        "--kube-ca-file",
        type=Path,
        default=SERVICE_ACCOUNT / "ca.crt",
        help="CA bundle of the API server (default: the service account's)",
    )
    kube.add_argument(
        "--drain",
        action="store_true",
        help="for isolate_node alerts also evict the node's pods through the Eviction API",
    )
    kube.add_argument(
        "--job-namespace",
        default="gpulens",
        help="namespace of the recovery Jobs (GPU reset, node reboot) pinned to a node (default gpulens)",
    )
    kube.add_argument(
        "--job-image",
        default=DEFAULT_JOB_IMAGE,
        help="image of the recovery Jobs: nvidia-smi for resets, nsenter for reboots "
        f"(default {DEFAULT_JOB_IMAGE})",
    )
    fencing = parser.add_argument_group("GPU fencing (kubernetes backend)")
    fencing.add_argument(
        "--dra-device-taints",
        choices=[m.value for m in DraMode],
        default=DraMode.AUTO.value,
        help="fence a faulty GPU alone with a DRA DeviceTaintRule, its node left schedulable: auto "
        "(default) where the API serves resource.k8s.io DeviceTaintRules and ResourceSlices, on "
        "(always try), off (always isolate the node)",
    )
    slurm = parser.add_argument_group("slurm backend")
    slurm.add_argument("--scontrol", default="scontrol", help="scontrol binary (default: from PATH)")
    slurm.add_argument(
        "--slurm-reboot-nextstate",
        choices=["DOWN", "RESUME"],
        default="DOWN",
        help="state after `scontrol reboot ASAP`: DOWN keeps the node out until gpulens returns it "
        "after the hold-down (default); RESUME lets Slurm return it right after the boot",
    )
    slurm.add_argument(
        "--slurm-requeue",
        action="store_true",
        help="with the reboot, requeue the jobs still running on the node (squeue --nodelist, "
        "scontrol requeue Incomplete) instead of waiting for them to end",
    )
    slurm.add_argument("--squeue", default="squeue", help="squeue binary (default: from PATH)")
    slurm.add_argument("--sbatch", default="sbatch", help="sbatch binary, for the diagnostic job")
    slurm.add_argument(
        "--slurm-diag-user",
        default="",
        help="user of the diagnostic's maintenance reservation, who submits its job (default: the "
        "receiver's own user, which must be root or SlurmUser to create reservations)",
    )
    loop = parser.add_argument_group("fault loop (recover, hold down, return to service)")
    loop.add_argument(
        "--diag",
        choices=["on", "off"],
        default="on",
        help="before a GPU or node returns, run a diagnostic on the node (dcgmi diag, or NVML checks "
        "where DCGM is absent) as a Job like recovery; a failure keeps it out (RMA). off: return "
        "after the hold-down alone (default on)",
    )
    loop.add_argument(
        "--diag-level",
        type=int,
        choices=diagnose.LEVELS,
        default=2,
        help="the `dcgmi diag -r` level: 1 quick, 2 medium (default), 3 long, 4 extended",
    )
    loop.add_argument(
        "--diag-image",
        default=DEFAULT_DIAG_IMAGE,
        help="image of the diagnostic Jobs: gpulens, with dcgmi for DCGM's diagnostic "
        f"(default {DEFAULT_DIAG_IMAGE})",
    )
    loop.add_argument(
        "--hold-down",
        type=parse_duration,
        default=600.0,
        metavar="DURATION",
        help="how long a recovered GPU must stay healthy, after its alert resolved, before it may "
        "return (default 10m)",
    )
    loop.add_argument(
        "--return-to-service",
        action="store_true",
        help="return nodes after the hold-down by itself; without it they are marked ready and "
        "`gpulens remediate return NODE` returns them",
    )
    loop.add_argument(
        "--flap-window",
        type=parse_duration,
        default=86_400.0,
        metavar="DURATION",
        help="a node faulty again this soon after its return stays out and is escalated (default 1d)",
    )
    loop.add_argument(
        "--node-gpu-threshold",
        type=int,
        default=2,
        metavar="N",
        help="this many faulty GPUs on one node take the whole node out (drain and reboot); 0: never "
        "(default 2)",
    )
    loop.add_argument(
        "--recovery-attempts",
        type=int,
        default=3,
        metavar="N",
        help="recovery actions tried per episode before it is escalated (default 3)",
    )
    loop.add_argument(
        "--prometheus",
        metavar="URL",
        help="Prometheus to check the GPU's health through the hold-down (gpu_up, Xids, pending "
        "remaps); without it only the alert's silence counts",
    )
    loop.add_argument(
        "--prometheus-bearer-token-file", type=Path, metavar="FILE", help="bearer token for --prometheus"
    )
    loop.add_argument(
        "--reconcile-interval",
        type=parse_duration,
        default=15.0,
        metavar="DURATION",
        help="how often open episodes are moved on (default 15s)",
    )
    actions = parser.add_subparsers(dest="remediate_action", metavar="{return,diag}")
    diag = actions.add_parser(
        "diag",
        help="run the return diagnostic on this node (what the diagnostic Job runs)",
        description="Run `dcgmi diag -r LEVEL -j` for the GPU where dcgmi is found, else NVML checks; "
        "print the verdict as one JSON line (also to /dev/termination-log); exit 0 passed, 1 failed, "
        "2 error.",
    )
    diag.add_argument("--level", type=int, choices=diagnose.LEVELS, default=2, help="dcgmi diag level")
    diag.add_argument("--gpu", default="", help="the GPU's index (DCGM id); default every GPU")
    diag.add_argument("--uuid", default="", help="the GPU's UUID, for the NVML check")
    diag.add_argument("--dcgmi", default="dcgmi", help="the dcgmi program (default dcgmi from PATH)")
    back = actions.add_parser(
        "return",
        help="return a node that is ready (after its recovery and hold-down) to service",
        description="Ask the running receiver to return NODE to service (POST /-/return).",
    )
    back.add_argument("node", metavar="NODE")
    back.add_argument(
        "--url", default=f"http://{DEFAULT_LISTEN}", help=f"the receiver (default http://{DEFAULT_LISTEN})"
    )
    back.add_argument("--token-file", type=Path, help="file with the receiver's bearer token")
    back.add_argument("--basic-auth-user", help="basic auth user name of the receiver")
    back.add_argument("--basic-auth-password-file", type=Path, help="file with the basic auth password")
    back.add_argument(
        "--force",
        action="store_true",
        help="return it even though its episodes are not ready (escalated, recovering); never for RMA",
    )
    parser.set_defaults(func=run)


def build_isolator(args: argparse.Namespace) -> Backend:
    if args.backend == "slurm":
        return SlurmIsolator(
            scontrol=args.scontrol,
            reboot_nextstate=args.slurm_reboot_nextstate,
            requeue=args.slurm_requeue,
            squeue=args.squeue,
            sbatch=args.sbatch,
            diag_user=args.slurm_diag_user,
        )
    if args.slurm_requeue:
        raise UsageError("--slurm-requeue is for --backend slurm (on Kubernetes, --drain evicts the pods)")
    if not args.kube_api_url:
        if args.apply:
            raise UsageError("--kube-api-url is required outside a Kubernetes pod")
        args.kube_api_url = "https://kubernetes.default.svc"
    token = args.kube_token_file if args.kube_token_file and args.kube_token_file.exists() else None
    if args.apply and token is None:
        raise UsageError(f"--kube-token-file {args.kube_token_file}: no such file")
    ca = args.kube_ca_file if args.kube_ca_file and args.kube_ca_file.exists() else None
    client = KubernetesClient(args.kube_api_url, token, ca)
    return FencingKubernetesIsolator(
        client,
        drain=args.drain,
        job_namespace=args.job_namespace,
        job_image=args.job_image,
        diag_image=args.diag_image,
        taints=DeviceTaints(client, DraMode(args.dra_device_taints)),
    )


def build_store(args: argparse.Namespace, isolator: Backend) -> BreakerStore:
    """Where the breaker's state lives. A dry run keeps its own, so switching to --apply starts clean."""
    name = "breaker.json" if args.apply else "breaker-dry-run.json"
    if args.breaker_state_configmap:
        if not isinstance(isolator, KubernetesIsolator):
            raise UsageError("--breaker-state-configmap needs --backend kubernetes")
        namespace, sep, configmap = args.breaker_state_configmap.partition("/")
        if not sep or not namespace or not configmap:
            raise UsageError(
                f"--breaker-state-configmap {args.breaker_state_configmap!r}: expected NAMESPACE/NAME"
            )
        if not args.apply:
            configmap += "-dry-run"
        return ConfigMapStore(isolator.client, namespace, configmap)
    if args.state_dir:
        if not args.state_dir.is_dir():
            raise UsageError(f"--state-dir {args.state_dir}: not a directory")
        return FileStore(args.state_dir / name)
    return MemoryStore()


def build_authenticator(args: argparse.Namespace, web: WebConfig) -> Authenticator:
    token = read_secret(args.token_file, "--token-file") if args.token_file else None
    user = getattr(args, "basic_auth_user", None)  # absent unless the deprecated flags are given
    password_file = getattr(args, "basic_auth_password_file", None)
    password = None
    if password_file:
        if not user:
            raise UsageError("--basic-auth-password-file needs --basic-auth-user")
        password = read_secret(password_file, "--basic-auth-password-file")
    return Authenticator(token=token, username=user, password=password, users=web.basic_auth)


def load_web(args: argparse.Namespace) -> WebConfig:
    """--web.config.file, checked as the exporter checks it (one line naming file and field)."""
    return load_web_config(args.web_config_file) if args.web_config_file else WebConfig()


def check_telemetry_path(path: str) -> None:
    if not path.startswith("/") or not path.isprintable() or any(c in path for c in " ?#"):
        raise UsageError(f"--web.telemetry-path: expected an absolute URL path like /metrics, got {path!r}")
    if path in RESERVED_PATHS:
        raise UsageError(f"--web.telemetry-path: {path} is already served by the receiver")


def _fail(message: str) -> int:
    """One line on stderr and exit status 2, like gpulens' other usage errors."""
    print(f"gpulens: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if getattr(args, "remediate_action", None) == "return":
        return run_return(args)
    if getattr(args, "remediate_action", None) == "diag":
        if args.gpu and not args.gpu.isdigit():
            return _fail(f"--gpu {args.gpu!r}: expected a GPU index")
        return diagnose.main(args.level, args.gpu, args.uuid, args.dcgmi)
    setup_logging(args.log_level, serverflags.log_format(args.log_format), name=log.name)
    for old, new in getattr(args, "deprecated_flags", []):
        log.warning("%s is deprecated: use %s", old, new)
    try:
        check_telemetry_path(args.telemetry_path)
        web = load_web(args)
        if not args.backend:
            raise UsageError("--backend is required (kubernetes or slurm)")
        if args.recovery_attempts < 1:
            raise UsageError("--recovery-attempts: expected at least 1")
        if args.reconcile_interval <= 0:
            raise UsageError("--reconcile-interval: expected a positive duration")
        if args.breaker_max_nodes < 1:
            raise UsageError("--breaker-max-nodes: expected at least 1")
        if args.action_timeout <= 0:
            raise UsageError("--action-timeout: expected a positive duration")
        auth = build_authenticator(args, web)
        isolator = build_isolator(args)
        store = build_store(args, isolator)
        breaker = CircuitBreaker(args.breaker_max_nodes, args.breaker_window, store=store)
        health = build_health(args)
    except (UsageError, AuthConfigError, BreakerStoreError, serverflags.ConfigError) as exc:
        return _fail(str(exc))
    if isinstance(store, MemoryStore) and args.apply:
        log.warning(
            "the circuit breaker's state is kept in memory only: a restart resets it (pass --state-dir)"
        )
    policy = LoopPolicy(
        hold_down_s=args.hold_down,
        flap_window_s=args.flap_window,
        return_to_service=args.return_to_service,
        max_attempts=args.recovery_attempts,
        action_timeout_s=args.action_timeout,
        node_gpu_threshold=max(args.node_gpu_threshold, 0),
        diag_level=args.diag_level if args.diag == "on" else 0,
    )
    audit = None
    if args.state_dir:
        audit = args.state_dir / ("audit.jsonl" if args.apply else "audit-dry-run.jsonl")
    try:
        queue = build_queue(args)
        remediator = Remediator(
            isolator,
            breaker,
            dry_run=not args.apply,
            action_timeout_s=args.action_timeout,
            audit_log=audit,
            policy=policy,
            health=health,
            queue=queue,
        )
    except (UsageError, AuditError, QueueError) as exc:
        return _fail(str(exc))
    if remediator.resumed:
        log.info("resumed %d open episode(s) from the %s", remediator.resumed, remediator.resumed_from)
    if queue.path is None:
        log.log(
            logging.WARNING if args.apply else logging.INFO,
            "the notification queue is kept in memory only: notifications acknowledged but not yet "
            "acted on are lost on a restart (pass --state-dir)",
        )
    elif queue.recovered:
        log.info(
            "%d notification(s) acknowledged by the last run queued again from %s",
            queue.recovered,
            queue.path,
        )

    def save_failed(exc: BreakerStoreError) -> None:
        remediator.metrics.breaker_save_errors.inc()
        log.error("%s", exc)

    breaker.on_save_error = save_failed
    if not args.disable_exporter_metrics:
        selfmetrics.register(remediator.metrics.registry)
    try:
        server = RemediateServer(args.listen, remediator, auth, web=web, telemetry_path=args.telemetry_path)
    except OSError as exc:
        host, port = args.listen
        return _fail(f"--web.listen-address {host}:{port}: cannot listen: {exc.strerror or exc}")
    freeze_startup_heap()  # start-up objects out of the GC's full collections (httpd/server.py)
    mode = "APPLY" if args.apply else "dry-run (pass --apply to act)"
    log.info(
        "listening on %s://%s:%d/alerts, backend %s, %s, breaker %d nodes / %gs, basic auth users %s",
        "https" if web.tls else "http",
        *server.server_address[:2],
        isolator.backend,
        mode,
        args.breaker_max_nodes,
        args.breaker_window,
        "on" if web.basic_auth else "off",
    )

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            reload_web(server, args)
            return
        log.info("shutting down (%s)", signal.Signals(signum).name)
        server.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    remediator.start()
    remediator.reconciler.start(args.reconcile_interval)
    try:
        server.serve_forever()
    finally:
        server.server_close()  # accepts nothing more
        remediator.reconciler.stop()
        if not remediator.stop(args.action_timeout):
            log.warning(
                "actions still running after --action-timeout %gs at shutdown: their notifications "
                "stay queued for the next start",
                args.action_timeout,
            )
    return 0


def reload_web(server: RemediateServer, args: argparse.Namespace) -> None:
    """SIGHUP: re-read --web.config.file (a renewed certificate, changed users), as the exporter
    does; a file that no longer loads is one error line and the running configuration stays.
    The secret files of --token-file are not re-read (restart for a new token)."""
    if args.web_config_file is None:
        log.info("SIGHUP: no --web.config.file to reload; ignored (restart to re-read --token-file)")
        return
    try:
        web = load_web(args)
        auth = build_authenticator(args, web)
    except (serverflags.ConfigError, AuthConfigError, UsageError) as exc:
        log.error("SIGHUP: keeping the previous web configuration: %s", exc)
        return
    server.reload(web, auth)
    log.info(
        "SIGHUP: reloaded --web.config.file %s (TLS %s, basic auth users %s)",
        args.web_config_file,
        "on" if web.tls else "off",
        "on" if web.basic_auth else "off",
    )


def build_queue(args: argparse.Namespace) -> NotificationQueue:
    """The queue of acknowledged notifications: a file in --state-dir (a dry run keeps its own, as
    it does the audit log), else memory."""
    if not args.state_dir:
        return NotificationQueue()
    if not args.state_dir.is_dir():
        raise UsageError(f"--state-dir {args.state_dir}: not a directory")
    return NotificationQueue(args.state_dir / ("queue.jsonl" if args.apply else "queue-dry-run.jsonl"))


def build_health(args: argparse.Namespace) -> Health:
    if not args.prometheus:
        return AlertOnlyHealth()
    if not args.prometheus.startswith(("http://", "https://")):
        raise UsageError(f"--prometheus {args.prometheus!r}: expected an http(s) URL")
    token = None
    if args.prometheus_bearer_token_file:
        token = read_secret(args.prometheus_bearer_token_file, "--prometheus-bearer-token-file")
    return PrometheusHealth(args.prometheus, bearer_token=token)


def run_return(args: argparse.Namespace) -> int:
    """`gpulens remediate return NODE`: POST /-/return to the running receiver, print its answer."""
    try:
        headers = {"Content-Type": "application/json"}
        if args.token_file:
            headers["Authorization"] = f"Bearer {read_secret(args.token_file, '--token-file')}"
        elif args.basic_auth_user and args.basic_auth_password_file:
            password = read_secret(args.basic_auth_password_file, "--basic-auth-password-file")
            pair = base64.b64encode(f"{args.basic_auth_user}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {pair}"
        else:
            raise UsageError("give --token-file, or --basic-auth-user with --basic-auth-password-file")
        body = json.dumps({"node": args.node, "force": args.force}).encode()
        answer = httpclient.request(
            "POST", args.url.rstrip("/") + "/-/return", deadline=120, headers=headers, body=body
        )
    except (UsageError, AuthConfigError, httpclient.HttpError) as exc:
        return _fail(str(exc))
    try:
        doc = json.loads(answer.body)
        result, detail = doc["result"], doc["detail"]
    except (ValueError, KeyError, TypeError):
        return _fail(f"{args.url}: HTTP {answer.status} {answer.body[:200].decode(errors='replace').strip()}")
    print(f"{result}: {detail}")
    return 0 if result in ("applied", "already", "dry_run") else 1
