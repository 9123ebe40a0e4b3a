"""The publisher's own packing: what it writes must read back as the `layout.h` records say."""

from __future__ import annotations

import ctypes

from hypothesis import given
from hypothesis import strategies as st

from gpulens.sim.native.layout import PROC_KIND, ProcRec
from gpulens.sim.native.publisher import PROC_STRUCT, pack_process
from gpulens.sim.state import NO_INSTANCE, ProcessState

processes = st.builds(
    ProcessState,
    pid=st.integers(min_value=1, max_value=2**22),
    kind=st.sampled_from(sorted(PROC_KIND)),
    used_memory_bytes=st.none() | st.integers(min_value=0, max_value=2**50),
    sm_util_percent=st.integers(min_value=0, max_value=100),
    mem_util_percent=st.integers(min_value=0, max_value=100),
    gpu_instance_id=st.just(NO_INSTANCE) | st.integers(min_value=0, max_value=14),
    compute_instance_id=st.just(NO_INSTANCE) | st.integers(min_value=0, max_value=7),
    start_time=st.floats(min_value=0, max_value=4e9),
    name=st.text(min_size=0, max_size=48),
)


def test_a_packed_process_record_is_one_proc_rec() -> None:
    assert PROC_STRUCT.size == ctypes.sizeof(ProcRec)


@given(proc=processes, previous=processes, slot=st.integers(min_value=0, max_value=3))
def test_a_packed_process_reads_back_field_for_field_as_proc_rec(
    proc: ProcessState, previous: ProcessState, slot: int
) -> None:
    buffer = ctypes.create_string_buffer(4 * PROC_STRUCT.size)
    offset = slot * PROC_STRUCT.size
    pack_process(buffer, offset, previous, {})  # a longer earlier name must not show through
    pack_process(buffer, offset, proc, {})
    rec = ProcRec.from_buffer(buffer, offset)
    assert rec.pid == proc.pid
    assert rec.kind == PROC_KIND[proc.kind]
    assert rec.memory_known == int(proc.used_memory_bytes is not None)
    assert rec.used_memory == (proc.used_memory_bytes or 0)
    assert (rec.sm_util, rec.mem_util) == (proc.sm_util_percent, proc.mem_util_percent)
    assert (rec.gpu_instance_id, rec.compute_instance_id) == (proc.gpu_instance_id, proc.compute_instance_id)
    assert rec.start_time == proc.start_time
    assert rec.name == proc.name.encode()[:31].split(b"\0")[0]  # a C string: up to the first NUL


def test_the_packed_name_cache_holds_each_clipped_name_once() -> None:
    names: dict[str, bytes] = {}
    buffer = ctypes.create_string_buffer(PROC_STRUCT.size)
    for pid in (1, 2):
        pack_process(
            buffer, 0, ProcessState(pid=pid, kind="compute", used_memory_bytes=None, name="x" * 40), names
        )
    assert names == {"x" * 40: b"x" * 31}
