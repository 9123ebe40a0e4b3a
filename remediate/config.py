"""The receiver's configuration: one frozen record built from flags and `GPULENS_*` variables.

Every setting of `gpulens remediate` is declared once, on its ReceiverConfig field (flag,
deprecated names, help, check: `gpulens.settings`); the parser (`cli.py`), the environment
fallbacks, the one-line errors and docs/alerts.md's flag table come from there
(tests/remediate/test_receiver_flag_docs.py keeps the table in step). The web and log flags mean
what the exporter's do (`gpulens.serverflags`). Checks here look at one value each; what depends
on several (a ConfigMap needs the Kubernetes backend) is checked where the parts are built.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpulens.remediate.diagnose import LEVELS
from gpulens.remediate.dra import DraMode
from gpulens.remediate.kubernetes import DEFAULT_DIAG_IMAGE, DEFAULT_JOB_IMAGE
from gpulens.remediate.server import DEFAULT_TELEMETRY_PATH, RESERVED_PATHS
from gpulens.serverflags import (
    LOG_FORMAT_ALIASES,
    LOG_FORMATS,
    LOG_LEVELS,
    ConfigError,
    parse_duration,
    parse_listen,
)
from gpulens.settings import (
    at_least,
    check,
    existing_directory,
    existing_file,
    http_url,
    resolve,
    setting,
    telemetry_path,
)

DEFAULT_LISTEN = "127.0.0.1:9843"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Kubernetes names: an RFC 1123 label (namespaces), a subdomain (ConfigMaps)
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")

WEB = "web and logs (the exporter's flags)"
AUTH = "caller authentication (one of: --token-file, basic_auth_users in --web.config.file)"
BREAKER = "circuit breaker"
KUBE = "kubernetes backend"
SLURM = "slurm backend"
LOOP = "fault loop (recover, hold down, return to service)"


class BackendKind(StrEnum):
    """`--backend`: how a node is isolated."""

    KUBERNETES = "kubernetes"
    SLURM = "slurm"


def _positive(value: float) -> str | None:
    return None if value > 0 else f"expected a positive duration, got {value:g}s"


def _waited(value: float) -> str | None:
    """A duration a thread waits on: positive, and at most a day (far below what a timed wait takes:
    `threading.TIMEOUT_MAX`), so an absurd value is refused at start, not in a thread later."""
    return _positive(value) or (None if value <= 86_400 else f"expected at most 1d, got {value:g}s")


def _required(value: object) -> str | None:
    return None if value is not None else "required (kubernetes or slurm)"


def _configmap(value: str | None) -> str | None:
    if value is None:
        return None
    namespace, sep, name = value.partition("/")
    if not sep or not _LABEL.fullmatch(namespace) or not _SUBDOMAIN.fullmatch(name):
        return f"expected NAMESPACE/NAME (Kubernetes names), got {value!r}"
    return None


def _namespace(value: str) -> str | None:
    return None if _LABEL.fullmatch(value) else f"expected a Kubernetes namespace name, got {value!r}"


def _word(what: str) -> Callable[[str], str | None]:
    """A program, image or user name: one printable word (it goes on a command line or into a Job)."""

    def problem(value: str) -> str | None:
        if value and value.isprintable() and not any(c.isspace() for c in value):
            return None
        return f"expected {what}, got {value!r}"

    return problem


def _optional_word(what: str) -> Callable[[str], str | None]:
    word = _word(what)
    return lambda value: None if value == "" else word(value)


DURATION: dict[str, Any] = {
    "metavar": "DURATION",
    "parse": parse_duration,
    "expected": "a duration such as 90s, 30m or 1h",
}
COUNT: dict[str, Any] = {"metavar": "N", "parse": int, "expected": "a whole number"}


@dataclass(frozen=True)
class ReceiverConfig:
    """Every setting of the receiver, declared once (`gpulens.settings`)."""

    listen: tuple[str, int] = field(
        default=parse_listen(DEFAULT_LISTEN),
        metadata=setting(
            flag="--web.listen-address",
            aliases=("--listen",),
            metavar="[HOST]:PORT",
            parse=parse_listen,
            expected="[HOST]:PORT with a port 0..65535",
            default_doc=f"`{DEFAULT_LISTEN}`",
            help="address to serve on; `:PORT` is every address",
            group=WEB,
        ),
    )
    web_config_file: Path | None = field(
        default=None,
        metadata=setting(
            flag="--web.config.file",
            metavar="FILE",
            parse=Path,
            help="TLS, basic auth users (bcrypt) and response headers, exporter-toolkit format; "
            "re-read on SIGHUP",
            check=existing_file,
            group=WEB,
        ),
    )
    telemetry_path: str = field(
        default=DEFAULT_TELEMETRY_PATH,
        metadata=setting(
            flag="--web.telemetry-path",
            metavar="PATH",
            help="path of the receiver's own metrics",
            check=telemetry_path(RESERVED_PATHS, "by the receiver"),
            group=WEB,
        ),
    )
    disable_exporter_metrics: bool = field(
        default=False,
        metadata=setting(
            flag="--web.disable-exporter-metrics",
            help="leave out the `process_*` and `python_*` self-metrics",
            group=WEB,
        ),
    )
    log_level: str = field(
        default="info",
        metadata=setting(
            flag="--log.level",
            aliases=("--log-level",),
            metavar="debug|info|warn|error",
            choices=LOG_LEVELS,
            help="logs go to stderr (`warning` is taken too)",
            group=WEB,
        ),
    )
    log_format: str = field(
        default="logfmt",
        metadata=setting(
            flag="--log.format",
            metavar="logfmt|json",
            choices=LOG_FORMATS,
            value_aliases=tuple(LOG_FORMAT_ALIASES.items()),
            help='`time=… level=… logger=… msg="…"`, or the same keys as one JSON object per line',
            group=WEB,
        ),
    )
    backend: BackendKind | None = field(
        default=None,
        metadata=setting(
            flag="--backend",
            metavar="kubernetes|slurm",
            choices=tuple(BackendKind),
            parse=BackendKind,
            default_doc="(required)",
            help="how to isolate: cordon + taint through the Kubernetes API, or `scontrol` drain",
            check=_required,
        ),
    )
    apply: bool = field(
        default=False,
        metadata=setting(
            flag="--apply", help="really isolate; without it every action is only logged, prefixed `DRY-RUN`"
        ),
    )
    token_file: Path | None = field(
        default=None,
        metadata=setting(
            flag="--token-file",
            metavar="FILE",
            parse=Path,
            help="file with the bearer token Alertmanager sends; this or `basic_auth_users` in "
            "`--web.config.file` is required, anything else gets 401",
            group=AUTH,
        ),
    )
    basic_auth_user: str | None = field(
        default=None,
        metadata=setting(
            flag="--basic-auth-user",
            metavar="USER",
            deprecated="--web.config.file (basic_auth_users)",
            help="basic auth user, with `--basic-auth-password-file`",
            group=AUTH,
        ),
    )
    basic_auth_password_file: Path | None = field(
        default=None,
        metadata=setting(
            flag="--basic-auth-password-file",
            metavar="FILE",
            parse=Path,
            deprecated="--web.config.file (basic_auth_users)",
            help="file with the plaintext password of `--basic-auth-user`",
            group=AUTH,
        ),
    )
    breaker_max_nodes: int = field(
        default=3,
        metadata=setting(
            flag="--breaker-max-nodes",
            **COUNT,
            help="isolate at most N distinct nodes per window, then stop",
            check=at_least(1),
            group=BREAKER,
        ),
    )
    breaker_window: float = field(
        default=3600.0,
        metadata=setting(
            flag="--breaker-window",
            **DURATION,
            default_doc="1h",
            help="window of the breaker",
            check=_positive,
            group=BREAKER,
        ),
    )
    breaker_state_configmap: str | None = field(
        default=None,
        metadata=setting(
            flag="--breaker-state-configmap",
            metavar="NAMESPACE/NAME",
            default_doc="none",
            help="Kubernetes: keep the breaker's state in this ConfigMap instead of `--state-dir` "
            "(`-dry-run` appended in a dry run)",
            check=_configmap,
            group=BREAKER,
        ),
    )
    state_dir: Path | None = field(
        default=None,
        metadata=setting(
            flag="--state-dir",
            metavar="DIR",
            parse=Path,
            default_doc="none",
            help="durable state: the breaker's window and latch (`breaker.json`), the audit log of "
            "episodes (`audit.jsonl`) and the queue of acknowledged notifications (`queue.jsonl`, "
            "`queue.jsonl.done`); `-dry-run` names in a dry run. Without it a restart resets the "
            "breaker (unless `--breaker-state-configmap`) and loses the notifications not yet acted on",
            check=existing_directory,
        ),
    )
    action_timeout: float = field(
        default=60.0,
        metadata=setting(
            flag="--action-timeout",
            **DURATION,
            default_doc="60s",
            help="total deadline of one action on one node, every backend call included",
            check=_waited,
        ),
    )
    kube_api_url: str = field(
        default="",
        metadata=setting(
            flag="--kube-api-url",
            metavar="URL",
            default_doc="the in-cluster service address",
            help="Kubernetes API server",
            check=http_url(),
            group=KUBE,
        ),
    )
    kube_token_file: Path = field(
        default=SERVICE_ACCOUNT / "token",
        metadata=setting(
            flag="--kube-token-file",
            metavar="FILE",
            parse=Path,
            default_doc="the pod's service account token",
            help="bearer token for the API",
            group=KUBE,
        ),
    )
    kube_ca_file: Path = field(
        default=SERVICE_ACCOUNT / "ca.crt",
        metadata=setting(
            flag="--kube-ca-file",
            metavar="FILE",
            parse=Path,
            default_doc="the service account's",
            help="CA bundle of the API server",
            group=KUBE,
        ),
    )
    drain: bool = field(
        default=False,
        metadata=setting(
            flag="--drain",
            help="for `isolate_node` alerts also evict the node's pods through the Eviction API",
            group=KUBE,
        ),
    )
    job_namespace: str = field(
        default="gpulens",
        metadata=setting(
            flag="--job-namespace",
            metavar="NAMESPACE",
            help="namespace of the recovery Jobs (GPU reset, node reboot) pinned to a node",
            check=_namespace,
            group=KUBE,
        ),
    )
    job_image: str = field(
        default=DEFAULT_JOB_IMAGE,
        metadata=setting(
            flag="--job-image",
            metavar="IMAGE",
            help="image of the recovery Jobs: nvidia-smi for resets, nsenter for reboots",
            check=_word("an image reference"),
            group=KUBE,
        ),
    )
    dra_device_taints: DraMode = field(
        default=DraMode.AUTO,
        metadata=setting(
            flag="--dra-device-taints",
            metavar="auto|on|off",
            choices=tuple(DraMode),
            parse=DraMode,
            help="fence a faulty GPU alone with a DRA DeviceTaintRule, its node left schedulable: "
            "`auto` where the API serves resource.k8s.io DeviceTaintRules and ResourceSlices, `on` "
            '(always try), `off` (always isolate the node); see "Fencing one GPU"',
            group=KUBE,
        ),
    )
    scontrol: str = field(
        default="scontrol",
        metadata=setting(
            flag="--scontrol",
            metavar="PROGRAM",
            default_doc="`scontrol` from PATH",
            help="the scontrol program",
            check=_word("a program"),
            group=SLURM,
        ),
    )
    slurm_reboot_nextstate: str = field(
        default="DOWN",
        metadata=setting(
            flag="--slurm-reboot-nextstate",
            metavar="DOWN|RESUME",
            choices=("DOWN", "RESUME"),
            help="state after `scontrol reboot ASAP`: DOWN keeps the node out until gpulens returns "
            'it after the hold-down; RESUME lets Slurm return it right after the boot (see "Why '
            '`nextstate=DOWN`")',
            group=SLURM,
        ),
    )
    slurm_requeue: bool = field(
        default=False,
        metadata=setting(
            flag="--slurm-requeue",
            help="with the reboot, requeue the jobs still running on the node (`squeue --nodelist`, "
            "`scontrol requeue Incomplete`) instead of waiting for them to end",
            group=SLURM,
        ),
    )
    squeue: str = field(
        default="squeue",
        metadata=setting(
            flag="--squeue",
            metavar="PROGRAM",
            default_doc="`squeue` from PATH",
            help="the squeue program",
            check=_word("a program"),
            group=SLURM,
        ),
    )
    sbatch: str = field(
        default="sbatch",
        metadata=setting(
            flag="--sbatch",
            metavar="PROGRAM",
            default_doc="`sbatch` from PATH",
            help="the sbatch program, for the diagnostic job",
            check=_word("a program"),
            group=SLURM,
        ),
    )
    slurm_diag_user: str = field(
        default="",
        metadata=setting(
            flag="--slurm-diag-user",
            metavar="USER",
            default_doc="the receiver's own user",
            help="user of the diagnostic's maintenance reservation, who submits its job (the "
            "receiver's own user must then be root or SlurmUser to create reservations)",
            check=_optional_word("a user name"),
            group=SLURM,
        ),
    )
    diag: bool = field(
        default=True,
        metadata=setting(
            flag="--diag",
            metavar="on|off",
            choices=("on", "off"),
            parse=lambda text: text == "on",
            default_doc="`on`",
            help="before a GPU or node returns, run a diagnostic on the node (`dcgmi diag`, or NVML "
            "checks where DCGM is absent) as a Job like recovery; a failure keeps it out (RMA). off: "
            "return after the hold-down alone",
            group=LOOP,
        ),
    )
    diag_level: int = field(
        default=2,
        metadata=setting(
            flag="--diag-level",
            metavar="1|2|3|4",
            choices=tuple(str(level) for level in LEVELS),
            parse=int,
            help="the `dcgmi diag -r` level: 1 quick, 2 medium, 3 long, 4 extended",
            group=LOOP,
        ),
    )
    diag_image: str = field(
        default=DEFAULT_DIAG_IMAGE,
        metadata=setting(
            flag="--diag-image",
            metavar="IMAGE",
            default_doc="`gpulens-exporter:<version>`",
            help="image of the diagnostic Jobs: gpulens, with dcgmi for DCGM's diagnostic",
            check=_word("an image reference"),
            group=LOOP,
        ),
    )
    hold_down: float = field(
        default=600.0,
        metadata=setting(
            flag="--hold-down",
            **DURATION,
            default_doc="10m",
            help="how long a recovered GPU must stay healthy, after its alert resolved, before it may return",
            group=LOOP,
        ),
    )
    return_to_service: bool = field(
        default=False,
        metadata=setting(
            flag="--return-to-service",
            help="return nodes after the hold-down by itself; without it they are marked ready and "
            "`gpulens remediate return NODE` returns them",
            group=LOOP,
        ),
    )
    flap_window: float = field(
        default=86_400.0,
        metadata=setting(
            flag="--flap-window",
            **DURATION,
            default_doc="1d",
            help="a node faulty again this soon after its return stays out and is escalated",
            group=LOOP,
        ),
    )
    node_gpu_threshold: int = field(
        default=2,
        metadata=setting(
            flag="--node-gpu-threshold",
            **COUNT,
            help="this many faulty GPUs on one node take the whole node out (drain and reboot); 0: never",
            check=at_least(0, " (0: never)"),
            group=LOOP,
        ),
    )
    recovery_attempts: int = field(
        default=3,
        metadata=setting(
            flag="--recovery-attempts",
            **COUNT,
            help="recovery actions tried per episode before it is escalated",
            check=at_least(1),
            group=LOOP,
        ),
    )
    prometheus: str | None = field(
        default=None,
        metadata=setting(
            flag="--prometheus",
            metavar="URL",
            default_doc="none",
            help="Prometheus to check the GPU's health through the hold-down (`gpu_up`, Xids, pending "
            "remaps); without it only the alert's silence counts",
            check=http_url(),
            group=LOOP,
        ),
    )
    prometheus_bearer_token_file: Path | None = field(
        default=None,
        metadata=setting(
            flag="--prometheus-bearer-token-file",
            metavar="FILE",
            parse=Path,
            help="bearer token for `--prometheus`",
            group=LOOP,
        ),
    )
    reconcile_interval: float = field(
        default=15.0,
        metadata=setting(
            flag="--reconcile-interval",
            **DURATION,
            default_doc="15s",
            help="how often open episodes are moved on",
            check=_waited,
            group=LOOP,
        ),
    )
    # (old name, new name) of deprecated flags, variables and values used; logged once at start
    deprecated: tuple[tuple[str, str], ...] = field(default=(), compare=False)


def config_of(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ReceiverConfig:
    """The receiver's settings from parsed `args` (text), then `GPULENS_*` variables, then the
    defaults; raises ConfigError (one line naming the flag, alias or variable) on a bad value."""
    resolved = resolve(ReceiverConfig, args, None, os.environ if env is None else env)
    config = ReceiverConfig(**resolved.values, deprecated=resolved.deprecated)
    check(config, resolved.given_as)
    return config


__all__ = ["BackendKind", "ConfigError", "ReceiverConfig", "config_of"]
