"""Per node: the commands that apply the plan's changes in order, and the exact way back.

For each node the plan changes, `apply-<node>.sh` and `rollback-<node>.sh` (beside the tool files
they use). Apply first checks that the node still runs what the plan assumed (the jobs it moves
are still there) and stops otherwise; it then saves what the node has now, which rollback puts
back, before changing anything (in `$GPULENS_ROLLBACK_DIR/<node>`, by default
`~/.local/state/gpulens/rollback/<node>`: outside the report, which next week's run replaces):

- Kubernetes (run where `kubectl` reaches the cluster): cordon; save the node's device-plugin and
  MIG config labels; select the MIG layout (`nvidia.com/mig.config`, which the GPU operator's MIG
  manager applies from `mig-parted.yaml`) and the device-plugin config by label; delete the pods
  that move, so that their controllers start them again on what the node now advertises;
  uncordon. Rollback restores both labels as they were (or removes them) and restarts the same
  workloads' pods on the node again (found by workload: apply gave a Deployment's pod a new name).
- Slurm (run on the node, as root): drain; wait until the jobs on the changed GPUs have ended;
  save `nvidia-mig-parted export` and the node's gres.conf; apply the MIG layout; install the
  node's new gres.conf lines; `scontrol reconfigure`; resume. Rollback re-applies the exported
  MIG layout and the saved gres.conf the same way.

Every value that comes from the data (node names, pods, job ids) is shell-quoted: these scripts
run with cluster-admin or root rights, and a hostile pod name must not become a command.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulens.analyzer.hosts import Orchestrator
from gpulens.analyzer.nodestate import GpuChange
from gpulens.analyzer.workload import pod_owner

DEVICE_PLUGIN_LABEL = "nvidia.com/device-plugin.config"
MIG_LABEL = "nvidia.com/mig.config"
GRES_CONF = "/etc/slurm/gres.conf"


@dataclass(frozen=True)
class NodePlan:
    """What one node's scripts need: its changes and the configuration names emit chose for it."""

    host: str
    orchestrator: Orchestrator
    changes: tuple[GpuChange, ...]
    device_plugin_config: str | None  # the ConfigMap key its label selects (Kubernetes)
    mig_config: str | None  # its mig-parted config name, when its MIG layout changes
    gres_lines: tuple[str, ...] = ()  # its gres.conf lines (Slurm)
    pods: Mapping[str, tuple[str, str]] | None = None  # job id -> (namespace, pod) of moved pods
    # jobs on the node's changed GPUs now; None: not known (every moved job is taken to be here).
    # A job the plan brings from another node is that node's to check and restart: here, its pod
    # is on the other node, so a pre-check would always stop the script
    here: frozenset[str] | None = None


def apply_name(host: str) -> str:
    return f"apply-{_file_part(host)}.sh"


def rollback_name(host: str) -> str:
    return f"rollback-{_file_part(host)}.sh"


def gres_name(host: str) -> str:
    """A Slurm node's own gres.conf lines, which its apply script installs."""
    return f"gres-{_file_part(host)}.conf"


def _file_part(host: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in host)


def _q(value: str) -> str:
    return shlex.quote(value)


def _header(node: NodePlan, what: str) -> list[str]:
    lines = [
        "#!/bin/sh",
        f"# gpulens: {what} on node {node.host} ({node.orchestrator.value}). Changes:",
    ]
    lines += [f"#   GPU {c.index}: {c.before} -> {c.after}" for c in node.changes]
    lines += [
        "set -eu",
        'cd "$(dirname "$0")"',
        f"NODE={_q(node.host)}",
        "# what the node had before, kept outside the report (next week's report replaces this directory)",
        'SAVED="${GPULENS_ROLLBACK_DIR:-${HOME:-/root}/.local/state/gpulens/rollback}/$NODE"',
        'mkdir -p "$SAVED"',
    ]
    if what.startswith("apply"):
        lines.append(
            f"PLAN={plan_id(node)}  # a rerun of this same plan keeps what was saved before its first run"
        )
    return lines


def plan_id(node: NodePlan) -> str:
    text = "\n".join(f"{c.index} {c.before} -> {c.after}" for c in node.changes)
    return hashlib.sha256(f"{node.host}\n{text}".encode()).hexdigest()[:12]


def _saving(lines: list[str]) -> list[str]:
    """`lines` run only when this plan's state was not saved yet (then marked as saved)."""
    body = [f"  {line}" for line in lines]
    return [
        'if [ "$(cat "$SAVED/plan" 2>/dev/null || true)" != "$PLAN" ]; then',
        *body,
        '  echo "$PLAN" > "$SAVED/plan"',
        "fi",
    ]


