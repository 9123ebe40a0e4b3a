"""NVIDIA k8s-device-plugin: one sharing config, and the ConfigMap of named configs nodes select.

The plugin (api/config/v1) reads one config per file; with several, its config-manager sidecar
mounts a ConfigMap as a directory and each node picks a key with the label
`nvidia.com/device-plugin.config` (a key that does not exist is an error there). Rules checked,
restated from the plugin's parser and from what it silently ignores:

- `version` is `v1` (the only version the parser knows); other top-level keys are `flags`,
  `resources`, `sharing`, `imex`. The YAML decoder ignores unknown fields, so a misspelt key
  would silently do nothing: it is rejected here.
- `sharing` holds `timeSlicing` and/or `mps`; when `mps` is set it wins and `timeSlicing` is
  ignored, so both together are rejected.
- a sharing block has `resources` (required, not empty), `renameByDefault` and
  `failRequestsGreaterThanOne` (booleans). Each resource has `name` (a Kubernetes extended
  resource name under `nvidia.com/`, at most 63 characters) and `replicas` (an integer >= 2:
  the parser refuses fewer). `devices` other than `all` and `rename` are ignored with a
  warning, so they are rejected as not honoured.
- MPS shares only full GPUs (`nvidia.com/gpu`), not MIG devices, and not with
  `migStrategy: mixed`; its replicas are capped by the MPS client limit (48 from compute
  capability 7.5 in the plugin's check, 16 below).
- With MPS the plugin's control daemon gives every replica `100 / replicas` percent of the
  threads (integer division) and `memory / replicas` of pinned memory; a client can only lower
  its thread share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE tightens, never widens). So a planned
  client percentage above `100 // replicas` cannot be expressed (`mps_client_problems`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from gpulens.analyzer.validate import Problem

VERSION = "v1"
TOP_KEYS = frozenset({"version", "flags", "resources", "sharing", "imex"})
SHARING_KEYS = frozenset({"timeSlicing", "mps"})
REPLICATED_KEYS = frozenset({"renameByDefault", "failRequestsGreaterThanOne", "resources"})
RESOURCE_KEYS = frozenset({"name", "rename", "devices", "replicas"})
MIG_STRATEGIES = frozenset({"none", "single", "mixed"})
RESOURCE_PREFIX = "nvidia.com"
MAX_RESOURCE_NAME = 63
FULL_GPU_RESOURCE = "nvidia.com/gpu"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
MPS_MAX_CLIENTS = 48
MPS_MAX_CLIENTS_PRE_TURING = 16  # the plugin's own check: fewer clients below compute capability 7.5
CONFIGMAP_MAX_BYTES = 1024 * 1024  # Kubernetes rejects larger ConfigMaps

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def mps_max_clients(compute_capability: tuple[int, int] | None) -> int:
    """Replicas the plugin's MPS daemon accepts per GPU (its check, not the CUDA documentation's)."""
    if compute_capability is not None and compute_capability < (7, 5):
        return MPS_MAX_CLIENTS_PRE_TURING
    return MPS_MAX_CLIENTS


def resource_name_problem(name: object) -> str | None:
    """Why `name` is not a resource name the plugin accepts, or None."""
    if not isinstance(name, str) or not name:
        return "a resource name must be a non-empty string"
    full = name if name.startswith(RESOURCE_PREFIX + "/") else f"{RESOURCE_PREFIX}/{name}"
    if len(full) > MAX_RESOURCE_NAME:
        return f"fully-qualified resource name {full!r} is longer than {MAX_RESOURCE_NAME} characters"
    short = full.split("/", 1)[1]
    if len(short) > 253 or not _DNS_SUBDOMAIN.match(short):
        return f"resource name {full!r} is not a DNS subdomain (lower-case letters, digits, '-', '.')"
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` cannot be a Kubernetes label value, or None."""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return (
            f"label value {value!r} must be at most 63 characters of letters, digits, '-', '_', '.', "
            "starting and ending with a letter or digit"
        )
    return None


