"""`gpulens sim run|list|validate`: programs using pynvml run unmodified on a simulated node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.sim.launcher import ENV_PROCFS, ENV_SCENARIO, ENV_SHM, child_environment, native_environment
from tests.sim.test_native_driver import C_PROGRAM

COUNT = "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"


def gpulens(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpulens.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_run_serves_the_scenario_to_pynvml_in_the_child() -> None:
    result = gpulens("sim", "run", "dgx-h100", "--", sys.executable, "-c", COUNT)
    assert (result.returncode, result.stdout, result.stderr) == (0, "8\n", "")


def test_pynvml_in_the_child_loads_the_native_library_by_its_usual_name() -> None:
    code = COUNT + "; print(pynvml.nvmlLib._name)"
    result = gpulens("sim", "run", "dgx-h100", "--", sys.executable, "-c", code)
    assert result.stdout == "8\nlibnvidia-ml.so.1\n", result.stderr


def test_run_finds_python_on_the_path_of_gpulens_environment() -> None:
    result = gpulens("sim", "run", "dgx-h100", "--", "python", "-c", COUNT)
    assert result.stdout == "8\n"


CTYPES_COUNT = (
    "import ctypes; lib = ctypes.CDLL('libnvidia-ml.so.1'); n = ctypes.c_uint(); "
    "assert lib.nvmlInit_v2() == 0; assert lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0; print(n.value)"
)


def test_an_interpreter_without_gpulens_runs_on_the_native_library(tmp_path: Path) -> None:
    # a bare virtual environment: the base interpreter without gpulens' site-packages
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = str(tmp_path / "bare" / "bin" / "python")
    result = gpulens("sim", "run", "dgx-h100", "--", bare, "-c", CTYPES_COUNT)
    assert (result.returncode, result.stdout) == (0, "8\n"), result.stderr
    # it is told once that psutil cannot see the simulated processes, not stopped
    assert result.stderr.count("cannot import gpulens") == 1


def test_the_python_driver_still_needs_gpulens_in_the_interpreter(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = str(tmp_path / "bare" / "bin" / "python")
    result = gpulens("sim", "run", "dgx-h100", "--driver", "python", "--", bare, "-c", "print(1)")
    assert result.returncode == 2
    assert "use gpulens' interpreter" in result.stderr


def test_run_passes_the_exit_code_through() -> None:
    result = gpulens("sim", "run", "dgx-h100", "--", sys.executable, "-c", "raise SystemExit(7)")
    assert result.returncode == 7


def test_run_reports_a_program_that_cannot_start() -> None:
    result = gpulens("sim", "run", "dgx-h100", "--", "/nonexistent/program")
    assert result.returncode == 127
    assert result.stderr.count("\n") == 1 and "/nonexistent/program" in result.stderr


def test_run_with_an_unknown_scenario_is_one_line_and_exit_2() -> None:
    result = gpulens("sim", "run", "no-such-scenario", "--", "true")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no-such-scenario" in result.stderr


def test_run_without_a_command_is_an_error() -> None:
    result = gpulens("sim", "run", "dgx-h100")
    assert result.returncode == 2
    assert "expected a command" in result.stderr


def test_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['SITE_MARK'] = 'ran'\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    code = "import os, pynvml; pynvml.nvmlInit(); print(os.getenv('SITE_MARK'), pynvml.nvmlDeviceGetCount())"
    result = gpulens("sim", "run", "dgx-h100", "--", sys.executable, "-c", code, env=env)
    assert result.stdout == "ran 8\n"


def test_python_subprocesses_of_the_program_are_simulated_too() -> None:
    inner = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {COUNT!r}], check=True)"
    result = gpulens("sim", "run", "dgx-h100", "--", sys.executable, "-c", inner)
    assert result.stdout == "8\n"


def test_procfs_dir_gets_the_simulated_processes(tmp_path: Path) -> None:
    code = COUNT + "; import pynvml as n; h = n.nvmlDeviceGetHandleByIndex(3)"
    code += "; print(n.nvmlDeviceGetComputeRunningProcesses(h)[0].pid)"
    result = gpulens(
        "sim", "run", "dgx-h100", "--procfs-dir", str(tmp_path), "--", sys.executable, "-c", code
    )
    pid = result.stdout.split()[1]
    assert (tmp_path / pid / "cgroup").is_file()
    assert b"SLURM_JOB_ID=" in (tmp_path / pid / "environ").read_bytes()


def test_native_environment_puts_the_library_first_and_names_the_published_node() -> None:
    published = {"LD_LIBRARY_PATH": "/cache/native:/usr/lib", ENV_SHM: "/dev/shm/node.shm"}
    env = native_environment({"PYTHONPATH": "/already", ENV_SCENARIO: "old"}, "/site", published, None)
    assert env["LD_LIBRARY_PATH"] == "/cache/native:/usr/lib"
    assert env[ENV_SHM] == "/dev/shm/node.shm"
    assert env["PYTHONPATH"] == os.pathsep.join(["/site", "/already"])
    assert ENV_SCENARIO not in env  # no Python process builds a node of its own


def test_a_compiled_program_linked_with_libnvidia_ml_runs_on_the_node(tmp_path: Path) -> None:
    from gpulens.sim.native import build

    source = tmp_path / "probe.c"
    source.write_text(C_PROGRAM)
    binary = tmp_path / "probe"
    subprocess.run(
        [build.compiler(), str(source), "-o", str(binary), f"-L{build.library_dir()}", "-lnvidia-ml"],
        check=True,
    )
    result = gpulens("sim", "run", "dgx-h100", "--", str(binary))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 8 and all(" NVIDIA H100 80GB HBM3 81559" in line for line in lines)


def test_simulated_time_runs_at_the_speed_asked_for() -> None:
    code = (
        "import time, pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "stamp = lambda: pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_ENERGY])[0].timestamp\n"
        "first = stamp(); time.sleep(1.5); print(int((stamp() - first) / 1e6 >= 1800))"
    )
    result = gpulens("sim", "run", "dgx-h100", "--speed", "3600", "--", sys.executable, "-c", code)
    assert result.stdout == "1\n", result.stderr  # 1.5 real seconds (publishing lag included) >= half an hour


def test_report_missing_names_the_symbols_pynvml_did_not_find() -> None:
    code = (
        "import pynvml; pynvml.nvmlInit()\n"
        "try:\n    pynvml.nvmlDeviceGetVgpuSchedulerLog(pynvml.nvmlDeviceGetHandleByIndex(0))\n"
        "except pynvml.NVMLError_FunctionNotFound:\n    pass"
    )
    env = dict(os.environ, GPULENS_SIM_REPORT_MISSING="1")
    result = gpulens("sim", "run", "dgx-h100", "--", sys.executable, "-c", code, env=env)
    assert result.returncode == 0
    assert result.stderr == "gpulens sim: absent NVML symbols requested: nvmlDeviceGetVgpuSchedulerLog\n"


def test_the_python_driver_still_serves_python_programs() -> None:
    code = COUNT + "; print(type(pynvml.nvmlLib).__name__)"
    result = gpulens("sim", "run", "dgx-h100", "--driver", "python", "--", sys.executable, "-c", code)
    assert result.stdout == "8\nSimLib\n", result.stderr


def test_child_environment_puts_the_site_dir_first_and_names_the_scenario() -> None:
    env = child_environment({"PYTHONPATH": "/already"}, "/site", "dgx-h100", 3, 60.0, "/tmp/p")
    assert env["PYTHONPATH"] == os.pathsep.join(["/site", "/already"])
    assert env[ENV_SCENARIO] == "dgx-h100"
    assert env[ENV_PROCFS] == str(Path("/tmp/p").resolve())
    assert env["GPULENS_SIM_SEED"] == "3" and float(env["GPULENS_SIM_SPEED"]) == 60.0


def test_list_names_the_built_in_scenarios() -> None:
    result = gpulens("sim", "list")
    assert result.returncode == 0
    assert any(line.startswith("dgx-h100 ") for line in result.stdout.splitlines())


def test_validate_accepts_a_good_file(tmp_path: Path) -> None:
    from gpulens.sim.scenariofile import BUILTIN_DIR

    result = gpulens("sim", "validate", str(BUILTIN_DIR / "dgx-h100.yaml"))
    assert result.returncode == 0 and ": ok (8 GPUs" in result.stdout


@pytest.mark.parametrize(
    "content",
    ["gpus: [", "gpus:\n  - model: Z80\n", "just a string\n"],
    ids=["syntax", "unknown-model", "not-a-mapping"],
)
def test_validate_rejects_a_bad_file_in_one_line(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    result = gpulens("sim", "validate", str(path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "bad.yaml" in result.stderr
    assert "Traceback" not in result.stderr


def test_nvitop_once_renders_gpus_mig_devices_and_processes() -> None:
    env = dict(os.environ, COLUMNS="160", LINES="80")
    result = gpulens("sim", "run", "dgx-h100", "--", "nvitop", "--once", env=env, timeout=120)
    out = result.stdout
    assert result.returncode == 0, result.stderr
    assert "ERROR" not in out + result.stderr and "Traceback" not in result.stderr
    assert out.count("H100 80GB HBM3") == 8
    assert "3g.40gb @ GI/CI: 2/0" in out  # a MIG device row
    assert "Processes:" in out and "213101" in out  # a process of GPU 3
    assert "pretrain.py" in out and "No Such Process" not in out  # psutil sees it as a host process
    assert "Driver Version: 550.54.15" in out


def test_a_child_that_cannot_build_the_node_stops_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("gpus: 3\n")
    env = dict(os.environ, GPULENS_SIM_SCENARIO=str(bad))
    code = "from gpulens.sim.launcher import activate_from_environment as a; a(); print('ran')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "broken.yaml" in result.stderr


def test_seed_and_speed_reach_the_child_node_of_the_python_driver() -> None:
    code = "import pynvml; n = pynvml.nvmlLib.node; print(n.seed, type(n.clock).__name__, n.clock.speed)"
    result = gpulens(
        "sim",
        "run",
        "dgx-h100",
        "--seed",
        "42",
        "--speed",
        "60",
        "--driver",
        "python",
        "--",
        sys.executable,
        "-c",
        code,
    )
    assert result.stdout == "42 ScaledClock 60.0\n", result.stderr