def _moved_jobs(node: NodePlan) -> list[str]:
    return sorted({j for c in node.changes for j in c.jobs})


def kubernetes_scripts(node: NodePlan) -> tuple[str, str]:
    pods = node.pods or {}
    jobs = [job for job in _moved_jobs(node) if job in pods]
    moved = [pods[job] for job in jobs if node.here is None or job in node.here]
    arriving = [pods[job] for job in jobs if node.here is not None and job not in node.here]
    rollback = rollback_name(node.host)
    apply = _header(node, "apply the plan's changes")
    if arriving:
        apply += ["", "# pods the plan brings from other nodes (their nodes' scripts restart them):"]
        apply += [f"#   {ns}/{pod}" for ns, pod in arriving]
    apply += ["", "# the node still runs what the plan assumed"]
    for ns, pod in moved:
        where = f"kubectl get pod -n {_q(ns)} {_q(pod)} -o jsonpath='{{.spec.nodeName}}'"
        stale = _q(f"pre-check: pod {ns}/{pod} is no longer on the node: run gpulens report again")
        apply.append(f'[ "$({where})" = "$NODE" ] || {{ echo {stale} >&2; exit 1; }}')
    apply += [
        "",
        "# what the node has now, for rollback",
        *_saving(
            [
                f'{label_of(DEVICE_PLUGIN_LABEL)} > "$SAVED/previous-device-plugin-config"',
                f'{label_of(MIG_LABEL)} > "$SAVED/previous-mig-config"',
            ]
        ),
        "",
        "# no new pods while it changes",
        'kubectl cordon "$NODE"',
    ]
    if node.mig_config:
        apply += [
            "",
            "# the MIG layout: the GPU operator's MIG manager applies this config of mig-parted.yaml",
            f'kubectl label node "$NODE" {MIG_LABEL}={_q(node.mig_config)} --overwrite',
        ]
    if node.device_plugin_config:
        apply += [
            "",
            "# what the device plugin advertises (its config-manager follows the label)",
            f'kubectl label node "$NODE" {DEVICE_PLUGIN_LABEL}={_q(node.device_plugin_config)} --overwrite',
        ]
    if moved:
        apply += ["", "# the pods that move start again on what the node now advertises"]
        apply += [f"kubectl delete pod -n {_q(ns)} {_q(pod)} --wait=false" for ns, pod in moved]
    apply += ["", 'kubectl uncordon "$NODE"', f'echo "applied on $NODE; to undo: sh {rollback}"']

    back = _header(node, "undo what the apply script changed")
    back += [
        "",
        'test -f "$SAVED/previous-device-plugin-config" || '
        '{ echo "no saved state for $NODE in $SAVED: was the apply script run'
        ' (with the same GPULENS_ROLLBACK_DIR)?" >&2; exit 1; }',
        'kubectl cordon "$NODE"',
        "restore() {  # a label: its saved value back, or removed if the node had none",
        '  if [ -s "$2" ]; then kubectl label node "$NODE" "$1=$(cat "$2")" --overwrite;',
        '  else kubectl label node "$NODE" "$1-"; fi',
        "}",
    ]
    if node.mig_config:
        back.append(f'restore {MIG_LABEL} "$SAVED/previous-mig-config"')
    if node.device_plugin_config:
        back.append(f'restore {DEVICE_PLUGIN_LABEL} "$SAVED/previous-device-plugin-config"')
    if moved:
        # by workload: a Deployment's pod restarted by apply has a new name now
        back += ["", "# the moved workloads' pods (by workload: apply renamed them) start again as before"]
        for ns, pod in moved:
            owner = pod_owner(pod)
            pattern = f"^pod/{re.escape(owner)}$" if owner == pod else f"^pod/{re.escape(owner)}-"
            back.append(
                f'kubectl get pods -n {_q(ns)} --field-selector spec.nodeName="$NODE" -o name '
                f"| {{ grep -E {_q(pattern)} || true; }} "
                f'| while read -r p; do kubectl delete -n {_q(ns)} "$p" --wait=false; done'
            )
    back += ['kubectl uncordon "$NODE"', 'echo "rolled back on $NODE"']
    return "\n".join(apply) + "\n", "\n".join(back) + "\n"


def label_of(label: str) -> str:
    """The command that prints the node's value of `label` (nothing when it has none)."""
    path = label.replace(".", "\\.")
    return f"kubectl get node \"$NODE\" -o jsonpath='{{.metadata.labels.{path}}}'"