def _replicated(block: object, where: str, file: str, kind: str, max_clients: int) -> list[Problem]:
    if not isinstance(block, Mapping):
        return [Problem(file, where, "must be a mapping")]
    problems = [
        Problem(file, f"{where}.{key}", "unknown field (the plugin would ignore it)")
        for key in sorted(set(block) - REPLICATED_KEYS)
    ]
    for key in ("renameByDefault", "failRequestsGreaterThanOne"):
        if key in block and not isinstance(block[key], bool):
            problems.append(Problem(file, f"{where}.{key}", "must be true or false"))
    resources = block.get("resources")
    if not isinstance(resources, list) or not resources:
        return [*problems, Problem(file, f"{where}.resources", "no resources specified")]
    for i, resource in enumerate(resources):
        at = f"{where}.resources[{i}]"
        if not isinstance(resource, Mapping):
            problems.append(Problem(file, at, "must be a mapping with name and replicas"))
            continue
        problems += [
            Problem(file, f"{at}.{key}", "unknown field (the plugin would ignore it)")
            for key in sorted(set(resource) - RESOURCE_KEYS)
        ]
        if "name" not in resource:
            problems.append(Problem(file, f"{at}.name", "no resource name specified"))
        elif (why := resource_name_problem(resource["name"])) is not None:
            problems.append(Problem(file, f"{at}.name", why))
        elif kind == "mps" and _qualified(resource["name"]) != FULL_GPU_RESOURCE:
            problems.append(
                Problem(
                    file, f"{at}.name", f"MPS shares full GPUs only ({FULL_GPU_RESOURCE}), not MIG devices"
                )
            )
        replicas = resource.get("replicas")
        if "replicas" not in resource:
            problems.append(Problem(file, f"{at}.replicas", "no replicas specified"))
        elif not isinstance(replicas, int) or isinstance(replicas, bool):
            problems.append(Problem(file, f"{at}.replicas", f"must be an integer, got {replicas!r}"))
        elif replicas < 2:
            problems.append(
                Problem(file, f"{at}.replicas", f"number of replicas must be >= 2, got {replicas}")
            )
        elif kind == "mps" and replicas > max_clients:
            problems.append(
                Problem(file, f"{at}.replicas", f"{replicas} exceeds the MPS client limit of {max_clients}")
            )
        if "devices" in resource and resource["devices"] != "all":
            problems.append(
                Problem(
                    file, f"{at}.devices", "only 'all' is honoured (the plugin ignores other device lists)"
                )
            )
        if "rename" in resource:
            problems.append(Problem(file, f"{at}.rename", "not honoured by the plugin (use renameByDefault)"))
    return problems


def _qualified(name: str) -> str:
    return name if name.startswith(RESOURCE_PREFIX + "/") else f"{RESOURCE_PREFIX}/{name}"


def validate_config(
    config: object, file: str, where: str = "", max_mps_clients: int = MPS_MAX_CLIENTS
) -> list[Problem]:
    """Every rule one device-plugin config breaks (empty: the plugin accepts it as meant)."""
    at = (where + ".") if where else ""
    if not isinstance(config, Mapping):
        return [Problem(file, where, "a device-plugin config must be a mapping")]
    problems = [
        Problem(file, f"{at}{key}", "unknown field (the plugin would ignore it)")
        for key in sorted(set(config) - TOP_KEYS)
    ]
    if config.get("version", VERSION) != VERSION:
        problems.append(Problem(file, f"{at}version", f"unknown version {config['version']!r}; expected v1"))
    flags = config.get("flags", {})
    if not isinstance(flags, Mapping):
        problems.append(Problem(file, f"{at}flags", "must be a mapping"))
        flags = {}
    strategy = flags.get("migStrategy")
    if strategy is not None and strategy not in MIG_STRATEGIES:
        problems.append(
            Problem(
                file,
                f"{at}flags.migStrategy",
                f"unknown MIG strategy {strategy!r}; one of none, single, mixed",
            )
        )
    sharing = config.get("sharing", {})
    if not isinstance(sharing, Mapping):
        return [*problems, Problem(file, f"{at}sharing", "must be a mapping")]
    problems += [
        Problem(file, f"{at}sharing.{key}", "unknown sharing strategy; one of timeSlicing, mps")
        for key in sorted(set(sharing) - SHARING_KEYS)
    ]
    if "timeSlicing" in sharing and "mps" in sharing:
        problems.append(
            Problem(
                file,
                f"{at}sharing",
                "timeSlicing and mps together: the plugin uses mps and ignores timeSlicing",
            )
        )
    if "timeSlicing" in sharing:
        problems += _replicated(sharing["timeSlicing"], f"{at}sharing.timeSlicing", file, "time-slicing", 0)
    if "mps" in sharing:
        problems += _replicated(sharing["mps"], f"{at}sharing.mps", file, "mps", max_mps_clients)
        if strategy == "mixed":
            problems.append(
                Problem(file, f"{at}flags.migStrategy", "MPS is not supported with migStrategy mixed")
            )
    return problems


