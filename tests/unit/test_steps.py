"""The compiled core's steps (minidist.shm._core.Step), in one process: a worker's repeated
scatter or gather checked, numbered in the planner's and the engine's tables and run in
one call on a real rooted area, or handed back to Python untouched or numbered with how
far it got."""

from __future__ import annotations

import mmap
import time
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest

from minidist.group import Group
from minidist.shm import core, fast_slots
from minidist.shm.rooted_area import ALL_GATHER, GATHER, SCATTER, Rooted, signature

STEP = getattr(core.compiled, "Step", None)
pytestmark = pytest.mark.skipif(STEP is None, reason="the compiled core is not active")
GID, N, COUNT = 7, 3, 4
DONE, DIFFER, WAIT_MORE = 0, 1, 2


def _call(kind: int, root: int, count: int = COUNT, seq: int = 0):
    from minidist import ops

    return SimpleNamespace(kind=kind, dtype=ops.dtype_code(np.dtype(np.int32)), op=0,
                           root=root, count=count, shape=count, seq=seq)


class Calls:
    def __init__(self) -> None:
        self.waiting = False
        self.done: list[tuple[int, int]] = []

    def turn_done(self, gid: int, turn: int) -> None:
        self.done.append((gid, turn))


@pytest.fixture
def world():
    """A rooted area of N ranks (rank 0 the root) and rank 1's Python state around it."""
    seg = mmap.mmap(-1, fast_slots.segment_bytes(N))
    g = Group(GID, tuple(range(N)))
    areas = [Rooted(seg, g, me) for me in range(N)]
    if areas[1].core is None:
        pytest.skip("the compiled core is not active")
    fast = SimpleNamespace(slots=SimpleNamespace(gave_up=None))  # a Fast: its slots' words
    st = SimpleNamespace(
        g=g, areas=areas, fast=fast, calls=Calls(), turns={}, numbers={},
        entered=defaultdict(int), slots={GID: fast}, planner=SimpleNamespace(default=g),
        engine=SimpleNamespace(rendezvous_lost=None, _aborted={}, broken={}, lost=set(),
                               died={}))
    try:
        yield st
    finally:
        for a in areas:
            if a.core is not None:
                a.core.release()
        del areas
        st.areas = None


def step(st, kind: int, arr: np.ndarray, group=None, nap: float = 0.05):
    return STEP(st.areas[1].core, kind == SCATTER, kind == SCATTER, 0, arr.nbytes, nap, kind,
                group, st.g, st.planner, np.ndarray, arr.dtype, arr.shape,
                signature(_call(kind, 0), 0), 0, GID, st.numbers, st.entered, st.turns,
                st.engine, st.fast, st.areas[1], st.slots, st.calls)


def root_scatter(st, f: int, kind: int = SCATTER, seq: int = 0) -> np.ndarray:
    src = np.arange(N * COUNT, dtype=np.int32) + 100 * f
    out = np.zeros(COUNT, np.int32)
    st.areas[0].core.scatter_root(f, signature(_call(kind, 0), 0), seq, src, out,
                                  COUNT * 4)
    return src.reshape(N, COUNT)


def test_a_scatter_step_takes_its_row_numbers_the_call_and_passes_the_turn(world):
    st = world
    out = np.zeros(COUNT, np.int32)
    s = step(st, SCATTER, out)
    for f in range(3):
        rows = root_scatter(st, f, seq=f)
        st.calls.waiting = f == 2  # a thread waits for the turn: told
        assert s.run(out, None, 0, None) is True
        assert out.tolist() == rows[1].tolist()
        assert (st.numbers[GID], st.entered[GID], st.turns[GID]) == (f + 1, f + 1, f + 1)
        assert st.areas[1].last[f & 1] == (f, SCATTER, 0) and st.areas[1].behind == (f, 0)
    assert st.calls.done == [(GID, 3)]


