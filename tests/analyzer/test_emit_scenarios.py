"""Every shipped scenario's history, the week-pair fleet (a plan that re-slices MIG and frees GPUs:
the shipped scenarios' plans may change no MIG layout) and the usage trace: each emitted file passes
its validator and,
where the consuming tool can run here, the tool itself (slurmd -G, NVIDIA's go-nvlib/go-nvml,
the Kubernetes schema)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpulens.analyzer import emit as em
from gpulens.analyzer.history import read_history
from gpulens.analyzer.hosts import Orchestrator
from gpulens.analyzer.importers import import_trace
from gpulens.analyzer.pipeline import Analysis, analyze_history
from gpulens.analyzer.thresholds import load_thresholds
from gpulens.catalog import get_model
from gpulens.sim.history import simulate
from gpulens.sim.scenariofile import BUILTIN_DIR
from tests.analyzer.nodefiles import check_all
from tests.analyzer.slurmd import require_slurmd, slurmd_gres
from tests.analyzer.test_emit import migcheck
from tests.analyzer.test_traces import GENAI

SCENARIOS = sorted(p.stem for p in Path(BUILTIN_DIR).glob("*.yaml"))
HOURS = {"large": 0.5}  # the 1,000-job bench node: half an hour is plenty and keeps the test short
WEEKPAIR = Path(__file__).resolve().parents[1] / "data" / "weekpair"
# the week pair's two Kubernetes nodes: a MIG re-slice and a kept trainer; pods packed on MPS
WEEKPAIR_NODES = (WEEKPAIR / "week1.yaml", WEEKPAIR / "week1-shared.yaml")


@pytest.fixture(scope="module")
def analyses(tmp_path_factory) -> dict[str, Analysis]:
    th = load_thresholds()
    out: dict[str, Analysis] = {}
    for name in SCENARIOS:
        path = tmp_path_factory.mktemp("emit") / name
        simulate(name, duration_s=HOURS.get(name, 1.0) * 3600, out=path, step_s=120, seed=0)
        out[name] = analyze_history(read_history(path), th, with_archetypes=False)
    path = tmp_path_factory.mktemp("emit") / "weekpair-week1"
    simulate([str(p) for p in WEEKPAIR_NODES], duration_s=6 * 3600, out=path, step_s=120, seed=0)
    out["weekpair-week1"] = analyze_history(read_history(path), th, with_archetypes=False)
    if GENAI.is_dir():
        path = tmp_path_factory.mktemp("genai") / "history"
        import_trace("alibaba-genai-2026", GENAI, path, get_model("H100-80GB"))
        out["alibaba-genai-2026"] = analyze_history(read_history(path), th, with_archetypes=False)
    return out


def test_the_scenarios_are_all_covered(analyses):
    assert set(SCENARIOS) <= set(analyses) and len(SCENARIOS) >= 5


def test_every_emitted_file_passes_its_validator(analyses):
    for name, analysis in analyses.items():
        emitted = analysis.emitted
        assert emitted is not None and emitted.placement is not None, name
        mig_names = {h: em.config_name("gpulens", h) for h in emitted.placement.inventory.hosts()}
        problems = em.validate_files(emitted.files, emitted.placement.inventory, mig_names)
        assert problems == [], f"{name}: {problems[0]}"


def test_every_nodes_files_describe_one_state_after_the_plan(analyses):
    for name, analysis in analyses.items():
        assert check_all(analysis.emitted) == [], name


def test_a_node_the_plan_does_not_change_is_in_no_file(analyses):
    for name, analysis in analyses.items():
        changed = {c.host for c in analysis.emitted.changes}
        for host in set(analysis.emitted.placement.inventory.hosts()) - changed:
            for file, text in analysis.emitted.files.items():
                assert not re.search(rf"(NodeName=|node ){re.escape(host)}\b", text), (name, host, file)


def test_k8s_a100_mixed_changes_no_nodes_mode(analyses):
    emitted = analyses["k8s-a100-mixed"].emitted
    assert emitted.changes == [] and emitted.files == {}


def test_slurm_node_names_are_the_hosts_the_gpus_reported(analyses):
    for name, analysis in analyses.items():
        hosts = set(analysis.emitted.placement.inventory.hosts())
        for line in analysis.emitted.files.get("gres.conf", "").splitlines():
            if line.startswith("NodeName="):
                assert line.split()[0].removeprefix("NodeName=") in hosts, (name, line)


def test_slurm_mps_shares_per_gpu_sum_to_at_most_100(analyses):
    for name, analysis in analyses.items():
        sums: dict[str, int] = {}
        for line in analysis.emitted.files.get("gres.conf", "").splitlines():
            if "--gres=mps:" in line:
                gpu = " ".join(line.split()[4:6])  # "<node> /dev/nvidiaN:"
                sums[gpu] = sums.get(gpu, 0) + int(line.rsplit("--gres=mps:", 1)[1].split()[0])
        assert all(total <= 100 for total in sums.values()), (name, sums)


def test_no_device_plugin_config_has_fewer_than_two_replicas(analyses):
    for name, analysis in analyses.items():
        text = analysis.emitted.files.get("device-plugin-configmap.yaml")
        if text is None:
            continue
        for key, config in yaml.safe_load(text)["data"].items():
            for block in (yaml.safe_load(config).get("sharing") or {}).values():
                assert all(r["replicas"] >= 2 for r in block["resources"]), (name, key)


def test_real_slurmd_reads_every_emitted_gres_conf(analyses, tmp_path):
    require_slurmd()
    checked = 0
    for name, analysis in analyses.items():
        files = analysis.emitted.files
        if "gres.conf" not in files:
            continue
        for host in analysis.emitted.placement.inventory.hosts():
            own = [line for line in files["gres.conf"].splitlines() if line.startswith(f"NodeName={host} ")]
            if not own or any("AutoDetect=nvml" in line for line in own):
                continue  # MIG hosts need AutoDetect=nvml: Debian's slurmd has no gpu/nvml plugin
            gpus = len(analysis.emitted.placement.inventory.on(host))
            work = tmp_path / f"{name}-{host}"
            work.mkdir()
            lines = slurmd_gres(work, files["gres.conf"], files["slurm-nodes.conf"], host, gpus)
            assert sum(int(g["count"]) for g in lines if g["name"] == "gpu") == gpus, (name, host)
            checked += 1
    assert checked >= 1


def test_nvidias_mig_tables_accept_every_emitted_mig_parted_config(analyses, tmp_path):
    binary = migcheck()
    checked = 0
    for name, analysis in analyses.items():
        text = analysis.emitted.files.get("mig-parted.yaml")
        if text is None:
            continue
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        done = subprocess.run([binary, str(path)], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
        checked += 1
    assert checked >= 1


def test_every_emitted_configmap_passes_the_kubernetes_schema(analyses):
    validator = pytest.importorskip("kubernetes_validate")
    checked = 0
    for analysis in analyses.values():
        text = analysis.emitted.files.get("device-plugin-configmap.yaml")
        if text is None:
            continue
        validator.validate(yaml.safe_load(text), validator.latest_version(), strict=True)
        checked += 1
    assert checked >= 1, "a Kubernetes scenario whose plan changes a node should emit a ConfigMap"


def test_every_listed_action_recovers_gpu_hours_or_fixes_a_named_risk(analyses):
    for name, analysis in analyses.items():
        for action in analysis.top_actions(len(analysis.recs)):
            assert action["gpu_hours_recovered"] > 0 or action["risk_fixed"], (name, action["job_id"])
            assert " -> " in action["change"], (name, action["change"])


def test_a_job_the_report_keeps_stays_on_the_gpu_it_runs_on(analyses):
    for name, analysis in analyses.items():
        kept = analysis.recs[analysis.recs["action"] == "keep"]
        for row in kept.itertuples(index=False):
            assert not row.proposed_gpu or row.proposed_gpu in str(row.current_gpu).split(","), (
                name,
                row.job_id,
                row.change,
            )


def test_a_move_that_empties_a_gpu_the_plan_frees_is_never_keep(analyses):
    for name, analysis in analyses.items():
        emptied = {g["uuid"] for g in analysis.plan.freed if g.get("why") == "freed by consolidation"}
        for row in analysis.recs.itertuples(index=False):
            now = set(str(row.current_gpu or "").split(",")) - {""}
            moved = bool(row.proposed_gpu) and row.proposed_gpu not in now
            if now and now <= emptied and moved:
                assert row.action != "keep", (name, row.job_id, row.change)


def test_every_nodes_apply_and_rollback_scripts_pass_shellcheck(analyses, tmp_path):
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (make test installs it)")
    paths = []
    for name, analysis in analyses.items():
        for file, text in analysis.emitted.files.items():
            if file.startswith(("apply-", "rollback-")):
                path = tmp_path / f"{name}-{file}"
                path.write_text(text)
                paths.append(str(path))
        inventory = analysis.emitted.placement.inventory
        changed = {c.host for c in analysis.emitted.changes}
        known = {h for h in changed if inventory.orchestrator(h) is not Orchestrator.UNKNOWN}
        scripted = {s.file for s in analysis.emitted.apply if s.file.startswith("apply-")}
        assert len(scripted) == len(known), name
        unknown = changed - known
        assert all(any(h in n and "by hand" in n for n in analysis.emitted.notes) for h in unknown), name
    assert paths
    done = subprocess.run([shellcheck, "-s", "sh", *paths], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout


def _as_planned(emitted: em.Emitted) -> em.FleetContext:
    """The fleet as it runs once the plan is applied: every job on its placed GPU, in its mode."""
    from gpulens.analyzer.nodestate import planned_mode

    assert emitted.placement is not None
    rows, gpus = [], []
    for slot in emitted.placement.inventory.gpus:
        gpus.append({"uuid": slot.uuid, "model": slot.model, "instance": slot.host, "gpu": str(slot.index)})
    for gpu in emitted.placement.gpus:
        mode = planned_mode(gpu, emitted.now.get(gpu.uuid))
        profiles = {str(s["job_id"]): str(s["profile"]) for s in gpu.entry.get("mig_layout", [])}
        for job in gpu.jobs:
            rows.append(
                {
                    "job_id": job,
                    "uuids": gpu.uuid,
                    "instance": gpu.host,
                    "gpu_model": gpu.model,
                    "job_source": emitted.placement.inventory.orchestrator(gpu.host).value,
                    "start": 0.0,
                    "end": 3600.0,
                    "sharing": mode.value,
                    "mig_profile_now": profiles.get(job, ""),
                }
            )
    return em.context_from_rows(rows, gpus)


def test_a_fleet_already_in_its_proposed_state_gets_no_change(analyses):
    for name, analysis in analyses.items():
        again = em.emit(analysis.plan, _as_planned(analysis.emitted))
        assert again.changes == [] and again.files == {}, (name, again.changes[:3])