def replicas_of(config: Mapping[str, Any]) -> tuple[str, int] | None:
    """("mps" | "time-slicing", replicas of nvidia.com/gpu) of a valid config, or None if unshared."""
    sharing = config.get("sharing") or {}
    for key, kind in (("mps", "mps"), ("timeSlicing", "time-slicing")):
        for resource in (sharing.get(key) or {}).get("resources", []):
            if _qualified(resource["name"]) == FULL_GPU_RESOURCE:
                return kind, int(resource["replicas"])
    return None


def mps_client_problems(
    file: str, where: str, replicas: int, clients: Iterable[tuple[str, int]]
) -> list[Problem]:
    """Planned MPS thread percentages the plugin's equal split cannot give (client, percent)."""
    share = 100 // replicas
    return [
        Problem(
            file,
            where,
            f"job {job} is planned at {pct} % of the threads but {replicas} MPS replicas give each "
            f"client at most {share} % (100 / replicas), and a client can only lower its share",
        )
        for job, pct in clients
        if pct > share
    ]


def validate_configmap(text: str, file: str) -> tuple[list[Problem], dict[str, dict[str, Any]]]:
    """A ConfigMap of named device-plugin configs: problems, and key -> parsed config."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return [Problem(file, "", f"not YAML: {str(exc).splitlines()[0]}")], {}
    if not isinstance(doc, Mapping):
        return [Problem(file, "", "must be a Kubernetes ConfigMap object")], {}
    problems: list[Problem] = []
    if doc.get("apiVersion") != "v1" or doc.get("kind") != "ConfigMap":
        problems.append(Problem(file, "", "must have apiVersion: v1 and kind: ConfigMap"))
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        problems.append(Problem(file, "metadata.name", "must be a DNS subdomain name"))
    data = doc.get("data")
    if not isinstance(data, Mapping) or not data:
        return [*problems, Problem(file, "data", "must map config names to config files")], {}
    if len(text.encode()) > CONFIGMAP_MAX_BYTES:
        problems.append(Problem(file, "", f"larger than the {CONFIGMAP_MAX_BYTES}-byte ConfigMap limit"))
    configs: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        at = f"data.{key}"
        if not isinstance(key, str) or len(key) > 253 or not _CONFIGMAP_KEY.match(key):
            problems.append(Problem(file, at, "a ConfigMap key is letters, digits, '-', '_', '.'"))
            continue
        if (why := label_value_problem(key)) is not None:
            problems.append(Problem(file, at, f"nodes select configs by label, so the key is one: {why}"))
        if not isinstance(value, str):
            problems.append(Problem(file, at, "must be the text of one config file"))
            continue
        try:
            config = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            problems.append(Problem(file, at, f"not YAML: {str(exc).splitlines()[0]}"))
            continue
        problems += validate_config(config, file, at)
        if isinstance(config, dict):
            configs[key] = config
    return problems, configs


_LABEL_LINE = re.compile(r"^kubectl label node (?P<node>\S+) (?P<labels>.+?) --overwrite$")


def validate_node_labels(
    text: str, file: str, configs: Mapping[str, object], nodes: Iterable[str] | None = None
) -> list[Problem]:
    """`kubectl label` lines: each selects a ConfigMap key that exists, on a node that exists."""
    known = set(nodes) if nodes is not None else None
    problems: list[Problem] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#") or line.strip() == "set -e":
            continue
        at = f"line {number}"
        match = _LABEL_LINE.match(line)
        if not match:
            problems.append(Problem(file, at, "expected: kubectl label node NODE KEY=VALUE... --overwrite"))
            continue
        node = match["node"]
        if known is not None and node not in known:
            problems.append(Problem(file, at, f"node {node!r} is not a host in the inventory"))
        if node in seen:
            problems.append(Problem(file, at, f"node {node!r} is labelled twice"))
        seen.add(node)
        for pair in match["labels"].split():
            key, _, value = pair.partition("=")
            if (why := label_value_problem(value)) is not None:
                problems.append(Problem(file, at, why))
            if key == CONFIG_LABEL and value not in configs:
                problems.append(Problem(file, at, f"{CONFIG_LABEL}={value} selects no key of the ConfigMap"))
    return problems