def test_a_gather_step_writes_its_piece_for_the_root(world):
    st = world
    inp = np.array([5, 6, 7, 8], np.int32)
    s = step(st, GATHER, inp)
    assert s.run(None, inp, 0, None) is True
    piece = st.areas[1].layout(GATHER, 0, inp.nbytes)[0][3]  # this rank's piece
    assert piece.view(np.int32).tolist() == [5, 6, 7, 8]
    assert st.areas[0].dq[1] == 1 and st.turns[GID] == 1


@pytest.mark.parametrize("other", ["dtype", "shape", "group", "root", "root_type",
                                   "readonly", "layout", "list", "dropped", "default"])
def test_a_step_leaves_any_other_call_unnumbered(world, other):
    st = world
    out = np.zeros(COUNT, np.int32)
    s = step(st, SCATTER, out)
    arr, root, group = out, 0, None
    if other == "dtype":
        arr = np.zeros(COUNT, np.float32)
    elif other == "shape":
        arr = np.zeros((2, 2), np.int32)
    elif other == "group":
        group = st.g
    elif other == "root":
        root = 2
    elif other == "root_type":
        root = 0.0
    elif other == "readonly":  # a scatter writes its output
        arr = np.zeros(COUNT, np.int32)
        arr.flags.writeable = False
    elif other == "layout":
        arr = np.zeros((COUNT, 2), np.int32)[:, 0]
    elif other == "list":
        arr = [0] * COUNT
    elif other == "dropped":
        s.drop()
    elif other == "default":  # the default group is another one now
        st.planner.default = Group(GID + 1, tuple(range(N)))
    assert s.run(arr, None, root, group) is None and s.numbered is None
    assert st.numbers == {} and dict(st.entered) == {} and st.turns == {}


@pytest.mark.parametrize("why", ["turn", "lost", "died", "aborted", "broken", "rendezvous",
                                 "gave_up", "area_gave_up", "pending", "slot"])
def test_an_unusual_call_comes_back_numbered_with_nothing_run(world, why):
    st = world
    out = np.zeros(COUNT, np.int32)
    s = step(st, SCATTER, out)
    root_scatter(st, 0)
    if why == "turn":
        st.turns[GID] = 5
    elif why == "lost":
        st.engine.lost.add(2)
    elif why == "died":
        st.engine.died[2] = "killed"
    elif why == "aborted":
        st.engine._aborted[(GID, 0)] = RuntimeError()
    elif why == "broken":
        st.engine.broken[GID] = RuntimeError()
    elif why == "rendezvous":
        st.engine.rendezvous_lost = "gone"
    elif why == "gave_up":  # Fast.gave_up is its slots' word or its area's
        st.fast.slots.gave_up = RuntimeError()
    elif why == "area_gave_up":
        st.areas[1].gave_up = RuntimeError()
    elif why == "pending":
        st.areas[1].pending = (0, b"", None)
    elif why == "slot":
        st.slots[GID] = SimpleNamespace(gave_up=None)
    assert s.run(out, None, 0, None) == (0, 0, -1)
    assert s.numbered == (0, 0) and st.numbers[GID] == 1 and st.entered[GID] == 1
    assert out.tolist() == [0] * COUNT and st.areas[1].last == [None, None]


def test_a_step_numbers_only_while_no_other_call_is_being_numbered(world):
    st = world
    out = np.zeros(COUNT, np.int32)
    s = step(st, SCATTER, out)
    busy = [1]  # a thread holds minidist.torch's numbering lock
    assert s.run(out, None, 0, None, busy) is None and s.numbered is None
    assert st.numbers == {} and dict(st.entered) == {} and st.turns == {}
    busy[0] = 0
    rows = root_scatter(st, 0)
    assert s.run(out, None, 0, None, busy) is True and out.tolist() == rows[1].tolist()
    for bad in ((0,), [], "0"):
        with pytest.raises(TypeError, match="busy"):
            s.run(out, None, 0, None, bad)
    assert st.numbers[GID] == 1  # nothing numbered by the refused ones


