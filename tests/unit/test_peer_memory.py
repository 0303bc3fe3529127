"""Reading another process's memory (peer_memory), and when the planner lets a group's
large all_reduces read the peers' vectors."""

import errno
import os
import subprocess
import sys

import numpy as np
import pytest

from minidist import peer_memory
from minidist.algorithms import cost
from minidist.ops import ReduceOp
from minidist.plan import Planner
from minidist.shm import area_layout, fast_slots

pytestmark = pytest.mark.timeout(60)

needs_reads = pytest.mark.skipif(peer_memory.key() is None,
                                 reason="processes cannot read each other's memory here")


def _child_holding(data: np.ndarray):
    """Fork a child that keeps a copy of ``data`` (at the same address) until told to
    go; its pid and the pipe that lets it go."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(go_w)
            os.write(ready_w, b"x")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    os.read(ready_r, 1)
    for fd in (ready_r, ready_w, go_r):
        os.close(fd)
    return pid, go_w


@needs_reads
def test_reads_another_process_exactly_and_fails_clearly_once_it_is_gone():
    data = np.random.default_rng(0).integers(0, 1 << 30, 300_001, dtype=np.int64)
    pid, go = _child_holding(data)
    try:
        data[:] = -1  # ours changes; the child's copy does not
        back = np.zeros(300_001, np.int64)
        want = np.random.default_rng(0).integers(0, 1 << 30, 300_001, dtype=np.int64)
        peer_memory.read(pid, back.ctypes.data, data.ctypes.data, data.nbytes)
        assert np.array_equal(back, want)
        part = np.zeros(7, np.int64)
        peer_memory.read(pid, part.ctypes.data, data.ctypes.data + 8 * 1000, 56)
        assert np.array_equal(part, want[1000:1007])
        peer_memory.read(pid, part.ctypes.data, 8, 0)  # nothing to read: no call at all
        with pytest.raises(OSError) as bad:  # an address the child does not map
            peer_memory.read(pid, part.ctypes.data, 4096, 56)
        assert bad.value.errno == errno.EFAULT
    finally:
        os.close(go)
        os.waitpid(pid, 0)
    with pytest.raises(OSError) as gone:
        peer_memory.read(pid, part.ctypes.data, data.ctypes.data, 56)
    assert gone.value.errno == errno.ESRCH
    assert str(pid) in str(gone.value)


@needs_reads
def test_the_key_names_the_pid_namespace_and_ids_and_a_non_dumpable_process_has_none():
    key = peer_memory.key()
    assert key.startswith(f"{os.stat('/proc/self/ns/pid').st_ino}:")
    assert str(os.getresuid()) in key and str(os.getresgid()) in key
    code = ("import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "  # PR_SET_DUMPABLE 0
            "from minidist import peer_memory; print(peer_memory.key())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.strip() == "None", out.stderr


def _planner(rank: int, keys: list) -> Planner:
    p = Planner(rank, len(keys), lambda g: 0, lambda g, q, t, s: 0, True, cost.DEFAULT, {})
    p.fast = True
    p.set_nodes([0] * len(keys), keys)
    return p


@pytest.mark.parametrize("n", [2, 8, 16])
def test_large_all_reduces_read_the_peers_only_where_every_rank_can(n):
    least = fast_slots.DIRECT_MIN if n <= fast_slots.MID_RANKS else fast_slots.DIRECT_MIN_WIDE
    big, mid = least + 4, least
    same = ["k"] * n
    for keys, reads in ((same, True), (["k"] * (n - 1) + ["other user"], False),
                        (["k"] * (n - 1) + [None], False), ([None] * n, False)):
        preps = [_planner(r, keys).prepare_all_reduce(np.ones(big // 4, np.float32),
                                                      ReduceOp.SUM, None, None)
                 for r in (0, n - 1)]
        for p in preps:
            if reads:
                assert (p.reads, p.fast, p.fast_numbers) == (True, 0, 3)
                assert p.call.algorithm_name == "single_copy"
            else:  # the segments' schedule, the same on every rank
                assert (p.reads, p.fast) == (False, -1)
                assert p.call.algorithm_name != "single_copy"
        p = _planner(0, keys).prepare_all_reduce(np.ones(mid // 4, np.float32), ReduceOp.SUM,
                                                 None, None)
        assert not p.reads  # up to there: the mid area (or the segment) as before
        assert (p.fast >= 0) == (n <= fast_slots.MID_RANKS)
    # a subgroup of ranks that can read each other reads, even if others cannot
    pl = _planner(0, ["k", "k", None])
    g = pl.new_group([0, 1])
    prep = pl.prepare_all_reduce(np.ones(fast_slots.DIRECT_MIN // 4 + 1, np.float32),
                                 ReduceOp.SUM, g, None)
    assert prep.reads and prep.fast_numbers == 3


def test_numbers_of_each_kind_of_fast_call():
    assert fast_slots.numbers(8, 4) == 1
    assert fast_slots.numbers(fast_slots.MID_CHUNK * 2, 4, size=4) == 3  # two chunks, 3 barriers
    assert fast_slots.numbers(fast_slots.MID_BYTES, 4, size=8) == 17  # 1 MiB chunks
    assert fast_slots.numbers(fast_slots.MID_BYTES, 4, size=2) == 9  # 2 MiB chunks for pairs
    pair = fast_slots.MID_CHUNK_PAIR
    assert fast_slots.numbers(2 * pair, 4, size=2) == 3
    assert fast_slots.numbers(2 * pair - 4, 4, size=2) == -(-(2 * pair) // fast_slots.MID_CHUNK) + 1
    assert fast_slots.chunk_bytes(3, 2 * pair) == fast_slots.MID_CHUNK
    assert fast_slots.room_bytes(2) == pair and fast_slots.room_bytes(3) == fast_slots.MID_CHUNK
    # every rank reduces whole, after one barrier, up to GATHER_BYTES / size
    whole = fast_slots.GATHER_BYTES // 4
    assert fast_slots.gathers(whole, 4) and fast_slots.numbers(whole, 4, size=4) == 1
    assert not fast_slots.gathers(whole + 4, 4) and fast_slots.numbers(whole + 4, 4, size=4) == 2
    assert not fast_slots.gathers(fast_slots.SLOT_BYTES, 2)
    assert not fast_slots.gathers(fast_slots.SLOT_BYTES + 4, fast_slots.MID_RANKS + 1)
    assert fast_slots.segment_bytes(8) > fast_slots.segment_bytes(4)
    # slots, then two banks of n + 1 chunks (the ranks' and the result)
    assert fast_slots.segment_bytes(2) >= 2 * 3 * fast_slots.room_bytes(2)
    assert fast_slots.segment_bytes(4) >= 2 * 5 * fast_slots.MID_CHUNK
    # no mid area: the slots (to a page) and the rooted calls' area
    n = fast_slots.MID_RANKS + 1
    assert fast_slots.segment_bytes(n) == (
        -(-n * 2 * fast_slots.SLOT // 4096) * 4096 + area_layout.area_bytes(n))
    assert fast_slots.numbers(1 << 30, 4, reads=True) == 3
    assert fast_slots.takes("all_reduce", 64, 1 << 30, direct=True)
    assert not fast_slots.takes("all_reduce", 65, 1 << 30, direct=True)
    # a broadcast of any size on up to MID_RANKS ranks, a step of the ranks' chunks of a
    # bank (never reading the peers)
    assert fast_slots.takes("broadcast", 2, 1 << 30)
    assert fast_slots.takes("broadcast", fast_slots.MID_RANKS, 1 << 30, direct=True)
    assert not fast_slots.takes("broadcast", fast_slots.MID_RANKS + 1, fast_slots.SLOT_BYTES + 1)
    assert fast_slots.takes("broadcast", fast_slots.MAX_RANKS, fast_slots.SLOT_BYTES)
    assert not fast_slots.reads_peers("broadcast", 1 << 30, True)
    step = fast_slots.bank_bytes(4)
    assert step == 4 * fast_slots.MID_CHUNK  # not the bank's result chunk
    assert fast_slots.bank_bytes(2) == 2 * fast_slots.room_bytes(2)
    assert fast_slots.numbers(fast_slots.SLOT_BYTES + 4, 4, size=4, collective="broadcast") == 1
    assert fast_slots.numbers(step, 1, size=4, collective="broadcast") == 1
    assert fast_slots.numbers(step + 1, 1, size=4, collective="broadcast") == 2
    assert fast_slots.numbers(fast_slots.SLOT_BYTES, 4, size=4, collective="broadcast") == 1
    assert not fast_slots.reads_peers("all_reduce", fast_slots.DIRECT_MIN, True)
    assert fast_slots.reads_peers("all_reduce", fast_slots.DIRECT_MIN + 1, True)
    wide = fast_slots.MID_RANKS + 1  # no mid area: reads from DIRECT_MIN_WIDE on
    assert not fast_slots.reads_peers("all_reduce", fast_slots.DIRECT_MIN_WIDE, True, wide)
    assert fast_slots.reads_peers("all_reduce", fast_slots.DIRECT_MIN_WIDE + 1, True, wide)
    assert fast_slots.takes("all_reduce", wide, fast_slots.DIRECT_MIN_WIDE + 1, direct=True)
    assert not fast_slots.reads_peers("all_reduce", fast_slots.DIRECT_MIN_WIDE + 1, True,
                                    fast_slots.MID_RANKS)
    assert not fast_slots.reads_peers("all_reduce", 1 << 30, False)


def test_the_fast_path_choice_is_remembered_per_shape_and_forgotten_with_the_layout():
    pl = _planner(0, ["k", "k"])
    x = np.zeros(3, np.float32)
    first = pl.prepare_all_reduce(x, ReduceOp.SUM, None, None)
    second = pl.prepare_all_reduce(x, ReduceOp.MAX, None, None)
    assert (first.fast, second.fast) == (0, 1) and second.call.op == int(ReduceOp.MAX)
    assert second.call.seq == first.call.seq  # the stub numbers every call 0
    # another shape of as many elements: its own digest, so ranks can tell them apart
    other = pl.prepare_all_reduce(x.reshape(3, 1), ReduceOp.SUM, None, None)
    assert other.fast == 2 and other.call.shape != first.call.shape
    # the ranks turn out to be on two nodes: no fast path any more
    pl.set_nodes([0, 1], ["k", "k"])
    assert pl.prepare_all_reduce(x, ReduceOp.SUM, None, None).fast == -1
    # nor for a collective the job forces onto an algorithm
    forced = _planner(0, ["k", "k"])
    forced.forced["all_reduce"] = "ring"
    assert forced.prepare_all_reduce(x, ReduceOp.SUM, None, None).fast == -1
