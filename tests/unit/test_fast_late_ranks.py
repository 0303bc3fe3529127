"""A rank that gives up on a fast call never writes its group's segment again, and a rank
that reads its peers' arrays in place raises once any rank gave up (fastpath, "Late
ranks"). Two ranks' slots share one anonymous mapping in this process; each rank is a
thread."""

from __future__ import annotations

import mmap
import threading
import time

import numpy as np
import pytest

from minidist import ops, wire
from minidist.errors import DistError, DistTimeoutError
from minidist.group import Group
from minidist.ops import ReduceOp
from minidist.plan import Call
from minidist.shm import fast_slots

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.skipif(not fast_slots.available(), reason="no fast path here")]


class Hooks:
    def gone(self, group, rank):
        return None

    def broken(self, call):
        return None

    def anyone_gone(self):
        return False

    def stalled(self, call):
        pass

    def timed_out(self, call, waiting):
        return DistTimeoutError(f"timed out waiting on {waiting}", missing=waiting)


def _call(group: Group, seq: int, count: int) -> Call:
    return Call(wire.Kind.ALL_REDUCE, group, seq, ops.dtype_code(np.dtype(np.float64)),
                int(ReduceOp.SUM), 0, "fast", -1, count, 0)


@pytest.fixture
def pair():
    group = Group(7, (0, 1))
    buf = mmap.mmap(-1, fast_slots.segment_bytes(2))
    slots = [fast_slots.Slots(buf, group, me) for me in (0, 1)]
    return group, buf, slots  # an anonymous mapping: freed with its last view


def test_a_rank_that_timed_out_never_writes_the_segment_again(pair):
    group, buf, (s0, s1) = pair
    x = np.ones(4)
    # call 0 on both ranks, then rank 0 alone gives up on call 1 (rank 1 is "stopped")
    t = threading.Thread(target=s1.run, args=(0, _call(group, 0, 4), np.empty(4), x,
                                              ReduceOp.SUM, time.monotonic() + 10, Hooks()))
    t.start()
    out = np.empty(4)
    s0.run(0, _call(group, 0, 4), out, x, ReduceOp.SUM, time.monotonic() + 10, Hooks())
    t.join()
    assert out.tolist() == [2.0] * 4
    with pytest.raises(DistTimeoutError):
        s0.run(1, _call(group, 1, 4), np.empty(4), x, ReduceOp.SUM,
               time.monotonic() + 0.05, Hooks())
    before = bytes(buf)
    # its next call on the group (which would reuse call 0's slot) is refused before it
    # writes anything: rank 1, resumed late in call 0, still finds call 0's data there
    for f in (2, 3):
        with pytest.raises(DistError, match="ended early on this rank"):
            s0.run(f, _call(group, f, 4), np.empty(4), x * 100, ReduceOp.SUM,
                   time.monotonic() + 10, Hooks())
    assert bytes(buf) == before
    assert int(s0.words[fast_slots.GAVE_UP // 4]) == 1  # group rank 0, plus one


def test_a_reader_in_place_raises_once_a_peer_gave_up(pair):
    group, _buf, (s0, s1) = pair
    call = _call(group, 0, 4)
    s1.words[fast_slots.GAVE_UP // 4] = 2  # group rank 1 gave up on something
    with pytest.raises(DistError, match="rank 1 gave up on the call"):
        s0._peers_stayed(call)
    s1.words[fast_slots.GAVE_UP // 4] = 0
    s0._peers_stayed(call)  # nobody gave up: no error


def test_an_interrupt_counts_as_giving_up(pair):
    group, buf, (s0, _s1) = pair

    class Interrupting(Hooks):
        def broken(self, call):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        # rank 1 never comes: rank 0 waits, and its wait is interrupted
        s0.run(0, _call(group, 0, 4), np.empty(4), np.ones(4), ReduceOp.SUM,
               time.monotonic() + 10, Interrupting())
    before = bytes(buf)
    with pytest.raises(DistError):
        s0.run(1, _call(group, 1, 4), np.empty(4), np.ones(4), ReduceOp.SUM,
               time.monotonic() + 10, Hooks())
    assert bytes(buf) == before