def test_a_run_that_raises_after_numbering_tells_failed(world):
    st = world
    out = np.zeros(COUNT, np.int32)
    s = step(st, SCATTER, out)
    told = []
    s.failed = lambda f, seq, e: told.append((f, seq, e))

    def turn_done(gid: int, turn: int) -> None:
        raise RuntimeError("no turn")

    st.calls.waiting, st.calls.turn_done = True, turn_done
    root_scatter(st, 0)
    with pytest.raises(RuntimeError, match="no turn") as caught:
        s.run(out, None, 0, None)
    assert s.numbered == (0, 0) and told == [(0, 0, caught.value)]
    with pytest.raises(TypeError):
        s.run(out, None, 0)  # raised before numbering: nobody is told
    assert len(told) == 1
    with pytest.raises(TypeError, match="callable"):
        s.failed = 3


def test_an_area_still_being_read_comes_back_numbered_with_nothing_run(world):
    st = world
    out = np.zeros(COUNT, np.int32)
    s = step(st, SCATTER, out)
    st.numbers[GID] = st.turns[GID] = 2  # call 2 reuses parity 0, last an all_gather's
    st.areas[1].last[0] = (0, ALL_GATHER, 0)  # ... that not every rank finished reading
    assert s.run(out, None, 0, None) == (2, 0, -1)
    assert st.areas[1].last[0] == (0, ALL_GATHER, 0)
    for r in range(N):
        st.areas[r].dq[r] = 1  # now everyone did
    root_scatter(st, 2)
    st.numbers[GID] = 2  # the same call again, numbered afresh
    assert s.run(out, None, 0, None) is True and st.areas[1].last[0] == (2, SCATTER, 0)


def test_a_release_that_does_not_come_within_the_nap_comes_back_to_wait_more(world):
    st = world
    out = np.zeros(COUNT, np.int32)
    s = step(st, SCATTER, out, nap=0.05)
    t0 = time.monotonic()
    assert s.run(out, None, 0, None) == (0, 0, WAIT_MORE)
    assert time.monotonic() - t0 >= 0.04
    assert st.areas[1].last[0] == (0, SCATTER, 0) and st.turns == {}


def test_a_root_that_called_something_else_comes_back_as_a_mismatch(world):
    st = world
    out = np.zeros(COUNT, np.int32)
    s = step(st, SCATTER, out)
    root_scatter(st, 0, kind=GATHER)  # its signature is another call's
    assert s.run(out, None, 0, None) == (0, 0, DIFFER)
    assert out.tolist() == [0] * COUNT and st.turns == {}


def test_a_step_refuses_a_layout_that_does_not_fit(world):
    st = world
    out = np.zeros(COUNT, np.int32)
    args = [st.areas[1].core, True, True, 0, out.nbytes, 0.05, SCATTER, None, st.g,
            st.planner, np.ndarray, out.dtype, out.shape, signature(_call(SCATTER, 0), 0), 0,
            GID, st.numbers, st.entered, st.turns, st.engine, st.fast, st.areas[1],
            st.slots, st.calls]
    for at, bad in ((14, 1), (14, 7), (4, 1 << 40), (13, b"short")):  # groot me; big
        wrong = list(args)
        wrong[at] = bad
        with pytest.raises((ValueError, TypeError)):
            STEP(*wrong)


def root_step(st, kind: int, out: np.ndarray, inp: np.ndarray, nap: float = 0.05):
    made = []

    def make_call(seq):
        made.append(seq)
        return ("call", seq)

    st.made = made
    return STEP(st.areas[0].core, kind == SCATTER, True, 0, COUNT * 4, nap, kind, None, st.g,
                st.planner, np.ndarray, np.dtype(np.int32), out.shape,
                signature(_call(kind, 0), 0), 0, GID, st.numbers, st.entered, st.turns,
                st.engine, st.fast, st.areas[0], st.slots, st.calls, (inp.shape, make_call))


def worker_gather(st, r: int, f: int, values: np.ndarray, kind: int = GATHER) -> None:
    st.areas[r].core.gather_send(f, 0, signature(_call(kind, 0), 0), 0, values, COUNT * 4)


