"""Scenario files are strict: every mistake is one line naming the file, the path and the problem."""

from __future__ import annotations

from typing import Any

import pytest

from gpulens.catalog import get_model
from gpulens.sim.scenario import MigCreateFault, ScenarioError
from gpulens.sim.scenariofile import load_scenario, parse_scenario


def one_gpu(**extra: Any) -> dict[str, Any]:
    return {"gpus": [{"model": "H100-80GB"}], **extra}


def proc(**extra: Any) -> dict[str, Any]:
    return {"pid": 500, "gpu": 0, "workload": {"pattern": "constant", "memory": "1GiB"}, **extra}


def error_of(data: Any) -> str:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, "t.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


CASES = [
    (
        {"gpus": [{"model": "H100-80GB", "modle": 1}]},
        "t.yaml: gpus[0].modle: expected one of the keys model, count, mig, mps, nvlink, overrides, "
        "found 'modle'",
    ),
    (
        {"gpus": [{"model": "H200", "nvlink": "off"}]},
        "t.yaml: gpus[0].nvlink: expected true or false, found 'off'",
    ),
    (
        {
            "gpus": [{"model": "H200", "nvlink": False}],
            "processes": [proc(workload={"pattern": "constant", "memory": "1GiB", "nvlink_gbps": 50})],
        },
        "t.yaml: processes[0].workload.nvlink_gbps: expected 0 (GPU 0 exposes no NVLink: nvlink: false)"
        ", found 50",
    ),
    (
        {
            "gpus": [{"model": "H200", "nvlink": False}],
            "faults": {"timeline": [{"at": 5, "gpu": 0, "nvlink_error": {"link": 0}}]},
        },
        "t.yaml: faults.timeline[0].gpu: expected a GPU with NVLink, found 0",
    ),
    (
        {"gpus": [{"model": "H100-80GB", "count": "two"}]},
        "t.yaml: gpus[0].count: expected an integer from 1 to 64, found 'two'",
    ),
    (
        {"gpus": [{"model": "H100-80GB", "mig": ["2g.20gb"] * 4}]},
        "t.yaml: gpus[0].mig: expected a MIG layout that fits, found: "
        "layout needs 8 compute slices but H100-80GB has 7",
    ),
    (
        {"gpus": [{"model": "H100-80GB", "mig": [{"profile": "3g.40gb", "start": 2}]}]},
        "t.yaml: gpus[0].mig: expected a MIG layout that fits, found: "
        "3g.40gb cannot start at memory slice 2 on H100-80GB; valid starts: [0, 4]",
    ),
    (
        {"gpus": [{"model": "H100-80GB", "mig": ["9g.10gb"]}]},
        "t.yaml: gpus[0].mig[0].profile: expected a MIG profile of H100-80GB (1g.10gb, 1g.10gb+me, "
        "1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb), found '9g.10gb'",
    ),
    (
        {"gpus": [{"model": "H100-80GB", "mig": [], "mps": {"server_pid": 10}}]},
        "t.yaml: gpus[0].mps: expected no MPS server on a GPU in MIG mode, found a mapping",
    ),
    (
        one_gpu(processes=[proc(), proc()]),
        "t.yaml: processes[1].pid: expected a pid not used elsewhere (already processes[0].pid), found 500",
    ),
    (
        {
            "gpus": [{"model": "H100-80GB", "mps": {"server_pid": 500}}],
            "processes": [proc(kind="mps_client")],
        },
        "t.yaml: processes[0].pid: expected a pid not used elsewhere (already gpus[0].mps.server_pid)"
        ", found 500",
    ),
    (
        one_gpu(processes=[proc(gpu=3)]),
        "t.yaml: processes[0].gpu: expected a GPU index from 0 to 0, found 3",
    ),
    (
        {"gpus": [{"model": "H100-80GB", "mig": ["3g.40gb"]}], "processes": [proc(instance=5)]},
        "t.yaml: processes[0].instance: expected a GPU instance id of GPU 0 (1), found 5",
    ),
    (
        one_gpu(processes=[proc(instance=1)]),
        "t.yaml: processes[0].instance: expected no instance (GPU 0 is not in MIG mode), found 1",
    ),
    (
        one_gpu(processes=[proc(kind="mps_client")]),
        "t.yaml: processes[0].kind: expected compute or graphics (GPU 0 runs no MPS server)"
        ", found 'mps_client'",
    ),
    (
        one_gpu(processes=[proc(workload={"pattern": "constant", "memory": "100GiB"})]),
        "t.yaml: processes[0].workload.memory: expected at most 79.65 GiB (memory of H100-80GB)"
        ", found '100GiB'",
    ),
    (
        one_gpu(processes=[proc(workload={"pattern": "training", "memory": "1GiB", "rate": 0.3})]),
        "t.yaml: processes[0].workload.rate: expected one of the keys pattern, memory, sm, tensor, dram, "
        "occupancy, pcie_gbps, nvlink_gbps, duty, step, warmup, found 'rate'",
    ),
    (
        one_gpu(processes=[proc(workload={"pattern": "training", "memory": "1GiB", "step": "fast"})]),
        "t.yaml: processes[0].workload.step: expected a duration like 30s, 5m, 2h, 1d (or seconds)"
        ", found 'fast'",
    ),
    (
        one_gpu(processes=[proc(workload={"pattern": "constant", "memory": "1GiB", "sm": 0.5, "busy": 0.2})]),
        "t.yaml: processes[0].workload.busy: expected at least sm (0.5): a kernel runs whenever SMs are "
        "active, found 0.2",
    ),
    (
        one_gpu(processes=[proc(start="1h", end="10m")]),
        "t.yaml: processes[0].end: expected a time after start (3600s), found '10m'",
    ),
    (
        one_gpu(processes=[proc(job={"slurm": {"id": 1}, "kubernetes": {"namespace": "a", "pod": "b"}})]),
        "t.yaml: processes[0].job: expected exactly one of slurm, kubernetes, mapping"
        ", found slurm and kubernetes",
    ),
    (
        one_gpu(processes=[proc(job={"slurm": {"id": 1, "name": "train llama"}})]),
        "t.yaml: processes[0].job.slurm.name: expected a Slurm job name: 1-128 letters, digits or"
        " _.+:@=- (not starting with one of .+:@=-), found 'train llama'",
    ),
    (
        one_gpu(processes=[proc(job={"slurm": {"id": 1, "name": "x" * 129}})]),
        "t.yaml: processes[0].job.slurm.name: expected a Slurm job name: 1-128 letters, digits or"
        f" _.+:@=- (not starting with one of .+:@=-), found '{'x' * 129}'",
    ),
    (
        one_gpu(processes=[proc(job={"slurm": {"id": 1, "name": ""}})]),
        "t.yaml: processes[0].job.slurm.name: expected a Slurm job name: 1-128 letters, digits or"
        " _.+:@=- (not starting with one of .+:@=-), found ''",
    ),
    (
        one_gpu(faults={"timeline": [{"at": "5s", "gpu": 0, "diag_fail": "memroy"}]}),
        "t.yaml: faults.timeline[0].diag_fail: expected one of software, pcie, memory, diagnostic,"
        " targeted_stress, targeted_power, memory_bandwidth, memtest, pulse_test, found 'memroy'",
    ),
    (
        one_gpu(faults={"timeline": [{"at": "5s", "diag_fail": "memory"}]}),
        "t.yaml: faults.timeline[0].gpu: expected a GPU index for this fault, found nothing",
    ),
    (
        one_gpu(faults={"timeline": [{"at": "5s", "gpu": 0, "lost": "soon"}]}),
        "t.yaml: faults.timeline[0].lost: expected a duration like 30s, 5m, 2h, 1d (or seconds) or"
        " 'forever', "
        "found 'soon'",
    ),
    (
        one_gpu(faults={"timeline": [{"at": "5s", "gpu": 0, "mps_restart": "5s"}]}),
        "t.yaml: faults.timeline[0].gpu: expected a GPU that runs an MPS server, found 0",
    ),
    (
        one_gpu(faults={"repeat": "1m", "timeline": [{"at": "2m", "gpu": 0, "xid": 13}]}),
        "t.yaml: faults.timeline[0].at: expected a time before the repeat period (60s), found '2m'",
    ),
    (
        {
            "gpus": [{"model": "H100-80GB", "mig": ["3g.40gb"]}],
            "faults": {"timeline": [{"at": 5, "gpu": 0, "mig_destroy": 9}]},
        },
        "t.yaml: faults.timeline[0].mig_destroy: expected an instance that exists on GPU 0 at 5s (1)"
        ", found 9",
    ),
    (
        {
            "gpus": [{"model": "H100-80GB", "mig": ["7g.80gb"]}],
            "faults": {"timeline": [{"at": 5, "gpu": 0, "mig_create": {"profile": "1g.10gb"}}]},
        },
        "t.yaml: faults.timeline[0].mig_create: expected an instance that fits at 5s, found: "
        "layout needs 8 compute slices but H100-80GB has 7",
    ),
    ([1, 2], "t.yaml: (top level): expected a mapping, found a list"),
]


