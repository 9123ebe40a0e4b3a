"""`gpulens remediate`: run the Alertmanager webhook receiver that isolates faulty GPUs' nodes.

Every setting is declared once, on its ReceiverConfig field (remediate/config.py); the options,
their `GPULENS_*` environment fallbacks and the one-line errors come from there
(`gpulens.settings`), as the exporter's do. The web and log flags are the exporter's
(exporter-toolkit's names): `--web.listen-address`, `--web.config.file` (TLS, basic auth users,
headers), `--web.telemetry-path`, `--web.disable-exporter-metrics`, `--log.level`, `--log.format`.
The names the receiver used before (`--listen`, `--log-level`, `--basic-auth-user` /
`--basic-auth-password-file`) still work and log one warning line naming what replaces them. The
bearer token Alertmanager sends stays `--token-file`: the web config file has no place for one.
The subcommands `return` and `diag` are small clients with their own flags.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import signal
import ssl
import sys
from collections.abc import Mapping
from pathlib import Path

from gpulens import httpclient, selfmetrics, serverflags
from gpulens.httpd.server import freeze_startup_heap
from gpulens.httpd.webconfig import WebConfig, load_web_config
from gpulens.logsetup import setup_logging
from gpulens.remediate import diagnose
from gpulens.remediate.audit import AuditError
from gpulens.remediate.auth import AuthConfigError, Authenticator, read_secret
from gpulens.remediate.breaker import BreakerStore, BreakerStoreError, CircuitBreaker, FileStore, MemoryStore
from gpulens.remediate.config import DEFAULT_LISTEN, BackendKind, ReceiverConfig, config_of
from gpulens.remediate.dra import DeviceTaints
from gpulens.remediate.fencing import FencingKubernetesIsolator
from gpulens.remediate.health import AlertOnlyHealth, Health, PrometheusHealth
from gpulens.remediate.kubernetes import KubernetesClient, KubernetesIsolator
from gpulens.remediate.kubestate import ConfigMapStore
from gpulens.remediate.loop import LoopPolicy
from gpulens.remediate.queue import NotificationQueue, QueueError
from gpulens.remediate.recovery import Backend
from gpulens.remediate.server import RemediateServer
from gpulens.remediate.service import Remediator
from gpulens.remediate.slurm import SlurmIsolator
from gpulens.serverflags import ConfigError
from gpulens.settings import add_arguments, aliases_of

log = logging.getLogger("gpulens.remediate")


class UsageError(ValueError):
    """A bad combination of settings; printed as one line."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "remediate",
        help="Alertmanager webhook receiver that isolates faulty GPU nodes",
        description=__doc__.splitlines()[0],
        epilog="Every flag falls back to GPULENS_<FLAG> (--backend: GPULENS_BACKEND; switches take "
        "1/true/yes or 0/false/no). Deprecated names kept from earlier releases: "
        + ", ".join(f"{old} = {new}" for old, new in aliases_of(ReceiverConfig).items()),
    )
    add_arguments(parser, ReceiverConfig)
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
        "--ca-file",
        type=Path,
        metavar="FILE",
        help="CA bundle that signed the receiver's certificate, for an https --url (default: the "
        "system's CAs)",
    )
    back.add_argument(
        "--cert-file",
        type=Path,
        metavar="FILE",
        help="client certificate, for a receiver whose web config file asks for one (client_ca_file)",
    )
    back.add_argument("--key-file", type=Path, metavar="FILE", help="the key of --cert-file")
    back.add_argument(
        "--force",
        action="store_true",
        help="return it even though its episodes are not ready (escalated, recovering); never for RMA",
    )
    parser.set_defaults(func=run)


def build_isolator(config: ReceiverConfig, env: Mapping[str, str]) -> Backend:
    if config.backend is BackendKind.SLURM:
        return SlurmIsolator(
            scontrol=config.scontrol,
            reboot_nextstate=config.slurm_reboot_nextstate,
            requeue=config.slurm_requeue,
            squeue=config.squeue,
            sbatch=config.sbatch,
            diag_user=config.slurm_diag_user,
        )
    if config.slurm_requeue:
        raise UsageError("--slurm-requeue is for --backend slurm (on Kubernetes, --drain evicts the pods)")
    api_url = config.kube_api_url or in_cluster_api(env)
    if not api_url:
        if config.apply:
            raise UsageError("--kube-api-url is required outside a Kubernetes pod")
        api_url = "https://kubernetes.default.svc"
    token = config.kube_token_file if config.kube_token_file.exists() else None
    if config.apply and token is None:
        raise UsageError(f"--kube-token-file {config.kube_token_file}: no such file")
    ca = config.kube_ca_file if config.kube_ca_file.exists() else None
    client = KubernetesClient(api_url, token, ca)
    return FencingKubernetesIsolator(
        client,
        drain=config.drain,
        job_namespace=config.job_namespace,
        job_image=config.job_image,
        diag_image=config.diag_image,
        taints=DeviceTaints(client, config.dra_device_taints),
    )


