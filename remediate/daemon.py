"""The receiver's daemon: build its parts from a ReceiverConfig, serve until SIGTERM or SIGINT.

The flags that make the ReceiverConfig are `cli.py`'s (declared on its fields, `config.py`);
SIGHUP re-reads the web config file, as the exporter does.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping

from gpulens import selfmetrics, serverflags
from gpulens.httpd.server import freeze_startup_heap
from gpulens.httpd.webconfig import WebConfig, load_web_config
from gpulens.logsetup import setup_logging
from gpulens.remediate.audit import AuditError
from gpulens.remediate.auth import AuthConfigError, Authenticator, read_secret
from gpulens.remediate.breaker import BreakerStore, BreakerStoreError, CircuitBreaker, FileStore, MemoryStore
from gpulens.remediate.config import BackendKind, ReceiverConfig
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
from gpulens.remediate.usage import UsageError, fail
from gpulens.serverflags import ConfigError

log = logging.getLogger("gpulens.remediate")


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
        return fail(str(exc))
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
        return fail(str(exc))
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
        return fail(f"--web.listen-address {host}:{port}: cannot listen: {exc.strerror or exc}")
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
