"""A server sized from its KV use whose pool is allocated in bytes as configured is given no MIG
slice or MPS limit below what it holds (`serving.pool_above_need`): the plan keeps its GPU as it
is until the flag its reason names is lowered, so applying the plan never makes it fail on start.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pandas as pd

from gpulens.analyzer import modes, plan, serving
from gpulens.analyzer.thresholds import load_thresholds

GIB = 1024**3
L40S = "NVIDIA L40S"


def _server(recommendation: str = "mps", **extra: Any) -> dict[str, Any]:
    """A vLLM pod holding 26 GiB (an 8 GiB --kv-cache-memory-bytes pool, 20 % used), sized 21 GiB."""
    row: dict[str, Any] = {
        "job_id": "llm/chat-vllm-4d5e6f7a8-gg4hh",
        "uuids": "GPU-3",
        "gpu_model": L40S,
        "gpus": 1,
        "sharing": "exclusive",
        "mig_profile_now": "",
        "recommendation": recommendation,
        "serving_server": "vllm",
        "serving_floor_bytes": 19.6 * GIB,
        "memory_need_bytes": 21.0 * GIB,
        "memory_peak_bytes": 26.0 * GIB,
        "sm_fraction": 0.05,
        "sm_demand_sms": 8.0,
        "memory_leak": "",
        "mps_active_thread_percentage": 10,
        "mps_pinned_memory_limit_bytes": 21 * GIB,
        "mig_profile": None,
        "mig_alternative": None,
        "start": 0.0,
        "end": 3600.0,
        "duration_s": 3600.0,
        "gpu_hours_used": 0.05,
    }
    row.update(extra)
    return row


def test_a_server_holding_more_than_its_kv_sized_need_says_why_it_cannot_go_lower():
    why = serving.pool_above_need(_server())
    assert "its KV pool is allocated in bytes as configured, 26.0 GiB held" in why
    assert "(21.0 GiB) would not hold it" in why


def test_a_server_not_sized_from_its_kv_use_or_within_its_need_is_not_held():
    assert serving.pool_above_need(_server(serving_floor_bytes=float("nan"))) == ""
    assert serving.pool_above_need(_server(memory_peak_bytes=20.0 * GIB)) == ""
    assert serving.pool_above_need(_server(serving_server="")) == ""


def test_the_plan_keeps_the_servers_gpu_and_its_neighbour_as_they_run():
    neighbour = _server(
        job_id="vision/detect-7a8b9c0d1-aa1bb",
        serving_server="",
        serving_floor_bytes=float("nan"),
        memory_need_bytes=7 * GIB,
        memory_peak_bytes=6 * GIB,
        sharing="time-slicing",
    )
    elsewhere = _server(job_id="search/embed-5c6d7e8f9-ee3ff", uuids="GPU-1", serving_server="")
    recs = pd.DataFrame([_server(sharing="time-slicing"), neighbour, elsewhere])
    movable, held = plan.hold(recs)
    assert list(movable["job_id"]) == ["search/embed-5c6d7e8f9-ee3ff"]
    assert [(b.original_uuid, sorted(i.job_id for i in b.items)) for b in held] == [
        ("GPU-3", ["llm/chat-vllm-4d5e6f7a8-gg4hh", "vision/detect-7a8b9c0d1-aa1bb"])
    ]
    stays = plan.held_changes(recs)
    assert stays["llm/chat-vllm-4d5e6f7a8-gg4hh"]["note"].startswith("stays as it runs: its KV pool")
    assert stays["llm/chat-vllm-4d5e6f7a8-gg4hh"]["recommendation"] == "time-slicing"
    assert "shares a GPU with llm/chat-vllm-4d5e6f7a8-gg4hh" in stays["vision/detect-7a8b9c0d1-aa1bb"]["note"]


def test_a_server_recommended_time_slicing_is_packed_at_what_it_holds_and_never_offered_a_limit():
    row = _server("time-slicing")
    assert plan.hold(pd.DataFrame([row]))[1] == []  # time-slicing enforces no memory
    assert modes.modes_of(SimpleNamespace(**row), load_thresholds()) == ()