def in_cluster_api(env: Mapping[str, str]) -> str:
    """The API server's in-cluster address, from the variables the kubelet sets in every pod."""
    host = env.get("KUBERNETES_SERVICE_HOST")
    return f"https://{host}:{env.get('KUBERNETES_SERVICE_PORT', '443')}" if host else ""


def build_store(config: ReceiverConfig, isolator: Backend) -> BreakerStore:
    """Where the breaker's state lives. A dry run keeps its own, so switching to --apply starts clean."""
    name = "breaker.json" if config.apply else "breaker-dry-run.json"
    if config.breaker_state_configmap:
        if not isinstance(isolator, KubernetesIsolator):
            raise UsageError("--breaker-state-configmap needs --backend kubernetes")
        namespace, _, configmap = config.breaker_state_configmap.partition("/")  # checked: NAMESPACE/NAME
        if not config.apply:
            configmap += "-dry-run"
        return ConfigMapStore(isolator.client, namespace, configmap)
    if config.state_dir:
        return FileStore(config.state_dir / name)
    return MemoryStore()


def build_authenticator(config: ReceiverConfig, web: WebConfig) -> Authenticator:
    token = read_secret(config.token_file, "--token-file") if config.token_file else None
    password = None
    if config.basic_auth_password_file:
        if not config.basic_auth_user:
            raise UsageError("--basic-auth-password-file needs --basic-auth-user")
        password = read_secret(config.basic_auth_password_file, "--basic-auth-password-file")
    return Authenticator(
        token=token, username=config.basic_auth_user, password=password, users=web.basic_auth
    )


def load_web(config: ReceiverConfig) -> WebConfig:
    """--web.config.file, checked as the exporter checks it (one line naming file and field)."""
    return load_web_config(config.web_config_file) if config.web_config_file else WebConfig()


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
    try:
        config = config_of(args, os.environ)
    except ConfigError as exc:
        return _fail(str(exc))
    return serve(config, os.environ)


