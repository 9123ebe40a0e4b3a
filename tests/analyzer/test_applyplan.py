"""Per-node apply and rollback scripts (issue 30 item 3), run against stand-ins for kubectl and Slurm.

The stand-ins keep what the real commands would change (a node's labels, cordon state, deleted
pods; gres.conf, drain state) in files, so a test runs the emitted script with `sh` and reads
what it did: apply then rollback leaves the node as it was, a failed pre-check changes nothing.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from gpulens.analyzer import emit as em
from gpulens.analyzer.applyplan import apply_name, rollback_name
from tests.analyzer.test_emit import H100, whole_gpu
from tests.analyzer.test_emit_changes import fleet, mig_gpu, mps_gpu, on, plan

A100_80 = "A100-80GB"

FAKE_KUBECTL = r"""#!/bin/sh
# stand-in for kubectl: labels in $STATE/labels (key=value lines), pods in $STATE/pods (ns/pod node)
set -eu
log() { echo "$*" >> "$STATE/calls"; }
log "$@"
case "$1" in
  get)
    if [ "$2" = pod ]; then grep "^$4/$5 " "$STATE/pods" | cut -d' ' -f2 | tr -d '\n'; exit 0; fi
    if [ "$2" = pods ]; then  # get pods -n NS --field-selector spec.nodeName=NODE -o name
      node=${6#spec.nodeName=}
      grep " $node\$" "$STATE/pods" | grep "^$4/" | cut -d' ' -f1 | sed "s|^$4/|pod/|"; exit 0
    fi
    key=$(echo "$5" | sed -e 's/.*labels\.//' -e 's/}$//' -e 's/\\//g')
    grep "^$key=" "$STATE/labels" | cut -d= -f2- | tr -d '\n' || true ;;
  label)
    shift 3
    for arg in "$@"; do
      case "$arg" in
        --overwrite) ;;
        *-) grep -v "^${arg%-}=" "$STATE/labels" > "$STATE/l" || true; mv "$STATE/l" "$STATE/labels" ;;
        *) grep -v "^${arg%%=*}=" "$STATE/labels" > "$STATE/l" || true
           echo "$arg" >> "$STATE/l"; mv "$STATE/l" "$STATE/labels" ;;
      esac
    done ;;
  cordon) echo cordoned > "$STATE/cordon" ;;
  uncordon) echo schedulable > "$STATE/cordon" ;;
  delete)  # delete pod -n NS NAME, or delete -n NS pod/NAME
    if [ "$2" = pod ]; then echo "$4/$5"; else echo "$3/${4#pod/}"; fi >> "$STATE/deleted" ;;
esac
"""

FAKE_SLURM = r"""#!/bin/sh
# stand-in for squeue / scontrol / nvidia-mig-parted: calls logged, node state in $STATE
echo "$(basename "$0") $*" >> "$STATE/calls"
case "$(basename "$0")" in
  squeue) [ "${2:-}" = -j ] && echo "$NODE_HERE" ;;
  scontrol) [ "$1" = show ] && echo "NodeName=$NODE_HERE Gres=gpu:4 State=IDLE" ;;
  nvidia-mig-parted) [ "$1" = export ] && echo "version: v1" ;;
