"""How a report's device-plugin files share one Kubernetes node's GPUs, as the plugin applies them.

`gpulens report` writes, for the Kubernetes nodes whose sharing it changes, a ConfigMap of named
NVIDIA device-plugin configs (`config/device-plugin-configmap.yaml`) and a script that selects one
per node by label (`config/node-labels.sh`). Applying a plan the way the plugin would (`applyplan`,
`history_apply`) needs what that selection does, which is not always what `plan.json` asked:

- the plugin's MPS shares every GPU of a node and gives every client the control daemon's default
  thread share, `100 / replicas` (integer division; k8s-device-plugin
  cmd/mps-control-daemon/mps/daemon.go), not a per-job percentage, and its default pinned device
  memory limit, the GPU's total / replicas in whole MiB, not the plan's: a pod's own
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE or pinned limit could only tighten them, and the plan does not
  ask pods for one;
- where the emitted config time-slices a node the plan wanted on MPS (MPS beside whole GPUs or MIG,
  or a planned share above `100 / replicas`; `analyzer/emit.py`), its GPUs are time-sliced.

A node the files do not name keeps the config it runs now.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpulens.analyzer.emit import CONFIGMAP_FILE, LABELS_FILE
from gpulens.analyzer.pluginsharing import PluginSharing
from gpulens.analyzer.validate.device_plugin import CONFIG_LABEL
from gpulens.safeload import InputError, load_yaml, load_yaml_file, read_text

# where the plugin's MPS pipe directory is inside pods (<mps root>/<resource name>/pipe under /mps)
DEVICE_PLUGIN_PIPE_DIR = "/mps/nvidia.com/gpu/pipe"
MAX_LABEL_SCRIPT_BYTES = 4 * 1024 * 1024
MIB = 1024**2


def daemon_pinned_limit(total_bytes: int, replicas: int) -> int:
    """The pinned device memory limit the plugin's MPS control daemon sets for every client of a
    GPU with `total_bytes`: total / replicas, in whole MiB (it writes `<N>M`)."""
    return total_bytes // replicas // MIB * MIB


@dataclass(frozen=True)
class SelectedConfig:
    """The device-plugin config a report selects for one node."""

    config: str  # its key in the ConfigMap
    sharing: PluginSharing  # the analyzer's own vocabulary for the plugin's strategy
    replicas: int = 1

    @property
    def thread_percentage(self) -> int:
        """Each MPS client's thread share: the control daemon's default, 100 / replicas."""
        return 100 // self.replicas

    def pinned_limit(self, total_bytes: int) -> int:
        """Each MPS client's pinned memory limit on a GPU of `total_bytes`: the daemon's default."""
        return daemon_pinned_limit(total_bytes, self.replicas)


class NodeSharingError(ValueError):
    """A report whose device-plugin files cannot be read; one line naming the file and field."""


def selected_config(labels: Path, host: str) -> str | None:
    """The config key `node-labels.sh` selects for `host` (None: the script does not label it)."""
    try:
        text = read_text(labels, MAX_LABEL_SCRIPT_BYTES, str(labels))
    except FileNotFoundError:
        return None
    except (OSError, InputError) as e:
        raise NodeSharingError(
            f"{labels}: expected a readable script, found {str(e).splitlines()[0]}"
        ) from None
    chosen = None
    for n, line in enumerate(text.splitlines(), 1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as e:
            raise NodeSharingError(f"{labels}: line {n}: expected shell words, found {e}") from None
        if words[:3] != ["kubectl", "label", "node"] or len(words) < 4 or words[3] != host:
            continue
        for word in words[4:]:
            name, sep, value = word.partition("=")
            if name == CONFIG_LABEL and sep:
                chosen = value
    return chosen


def _block(where: str, config: Any) -> tuple[PluginSharing, int]:
    sharing = config.get("sharing") if isinstance(config, dict) else None
    if sharing is None:
        return PluginSharing.EXCLUSIVE, 1
    if not isinstance(sharing, dict):
        raise NodeSharingError(f"{where}.sharing: expected a mapping, found {sharing!r}")
    kind = (
        PluginSharing.MPS
        if "mps" in sharing
        else PluginSharing.TIME_SLICING
        if "timeSlicing" in sharing
        else None
    )
    if kind is None:
        return PluginSharing.EXCLUSIVE, 1
    key = "mps" if kind is PluginSharing.MPS else "timeSlicing"
    resources = sharing[key].get("resources") if isinstance(sharing[key], dict) else None
    found = [r.get("replicas") for r in resources or [] if isinstance(r, dict)]
    replicas = [r for r in found if isinstance(r, int) and not isinstance(r, bool) and r >= 1]
    if not replicas or len(replicas) != len(found):
        raise NodeSharingError(
            f"{where}.sharing.{key}.resources: expected resources with replicas >= 1, found {resources!r}"
        )
    return kind, max(replicas)


def read_node_sharing(config_dir: Path, host: str) -> SelectedConfig | None:
    """What the report in `config_dir` makes of `host`'s sharing; None when it does not change it."""
    key = selected_config(config_dir / LABELS_FILE, host)
    if key is None:
        return None
    path = config_dir / CONFIGMAP_FILE
    try:
        doc = load_yaml_file(path, str(path))
    except FileNotFoundError:
        raise NodeSharingError(
            f"{path}: expected the ConfigMap {LABELS_FILE} selects {key!r} from, found none"
        ) from None
    except (OSError, InputError, yaml.YAMLError) as e:
        raise NodeSharingError(f"{path}: expected valid YAML, found {str(e).splitlines()[0]}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    text = data.get(key) if isinstance(data, dict) else None
    if not isinstance(text, str):
        raise NodeSharingError(f"{path}: data.{key}: expected the config {LABELS_FILE} selects for {host}")
    try:
        config = load_yaml(text)
    except (InputError, yaml.YAMLError) as e:
        raise NodeSharingError(f"{path}: data.{key}: expected YAML, found {str(e).splitlines()[0]}") from None
    sharing, replicas = _block(f"{path}: data.{key}", config)
    return SelectedConfig(key, sharing, replicas)