def test_a_root_scatter_step_sends_every_row_and_leaves_its_call_pending(world):
    st = world
    src = np.arange(N * COUNT, dtype=np.int32).reshape(N, COUNT)
    mine = np.zeros(COUNT, np.int32)
    s = root_step(st, SCATTER, mine, src)
    assert s.run(mine, src, 0, None) is True
    assert mine.tolist() == src[0].tolist() and st.made == [0]
    assert st.areas[0].pending[0] == 0 and st.areas[0].pending[2] == ("call", 0)
    assert st.turns[GID] == 1 and st.areas[0].last[0] == (0, SCATTER, 0)
    got = np.zeros(COUNT, np.int32)  # what rank 1 takes
    assert st.areas[1].core.scatter_recv(0, 0, signature(_call(SCATTER, 0), 0), 0, got,
                                         COUNT * 4, 0.05) == DONE
    assert got.tolist() == src[1].tolist()


def test_a_root_gather_step_collects_every_row_and_settles_its_scatter(world):
    st = world
    mine = np.zeros(COUNT, np.int32)
    src = np.arange(N * COUNT, dtype=np.int32).reshape(N, COUNT)
    scatter = root_step(st, SCATTER, mine, src)
    assert scatter.run(mine, src, 0, None) is True
    for r in (1, 2):  # the workers take their rows, then send theirs
        got = np.zeros(COUNT, np.int32)
        st.areas[r].core.scatter_recv(0, 0, signature(_call(SCATTER, 0), 0), 0, got,
                                      COUNT * 4, 0.05)
        worker_gather(st, r, 1, got * 10)
    out = np.zeros((N, COUNT), np.int32)
    gather = root_step(st, GATHER, out, mine)
    assert gather.run(out, mine, 0, None) is True
    assert out[1:].tolist() == (src[1:] * 10).tolist() and out[0].tolist() == mine.tolist()
    assert st.areas[0].pending is None and st.turns[GID] == 2


def test_a_root_gather_step_hands_back_a_wait_and_a_mismatch(world):
    st = world
    mine = np.zeros(COUNT, np.int32)
    out = np.zeros((N, COUNT), np.int32)
    gather = root_step(st, GATHER, out, mine, nap=0.02)
    worker_gather(st, 1, 0, np.ones(COUNT, np.int32))  # rank 2 has not sent yet
    assert gather.run(out, mine, 0, None) == (0, 0, WAIT_MORE, -1)
    worker_gather(st, 2, 0, np.ones(COUNT, np.int32), kind=SCATTER)  # another call
    st.numbers[GID] = st.turns[GID] = 0
    st.areas[0].last[0] = None
    got = gather.run(out, mine, 0, None)
    assert got[2] == DIFFER and got[3] == 2 and out.tolist() == [[0] * COUNT] * N


def test_a_root_step_leaves_other_calls_alone(world):
    st = world
    src = np.zeros((N, COUNT), np.int32)
    mine = np.zeros(COUNT, np.int32)
    s = root_step(st, SCATTER, mine, src)
    assert s.run(mine, src.reshape(-1), 0, None) is None  # the input's shape
    assert s.run(np.zeros(COUNT, np.int64), src, 0, None) is None
    assert st.numbers == {} and dict(st.entered) == {}
    st.areas[0].pending = (5, b"k" * 28, None)  # a scatter still to settle: unusual
    assert s.run(mine, src, 0, None) == (0, 0, -1, -1)
    with pytest.raises(TypeError):
        s.run(mine, src, 0)


def test_a_root_step_numbers_only_while_no_other_call_is_being_numbered(world):
    st = world
    src = np.arange(N * COUNT, dtype=np.int32).reshape(N, COUNT)
    mine = np.zeros(COUNT, np.int32)
    s = root_step(st, SCATTER, mine, src)
    assert s.run(mine, src, 0, None, [1]) is None and s.numbered is None
    assert st.numbers == {} and st.turns == {}
    assert s.run(mine, src, 0, None, [0]) is True and mine.tolist() == src[0].tolist()
    assert st.numbers[GID] == 1 and st.turns[GID] == 1