@pytest.mark.parametrize(("data", "message"), CASES, ids=[m.split(": ")[1] for _, m in CASES])
def test_invalid_scenarios_are_reported_on_one_line(data: Any, message: str) -> None:
    assert error_of(data) == message


def test_unknown_model_names_the_catalog() -> None:
    message = error_of({"gpus": [{"model": "K80"}]})
    assert message.startswith("t.yaml: gpus[0].model: expected a catalog model, found 'K80'")
    assert "H100-80GB" in message


def test_two_fault_kinds_in_one_entry_are_refused() -> None:
    message = error_of(one_gpu(faults={"timeline": [{"at": "5s", "gpu": 0, "xid": 79, "lost": "5s"}]}))
    assert message.startswith("t.yaml: faults.timeline[0]: expected exactly one fault kind (")
    assert message.endswith("found xid and lost")


def test_an_unknown_throttle_reason_lists_the_known_ones() -> None:
    message = error_of(one_gpu(faults={"timeline": [{"at": "5s", "gpu": 0, "throttle": ["hot"]}]}))
    assert message.startswith("t.yaml: faults.timeline[0].throttle[0]: expected one of gpu_idle,")
    assert message.endswith("found 'hot'")


def test_a_yaml_syntax_error_names_the_line(tmp_path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("gpus:\n  - model: [H100\n")
    with pytest.raises(ScenarioError, match=r"broken.yaml: line \d+, column \d+: expected valid YAML"):
        load_scenario(str(path))


def test_an_unknown_name_lists_the_builtin_scenarios() -> None:
    with pytest.raises(
        ScenarioError, match=r"nope: expected a built-in scenario name .*dgx-h100.*found neither"
    ):
        load_scenario("nope")


def test_a_scenario_file_is_loaded_by_path(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("gpus:\n  - model: A30\n    count: 2\n")
    scenario = load_scenario(str(path))
    assert scenario.name == "mine"
    assert [g.model.key for g in scenario.gpus] == ["A30-24GB", "A30-24GB"]


def test_errors_in_a_file_name_the_file(tmp_path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("gpus:\n  - model: H100-80GB\nprocesses:\n  - {pid: 7, gpu: 0, wrkload: {}}\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(str(path))
    assert str(info.value).startswith(
        f"{path}: processes[0].wrkload: expected one of the keys pid, gpu, workload"
    )


def test_a_process_may_wait_for_an_instance_the_timeline_creates() -> None:
    data: dict[str, Any] = {
        "gpus": [{"model": "H100-80GB", "mig": ["3g.40gb"]}],
        "processes": [proc(instance=11, start="2m", workload={"pattern": "constant", "memory": "4GiB"})],
        "faults": {"timeline": [{"at": "1m", "gpu": 0, "mig_create": {"profile": "1g.10gb"}}]},
    }
    (created,) = [f for f in parse_scenario(data, "t.yaml").faults if isinstance(f, MigCreateFault)]
    assert created.mig is not None and created.mig.gpu_instance_id == 11  # first fit after the 3g: slice 4
    data["processes"][0]["workload"]["memory"] = "12GiB"
    assert error_of(data) == (
        "t.yaml: processes[0].workload.memory: expected at most 9.75 GiB (memory of MIG 1g.10gb), "
        "found '12GiB'"
    )


def test_gpu_instance_ids_follow_nvidia_smi_by_placement() -> None:
    data = {
        "gpus": [
            {
                "model": "A100-80GB",
                "mig": [
                    {"profile": "3g.40gb", "start": 4},
                    {"profile": "2g.20gb", "start": 0},
                    "1g.10gb",
                    "1g.10gb",
                ],
            },
            {"model": "H100-80GB", "mig": ["4g.40gb", {"profile": "1g.20gb", "start": 6}]},
            {"model": "H100-80GB", "mig": ["7g.80gb"]},
            {"model": "A30", "mig": ["2g.12gb", "1g.6gb", "1g.6gb"]},
        ]
    }
    ids = [[(i.start, i.gpu_instance_id) for i in g.mig or ()] for g in parse_scenario(data, "t.yaml").gpus]
    assert ids == [[(4, 2), (0, 3), (2, 9), (3, 10)], [(0, 1), (6, 6)], [(0, 0)], [(0, 1), (2, 5), (3, 6)]]


def test_processes_running_together_must_fit_their_instance() -> None:
    data = {
        "gpus": [{"model": "H100-80GB", "mig": ["1g.10gb"]}],
        "processes": [
            proc(pid=5, instance=7, workload={"pattern": "constant", "memory": "6GiB"}),
            proc(pid=6, instance=7, start="1m", workload={"pattern": "constant", "memory": "5GiB"}),
        ],
    }
    assert error_of(data) == (
        "t.yaml: processes[1].workload.memory: expected processes running together on GPU 0 instance 7 "
        "(1g.10gb) to fit its 9.74 GiB, found 11.00 GiB (pids 5, 6 at 60s)"
    )
    data["processes"][0]["end"] = "1m"  # one after the other is fine
    assert len(parse_scenario(data, "t.yaml").processes) == 2


def test_an_empty_or_binary_file_is_a_one_line_error(tmp_path) -> None:
    empty, binary = tmp_path / "empty.yaml", tmp_path / "binary.yaml"
    empty.write_text("")
    binary.write_bytes(b"gpus: \xff\xfe\n")
    with pytest.raises(ScenarioError, match=r"empty.yaml: \(top level\): expected a mapping, found nothing$"):
        load_scenario(str(empty))
    with pytest.raises(ScenarioError, match=r"binary.yaml: not UTF-8 text \(byte 0xff at offset 6\)$"):
        load_scenario(str(binary))


def test_a_slurm_job_name_is_optional_and_read_as_given() -> None:
    named = parse_scenario(one_gpu(processes=[proc(job={"slurm": {"id": 7, "name": "sweep_lr-3e-5"}})]), "t")
    plain = parse_scenario(one_gpu(processes=[proc(job={"slurm": {"id": 7}})]), "t")
    assert named.processes[0].job.name == "sweep_lr-3e-5"  # type: ignore[union-attr]
    assert plain.processes[0].job.name == ""  # type: ignore[union-attr]


K8S_JOB = {"kubernetes": {"namespace": "llm", "pod": "chat-0"}}
SERVER = {"server": "vllm", "weights": "16GiB", "kv_peak": 0.2}


def serving_proc(**extra: Any) -> dict[str, Any]:
    return {"pid": 500, "gpu": 0, "workload": {"pattern": "inference"}, "job": K8S_JOB, **extra}


def test_a_serving_process_holds_what_its_server_pre_allocates() -> None:
    scenario = parse_scenario(one_gpu(processes=[serving_proc(serving=SERVER)]), "t.yaml")
    process = scenario.processes[0]
    assert process.serving is not None
    # vLLM's default --gpu-memory-utilization 0.9 of the device's memory
    total = get_model("H100-80GB").memory_bytes
    assert process.workload.memory_bytes == process.serving.reserved_bytes() == int(0.9 * total)


def test_a_serving_process_needs_a_pod_to_join_its_metrics_to() -> None:
    data = one_gpu(processes=[serving_proc(serving=SERVER, job=None)])
    assert error_of(data).startswith("t.yaml: processes[0].job: expected a kubernetes job")


def test_a_serving_process_does_not_declare_its_memory() -> None:
    raw = serving_proc(serving=SERVER, workload={"pattern": "inference", "memory": "10GiB"})
    assert "processes[0].workload.memory: expected nothing" in error_of(one_gpu(processes=[raw]))


def test_a_fraction_too_small_for_the_weights_is_refused() -> None:
    raw = serving_proc(serving={**SERVER, "gpu_memory_utilization": 0.2})
    assert "processes[0].serving.gpu_memory_utilization: expected a fraction" in error_of(
        one_gpu(processes=[raw])
    )


def test_a_triton_server_pre_allocates_its_fraction_of_what_the_weights_leave() -> None:
    triton = {"server": "triton", "weights": "16GiB", "kv_peak": 0.2}
    process = parse_scenario(one_gpu(processes=[serving_proc(serving=triton)]), "t.yaml").processes[0]
    assert process.serving is not None
    # TensorRT-LLM's kv_cache_free_gpu_mem_fraction 0.9 of the memory the weights and 2 GiB leave
    total = get_model("H100-80GB").memory_bytes
    pool = int(0.9 * (total - 18 * 1024**3))
    assert process.workload.memory_bytes == process.serving.reserved_bytes() == 18 * 1024**3 + pool


def test_a_triton_server_refuses_vllms_pool_flag() -> None:
    raw = serving_proc(
        serving={"server": "triton", "weights": "16GiB", "kv_peak": 0.2, "kv_cache_memory": "8GiB"}
    )
    assert "processes[0].serving.kv_cache_memory: expected one of the keys" in error_of(
        one_gpu(processes=[raw])
    )