esac
exit 0
"""


def stand_in(directory: Path, name: str, text: str) -> None:
    path = directory / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_script(
    workdir: Path, files: dict[str, str], name: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    for file, text in files.items():
        (workdir / file).write_text(text)
    return subprocess.run(
        ["sh", str(workdir / name)], capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


@pytest.fixture
def kube(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    stand_in(bin_dir, "kubectl", FAKE_KUBECTL)
    (state / "labels").write_text("nvidia.com/device-plugin.config=gpulens-exclusive\n")
    (state / "pods").write_text("team/a-5f6b8d9c47-q8wzt n1\nteam/b-0 n1\n")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state)}
    return state, env | {"GPULENS_ROLLBACK_DIR": str(tmp_path / "saved")}


def kube_plan() -> em.Emitted:
    ctx = fleet({"n1": [("exclusive", "a"), ("exclusive", "b")]})
    pods = {"a": ("team", "a-5f6b8d9c47-q8wzt"), "b": ("team", "b-0")}  # a Deployment's pod, a StatefulSet's
    ctx = em.FleetContext(
        ctx.inventory, ctx.job_uuids, ctx.windows, ctx.mig_now, ctx.now, ctx.now_known, pods
    )
    return em.emit(plan(on(mps_gpu("s", ("a", 40), ("b", 40), model=A100_80), "n1", 0)), ctx)


def test_a_changed_kubernetes_node_gets_an_apply_and_a_rollback_script():
    out = kube_plan()
    assert {apply_name("n1"), rollback_name("n1")} <= set(out.files)


def test_kubernetes_apply_relabels_the_node_restarts_the_moved_pods_and_rollback_undoes_it(kube, tmp_path):
    state, env = kube
    files = kube_plan().files
    before = (state / "labels").read_text()
    applied = run_script(tmp_path, files, apply_name("n1"), env)
    assert applied.returncode == 0, applied.stderr
    assert "nvidia.com/device-plugin.config=gpulens-mps-2" in (state / "labels").read_text()
    assert (state / "deleted").read_text().split() == ["team/a-5f6b8d9c47-q8wzt", "team/b-0"]
    assert (state / "cordon").read_text().strip() == "schedulable"
    (state / "pods").write_text(
        "team/a-7d9f8c6b5-x2kqp n1\nteam/b-0 n1\nteam/other-0 n1\n"
    )  # a's successor after the rollout
    (state / "deleted").write_text("")
    undone = run_script(tmp_path, files, rollback_name("n1"), env)
    assert undone.returncode == 0, undone.stderr
    assert (state / "labels").read_text() == before
    assert sorted((state / "deleted").read_text().split()) == ["team/a-7d9f8c6b5-x2kqp", "team/b-0"]
    assert (state / "cordon").read_text().strip() == "schedulable"


def test_kubernetes_apply_changes_nothing_when_a_moved_pod_left_the_node(kube, tmp_path):
    state, env = kube
    (state / "pods").write_text("team/a-5f6b8d9c47-q8wzt n2\nteam/b-0 n1\n")
    before = (state / "labels").read_text()
    applied = run_script(tmp_path, kube_plan().files, apply_name("n1"), env)
    assert applied.returncode != 0 and "team/a-5f6b8d9c47-q8wzt is no longer on the node" in applied.stderr
    assert (state / "labels").read_text() == before
    assert not (state / "cordon").exists()


def test_a_hostile_pod_name_is_quoted_never_run(kube, tmp_path):
    _, env = kube
    ctx = fleet({"n1": [("exclusive", "a"), ("exclusive", "b")]})
    pods = {"a": ("team", "a-0; touch pwned"), "b": ("team", "$(touch pwned)")}
    ctx = em.FleetContext(
        ctx.inventory, ctx.job_uuids, ctx.windows, ctx.mig_now, ctx.now, ctx.now_known, pods
    )
    out = em.emit(plan(on(mps_gpu("s", ("a", 40), ("b", 40), model=A100_80), "n1", 0)), ctx)
    run_script(tmp_path, out.files, apply_name("n1"), env)
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_slurm_apply_replaces_only_the_nodes_gres_lines_and_rollback_restores_the_file(tmp_path):
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for tool in ("squeue", "scontrol", "nvidia-mig-parted"):
        stand_in(bin_dir, tool, FAKE_SLURM)
    (tmp_path / "etc").mkdir()
    gres = tmp_path / "etc" / "gres.conf"  # the node's file, not the emitted one of that name
    original = "NodeName=other Name=gpu File=/dev/nvidia0\nNodeName=s1 Name=gpu File=/dev/nvidia[0-2]\n"
    gres.write_text(original)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state), "GRES_CONF": str(gres)}
    env["GPULENS_ROLLBACK_DIR"] = str(tmp_path / "saved")
    env["NODE_HERE"] = "s1"
    ctx = fleet({"s1": [("mig", "a@3g.40gb"), ("exclusive", "b"), ("exclusive", "c")]}, "slurm", H100)
    out = em.emit(plan(on(mig_gpu("m", ("b", "3g.40gb"), ("c", "2g.20gb"), ("a", "1g.10gb")), "s1", 1)), ctx)
    applied = run_script(tmp_path, out.files, apply_name("s1"), env)
    assert applied.returncode == 0, applied.stderr
    lines = gres.read_text().splitlines()
    assert lines[0] == "NodeName=other Name=gpu File=/dev/nvidia0"
    assert "NodeName=s1 AutoDetect=nvml" in lines
    calls = (state / "calls").read_text()
    assert "nvidia-mig-parted apply -f mig-parted.yaml -c gpulens-s1" in calls
    assert calls.index("State=DRAIN") < calls.index("nvidia-mig-parted apply") < calls.index("State=RESUME")
    undone = run_script(tmp_path, out.files, rollback_name("s1"), env)
    assert undone.returncode == 0, undone.stderr
    assert gres.read_text() == original
    saved = tmp_path / "saved" / "s1" / "mig-parted.before.yaml"
    assert f"nvidia-mig-parted apply -f {saved}" in (state / "calls").read_text()


def test_every_generated_script_passes_shellcheck(tmp_path):
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (make test installs it)")
    scripts = {**kube_plan().files}
    ctx = fleet({"s1": [("mig", "a@3g.40gb"), ("exclusive", "b"), ("exclusive", "c")]}, "slurm", H100)
    scripts |= em.emit(
        plan(on(mig_gpu("m", ("b", "3g.40gb"), ("c", "2g.20gb"), ("a", "1g.10gb")), "s1", 1)), ctx
    ).files
    paths = []
    for name, text in scripts.items():
        if name.startswith(("apply-", "rollback-")):
            (tmp_path / name).write_text(text)
            paths.append(str(tmp_path / name))
    assert len(paths) == 4
    done = subprocess.run([shellcheck, "-s", "sh", *paths], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout


def test_a_rerun_of_the_same_apply_keeps_the_state_saved_before_its_first_run(kube, tmp_path):
    state, env = kube
    files = kube_plan().files
    assert run_script(tmp_path, files, apply_name("n1"), env).returncode == 0
    assert run_script(tmp_path, files, apply_name("n1"), env).returncode == 0  # e.g. after a failure
    saved = (tmp_path / "saved" / "n1" / "previous-device-plugin-config").read_text()
    assert saved == "gpulens-exclusive"  # not the label the first run set
    assert run_script(tmp_path, files, rollback_name("n1"), env).returncode == 0
    assert (state / "labels").read_text() == "nvidia.com/device-plugin.config=gpulens-exclusive\n"


def test_a_pod_moved_in_from_another_node_is_neither_checked_nor_restarted_by_this_nodes_script(
    kube, tmp_path
):
    """The pre-check asks whether a moved pod is still on the node: a pod the plan brings from n1
    to n2 is on n1 until n1's script restarts it, so n2's script must not ask (it would always stop)."""
    state, env = kube
    (state / "pods").write_text("team/a-5f6b8d9c47-q8wzt n1\nteam/b-0 n1\nteam/c-0 n2\n")
    ctx = fleet({"n1": [("exclusive", "a"), ("exclusive", "b")], "n2": [("exclusive", "c")]})
    pods = {"a": ("team", "a-5f6b8d9c47-q8wzt"), "b": ("team", "b-0"), "c": ("team", "c-0")}
    ctx = em.FleetContext(
        ctx.inventory, ctx.job_uuids, ctx.windows, ctx.mig_now, ctx.now, ctx.now_known, pods
    )
    layout = [
        on(mps_gpu("s", ("a", 40), ("c", 40), model=A100_80), "n2", 0),
        on(whole_gpu("g", "b", model=A100_80), "n1", 1),
    ]
    out = em.emit(plan(*layout), ctx)
    applied = run_script(tmp_path, out.files, apply_name("n2"), env)
    assert applied.returncode == 0, applied.stderr
    assert (state / "deleted").read_text().split() == ["team/c-0"]
    (state / "deleted").write_text("")
    left = run_script(tmp_path, out.files, apply_name("n1"), env)  # a leaves n1: n1 restarts it
    assert left.returncode == 0, left.stderr
    assert (state / "deleted").read_text().split() == ["team/a-5f6b8d9c47-q8wzt"]
