"""The Slurm validator: gres.conf against the inventory, MPS shares, shards and slurm.conf totals."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpulens.analyzer.validate import slurm
from tests.analyzer.slurmd import slurmd_gres

HOSTS = {"dgx-a": 3}
GRES = """\
# a comment
NodeName=dgx-a Name=gpu Type=h100-80gb File=/dev/nvidia0
NodeName=dgx-a Name=gpu Type=h100-80gb File=/dev/nvidia1
NodeName=dgx-a Name=gpu Type=h100-80gb File=/dev/nvidia2
NodeName=dgx-a Name=mps Count=100 File=/dev/nvidia0
NodeName=dgx-a Name=shard Count=2 File=/dev/nvidia1
# job a on dgx-a /dev/nvidia0: --gres=mps:60
# job b on dgx-a /dev/nvidia0: --gres=mps:40
# job c on dgx-a /dev/nvidia1: --gres=shard:1
# job d on dgx-a /dev/nvidia1: --gres=shard:1
# job e on dgx-a /dev/nvidia2: --gres=gpu:h100-80gb:1
"""
NODES = "NodeName=dgx-a Gres=gpu:h100-80gb:3,mps:100,shard:2\n"


def messages(gres=GRES, nodes=NODES, hosts=HOSTS):
    return [p.message for p in slurm.validate(gres, nodes, hosts)]


def test_a_consistent_gres_conf_passes():
    assert messages() == []


def test_real_slurmd_configures_what_the_file_declares(tmp_path):
    lines = slurmd_gres(tmp_path, GRES, NODES, "dgx-a", 3)
    counts = {(g["name"], g["file"]): int(g["count"]) for g in lines}
    assert counts[("mps", "/dev/nvidia0")] == 100 and counts[("mps", "/dev/nvidia1")] == 0
    assert counts[("shard", "/dev/nvidia1")] == 2
    assert sum(c for (name, _), c in counts.items() if name == "gpu") == 3


def test_mps_shares_on_one_gpu_may_not_pass_its_count():
    found = messages(GRES.replace("mps:40", "mps:55"))
    assert found == [
        "MPS requests sum to 115, past the GPU's mps Count of 100: Slurm will not place these jobs together"
    ]


def test_node_names_must_be_hosts_of_the_inventory():
    found = messages(
        GRES.replace(
            "NodeName=dgx-a Name=gpu Type=h100-80gb File=/dev/nvidia2",
            "NodeName=mps-group-1 Name=gpu File=/dev/nvidia2",
        )
    )
    assert "NodeName 'mps-group-1' is not a host in the inventory" in found


def test_a_device_file_must_exist_on_the_node():
    found = messages(GRES, hosts={"dgx-a": 2})
    assert any("/dev/nvidia2: dgx-a has 2 GPU(s)" in m for m in found)


def test_more_sharers_than_shards_is_rejected():
    found = messages(
        GRES.replace("Count=2 File=/dev/nvidia1", "Count=1 File=/dev/nvidia1"),
        NODES.replace("shard:2", "shard:1"),
    )
    assert found == ["2 jobs share it but its shard Count is 1"]


def test_mps_needs_a_declared_gpu():
    gres = "NodeName=dgx-a Name=mps Count=100 File=/dev/nvidia0\n"
    found = messages(gres, "NodeName=dgx-a Gres=mps:100\n")
    assert found[0] == "mps on dgx-a /dev/nvidia0, but no Name=gpu line declares that GPU"


def test_slurm_conf_totals_must_match_gres_conf():
    assert messages(nodes=NODES.replace("mps:100", "mps:200")) == ["mps:200 but gres.conf gives dgx-a 100"]


def test_a_gpu_requested_whole_and_shared_is_rejected():
    gres = GRES.replace("# job e on dgx-a /dev/nvidia2", "# job e on dgx-a /dev/nvidia0")
    assert messages(gres) == ["requested as a whole GPU and as mps/shard: Slurm allocates one or the other"]


def test_a_token_without_equals_is_one_problem_naming_the_line():
    problems = slurm.validate("NodeName=dgx-a Name=gpu File\n", "", HOSTS)
    assert [(p.where, p.message) for p in problems] == [("line 1", "'File' is not Key=Value")]


@given(st.integers(0, 50), st.integers(0, 50))
def test_host_ranges_expand_to_every_member(low, span):
    names = slurm.expand(f"gpu[{low}-{low + span}]")
    assert names == [f"gpu{n}" for n in range(low, low + span + 1)]


def test_a_malformed_range_is_a_value_error():
    import pytest

    with pytest.raises(ValueError):
        slurm.expand("gpu[3-1]")