def serve(config: ReceiverConfig, env: Mapping[str, str]) -> int:
    """Run the receiver until SIGTERM or SIGINT; 2 (one line on stderr) when it cannot start."""
    setup_logging(config.log_level, serverflags.log_format(config.log_format), name=log.name)
    for old, new in config.deprecated:
        log.warning("%s is deprecated: use %s", old, new)
    try:
        web = load_web(config)
        auth = build_authenticator(config, web)
        isolator = build_isolator(config, env)
        store = build_store(config, isolator)
        breaker = CircuitBreaker(config.breaker_max_nodes, config.breaker_window, store=store)
        health = build_health(config)
    except (UsageError, AuthConfigError, BreakerStoreError, ConfigError) as exc:
        return _fail(str(exc))
    if isinstance(store, MemoryStore) and config.apply:
        log.warning(
            "the circuit breaker's state is kept in memory only: a restart resets it (pass --state-dir)"
        )
    policy = LoopPolicy(
        hold_down_s=config.hold_down,
        flap_window_s=config.flap_window,
        return_to_service=config.return_to_service,
        max_attempts=config.recovery_attempts,
        action_timeout_s=config.action_timeout,
        node_gpu_threshold=config.node_gpu_threshold,
        diag_level=config.diag_level if config.diag else 0,
    )
    audit = None
    if config.state_dir:
        audit = config.state_dir / ("audit.jsonl" if config.apply else "audit-dry-run.jsonl")
    try:
        queue = build_queue(config)
        remediator = Remediator(
            isolator,
            breaker,
            dry_run=not config.apply,
            action_timeout_s=config.action_timeout,
            audit_log=audit,
            policy=policy,
            health=health,
            queue=queue,
        )
    except (AuditError, QueueError) as exc:
        return _fail(str(exc))
    if remediator.resumed:
        log.info("resumed %d open episode(s) from the %s", remediator.resumed, remediator.resumed_from)
    if queue.path is None:
        log.log(
            logging.WARNING if config.apply else logging.INFO,
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
    if not config.disable_exporter_metrics:
        selfmetrics.register(remediator.metrics.registry)
    try:
        server = RemediateServer(
            config.listen, remediator, auth, web=web, telemetry_path=config.telemetry_path
        )
    except OSError as exc:
        host, port = config.listen
        return _fail(f"--web.listen-address {host}:{port}: cannot listen: {exc.strerror or exc}")
    freeze_startup_heap()  # start-up objects out of the GC's full collections (httpd/server.py)
    mode = "APPLY" if config.apply else "dry-run (pass --apply to act)"
    log.info(
        "listening on %s://%s:%d/alerts, backend %s, %s, breaker %d nodes / %gs, basic auth users %s",
        "https" if web.tls else "http",
        *server.server_address[:2],
        isolator.backend,
        mode,
        config.breaker_max_nodes,
        config.breaker_window,
        "on" if web.basic_auth else "off",
    )

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            reload_web(server, config)
            return
        log.info("shutting down (%s)", signal.Signals(signum).name)
        server.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    remediator.start()
    remediator.reconciler.start(config.reconcile_interval)
    try:
        server.serve_forever()
    finally:
        server.server_close()  # accepts nothing more
        remediator.reconciler.stop()
        if not remediator.stop(config.action_timeout):
            log.warning(
                "actions still running after --action-timeout %gs at shutdown: their notifications "
                "stay queued for the next start",
                config.action_timeout,
            )
    return 0


def reload_web(server: RemediateServer, config: ReceiverConfig) -> None:
    """SIGHUP: re-read --web.config.file (a renewed certificate, changed users), as the exporter
    does; a file that no longer loads is one error line and the running configuration stays.
    The secret files of --token-file are not re-read (restart for a new token)."""
    if config.web_config_file is None:
        log.info("SIGHUP: no --web.config.file to reload; ignored (restart to re-read --token-file)")
        return
    try:
        web = load_web(config)
        auth = build_authenticator(config, web)
    except (ConfigError, AuthConfigError, UsageError) as exc:
        log.error("SIGHUP: keeping the previous web configuration: %s", exc)
        return
    server.reload(web, auth)
    log.info(
        "SIGHUP: reloaded --web.config.file %s (TLS %s, basic auth users %s)",
        config.web_config_file,
        "on" if web.tls else "off",
        "on" if web.basic_auth else "off",
    )


def build_queue(config: ReceiverConfig) -> NotificationQueue:
    """The queue of acknowledged notifications: a file in --state-dir (a dry run keeps its own, as
    it does the audit log), else memory."""
    if not config.state_dir:
        return NotificationQueue()
    return NotificationQueue(config.state_dir / ("queue.jsonl" if config.apply else "queue-dry-run.jsonl"))


def build_health(config: ReceiverConfig) -> Health:
    if not config.prometheus:
        return AlertOnlyHealth()
    token = None
    if config.prometheus_bearer_token_file:
        token = read_secret(config.prometheus_bearer_token_file, "--prometheus-bearer-token-file")
    return PrometheusHealth(config.prometheus, bearer_token=token)


def client_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """`return`'s TLS client: the receiver's private CA (--ca-file) and, for a receiver that asks
    for client certificates, --cert-file/--key-file, as Prometheus' tls_config names them."""
    if args.key_file and not args.cert_file:
        raise UsageError("--key-file needs --cert-file")
    if not (args.ca_file or args.cert_file):
        return None  # the system's CAs (http.client's default context)
    flag, path = "--ca-file", args.ca_file
    try:
        context = ssl.create_default_context(cafile=str(args.ca_file) if args.ca_file else None)
        if args.cert_file:
            flag, path = "--cert-file", args.cert_file
            key = str(args.key_file) if args.key_file else None
            context.load_cert_chain(str(args.cert_file), key)
    except OSError as exc:  # ssl.SSLError too: not PEM, a key that does not match
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise UsageError(f"{flag} {path}: cannot load: {reason}") from None
    return context


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
        context = client_tls(args)
        body = json.dumps({"node": args.node, "force": args.force}).encode()
        answer = httpclient.request(
            "POST",
            args.url.rstrip("/") + "/-/return",
            deadline=120,
            headers=headers,
            body=body,
            context=context,
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