def slurm_scripts(node: NodePlan, mig_file: str, gres_fragment: str) -> tuple[str, str]:
    jobs = [job for job in _moved_jobs(node) if node.here is None or job in node.here]  # not arriving ones
    rollback = rollback_name(node.host)
    saved_gres = "$SAVED/slurm-gres.before"
    apply = _header(node, "apply the plan's changes (run on the node, as root)")
    apply += [f'GRES_CONF="${{GRES_CONF:-{GRES_CONF}}}"', "", "# the node still runs what the plan assumed"]
    for job in jobs:
        stale = _q(f"note: job {job} no longer runs on the node (ended or moved): the plan may be stale")
        apply.append(f'squeue -h -j {_q(job)} -o %N 2>/dev/null | grep -qw "$NODE" || echo {stale} >&2')
    apply += [
        "",
        "# no new jobs; the GPUs change once the jobs on them have ended (their next runs ask for the",
        "# --gres of the plan: the '# job' lines of gres.conf)",
        'scontrol update NodeName="$NODE" State=DRAIN Reason="gpulens: applying the rightsizing plan"',
    ]
    if jobs:
        ids = "".join(f" -e {_q(j)}" for j in jobs)
        apply.append(f'while squeue -h -w "$NODE" -o %i | grep -qxF{ids}; do sleep 30; done')
    apply += [
        "",
        "# what the node has now, for rollback",
    ]
    saving = [
        'cp "$GRES_CONF" "$SAVED/gres.conf.before"',
        f"scontrol show node \"$NODE\" -o | tr ' ' '\\n' | grep '^Gres=' > \"{saved_gres}\" || true",
    ]
    if node.mig_config:
        saving.append('nvidia-mig-parted export > "$SAVED/mig-parted.before.yaml"')
    apply += _saving(saving)
    if node.mig_config:
        apply += [
            "",
            "# the MIG layout",
            f"nvidia-mig-parted apply -f {_q(mig_file)} -c {_q(node.mig_config)}",
        ]
    apply += [
        "",
        "# the node's GPUs in gres.conf: its own NodeName= lines replaced, other nodes' kept (a line",
        "# naming it inside a host range, NodeName=gpu[01-08], is not recognised: split it first)",
        f'{{ grep -v "^NodeName=$NODE " "$GRES_CONF" || true; cat {_q(gres_fragment)}; }}'
        ' > "$SAVED/gres.conf.new"',
        'install -m 644 "$SAVED/gres.conf.new" "$GRES_CONF"',
        "scontrol reconfigure",
        'scontrol update NodeName="$NODE" State=RESUME',
        f'echo "applied on $NODE; set its slurm.conf Gres= as slurm-nodes.conf says'
        f' (it was: $(cat "{saved_gres}"))"',
        f'echo "to undo: sh {rollback}"',
    ]
    back = _header(node, "undo what the apply script changed (run on the node, as root)")
    back += [
        f'GRES_CONF="${{GRES_CONF:-{GRES_CONF}}}"',
        "",
        'test -f "$SAVED/gres.conf.before" || '
        '{ echo "no saved state for $NODE in $SAVED: was the apply script run'
        ' (with the same GPULENS_ROLLBACK_DIR)?" >&2; exit 1; }',
        'scontrol update NodeName="$NODE" State=DRAIN Reason="gpulens: rolling back the rightsizing plan"',
        'while squeue -h -w "$NODE" -o %i | grep -q .; do sleep 30; done  # its GPUs must be idle',
    ]
    if node.mig_config:
        back.append('nvidia-mig-parted apply -f "$SAVED/mig-parted.before.yaml"')
    back += [
        'install -m 644 "$SAVED/gres.conf.before" "$GRES_CONF"',
        "scontrol reconfigure",
        'scontrol update NodeName="$NODE" State=RESUME',
        f'echo "rolled back on $NODE; set its slurm.conf Gres= back to: $(cat "{saved_gres}")"',
    ]
    return "\n".join(apply) + "\n", "\n".join(back) + "\n"


def node_files(nodes: Sequence[NodePlan], mig_file: str) -> dict[str, str]:
    """apply-<node>.sh, rollback-<node>.sh (and a Slurm node's gres.conf lines) per changed node."""
    files: dict[str, str] = {}
    for node in nodes:
        if node.orchestrator is Orchestrator.SLURM:
            fragment = gres_name(node.host)
            files[fragment] = "\n".join(node.gres_lines) + "\n"
            files[apply_name(node.host)], files[rollback_name(node.host)] = slurm_scripts(
                node, mig_file, fragment
            )
        elif node.orchestrator is Orchestrator.KUBERNETES:
            files[apply_name(node.host)], files[rollback_name(node.host)] = kubernetes_scripts(node)
    return files
