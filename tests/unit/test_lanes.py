"""The compiled core's lanes (minidist.shm._core.Lane), in one process: a repeated message
through an inbox's ring, checked, numbered in the engine's table and written or taken in
one call, or handed back to Python untouched."""

import os
import secrets
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from minidist import segments, wire
from minidist.ops import dtype_code
from minidist.shm import core
from minidist.shm.inbox import Inbox, Outbox

LANE = getattr(core.compiled, "Lane", None)
pytestmark = [
    pytest.mark.skipif(not segments.available(), reason="needs /dev/shm"),
    pytest.mark.skipif(LANE is None, reason="the compiled core is not active"),
]

SRC, DST, TAG, RING = 1, 2, 5, 1


class Loop:
    """Stands in for the event loop: records what a lane asks it to run."""

    def __init__(self) -> None:
        self.asked: list = []

    def call_soon_threadsafe(self, fn) -> None:
        self.asked.append(fn)


class Mailbox:
    def __init__(self) -> None:
        self.early: dict = {}
        self.dead: object = None
        self.loop_waits = False

    def is_dead(self, rank: int) -> object:
        return self.dead

    def p2p_waiting(self) -> bool:
        return self.loop_waits


@pytest.fixture
def pair():
    """(engine, planner, group, inbox, outbox, p2p stand-in) around one real inbox."""
    job = secrets.token_hex(10)
    box = Inbox(job, DST, 3)
    out = Outbox.attach(job, DST, 3, RING)
    assert out is not None and out.core is not None and box.core is not None
    group = SimpleNamespace(id=0x33)
    engine = SimpleNamespace(p2p_seqs={}, lost=set(), left=set(), rendezvous_lost=None)
    planner = SimpleNamespace(default=group)
    p2p = SimpleNamespace(inbox=box, waiting=False)
    try:
        yield engine, planner, group, box, out, p2p
    finally:
        out.close()
        box.close()
    assert not os.path.exists(os.path.join(segments.SHM_DIR, box.name))


def _header(group, seq: int, arr: np.ndarray) -> bytes:
    return wire.encode_p2p(dtype_code(arr.dtype), 0, group.id, seq, SRC, TAG,
                           wire.shape_digest(arr.shape), arr.size, arr.nbytes)


def send_lane(engine, planner, group, out, like: np.ndarray, lock=None):
    outboxes = {DST: out}
    return LANE(out.core, out.ring, _header(group, 0, like), group, planner, np.ndarray,
                like.dtype, like.shape, like.nbytes, engine, (group.id, DST, TAG, True), DST,
                lock or threading.Lock(), outboxes, False, 0.0, out), outboxes


def recv_lane(engine, planner, group, box, p2p, like: np.ndarray, mailbox, loop,
              nap: float = 0.05):
    return LANE(box.core, RING, _header(group, 0, like), group, planner, np.ndarray,
                like.dtype, like.shape, like.nbytes, engine, (group.id, SRC, TAG, False), SRC,
                threading.Lock(), p2p, True, nap,
                (box, mailbox, threading.Lock(), loop, "drain"))


def test_a_send_lane_writes_the_record_the_general_path_writes_and_numbers_it(pair):
    engine, planner, group, box, out, _ = pair
    box.set_open(True)
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    lane, _ = send_lane(engine, planner, group, out, arr)
    engine.p2p_seqs[(group.id, DST, TAG, True)] = 41  # numbers continue the table's
    for seq in (41, 42):
        assert lane.send(arr * seq, None) is True  # None: the default group
        raw, payload = box.take(RING)
        assert raw == _header(group, seq, arr)
        assert payload.tobytes() == (arr * seq).tobytes()
    assert engine.p2p_seqs[(group.id, DST, TAG, True)] == 43 and lane.count == 2


@pytest.mark.parametrize("other", ["dtype", "shape", "group", "layout", "readonly_ok",
                                   "list", "subclass"])
def test_a_send_lane_leaves_any_other_message_unnumbered(pair, other):
    engine, planner, group, box, out, _ = pair
    box.set_open(True)
    arr = np.zeros((2, 3), np.int64)
    lane, _ = send_lane(engine, planner, group, out, arr)
    g = None
    if other == "dtype":
        arr = arr.astype(np.float64)
    elif other == "shape":
        arr = arr.reshape(3, 2)
    elif other == "group":
        g = SimpleNamespace(id=group.id)
    elif other == "layout":
        arr = np.zeros((3, 2), np.int64).T
    elif other == "readonly_ok":  # a send reads its array: read-only is fine
        arr.flags.writeable = False
        assert lane.send(arr, g) is True
        return
    elif other == "list":
        arr = arr.tolist()
    elif other == "subclass":
        arr = arr.view(np.matrix)
    assert lane.send(arr, g) is None
    assert engine.p2p_seqs == {} and not box.waiting(RING) and lane.count == 0


@pytest.mark.parametrize("why", ["closed", "full", "peer_lost", "peer_left",
                                 "rendezvous", "lock_busy", "outbox_replaced", "dropped"])
def test_a_send_lane_that_cannot_write_hands_the_send_back_unnumbered(pair, why):
    engine, planner, group, box, out, _ = pair
    box.set_open(why != "closed")
    arr = np.ones(4, np.int32)
    lock = threading.Lock()
    lane, outboxes = send_lane(engine, planner, group, out, arr, lock)
    key = (group.id, DST, TAG, True)
    if why == "full":
        while lane.send(arr, group) is True:
            pass
        before = dict(engine.p2p_seqs)
        assert lane.send(arr, group) is None and engine.p2p_seqs == before
        return
    if why == "peer_lost":
        engine.lost.add(DST)
    elif why == "peer_left":
        engine.left.add(DST)
    elif why == "rendezvous":
        engine.rendezvous_lost = RuntimeError("gone")
    elif why == "lock_busy":
        lock.acquire()
    elif why == "outbox_replaced":
        outboxes[DST] = object()
    elif why == "dropped":
        lane.drop()
    assert lane.send(arr, group) is None
    assert engine.p2p_seqs.get(key, 0) == 0 and not box.waiting(RING)
    if why != "lock_busy":
        assert not lock.locked()


def test_a_recv_lane_takes_its_message_into_the_array(pair):
    engine, planner, group, box, out, p2p = pair
    box.set_open(True)
    mailbox, loop = Mailbox(), Loop()
    got = np.zeros(5, np.int16)
    lane = recv_lane(engine, planner, group, box, p2p, got, mailbox, loop)
    for seq in range(3):
        sent = np.arange(5, dtype=np.int16) + seq
        assert out.put(_header(group, seq, sent), memoryview(sent)) == 1
        assert lane.recv(got, None) is True
        assert got.tolist() == sent.tolist()
    assert engine.p2p_seqs[(group.id, SRC, TAG, False)] == 3 and lane.count == 3
    assert p2p.waiting is False and loop.asked == [] and not box.waiting(RING)


def test_a_recv_lane_waits_a_slice_then_hands_back_the_number(pair):
    engine, planner, group, box, out, p2p = pair
    mailbox, loop = Mailbox(), Loop()
    got = np.zeros(2, np.float64)
    lane = recv_lane(engine, planner, group, box, p2p, got, mailbox, loop, nap=0.05)
    t0 = time.monotonic()
    assert lane.recv(got, group) == 0  # its number: the general receive goes on with it
    assert time.monotonic() - t0 >= 0.04
    assert box.is_open  # a receive opens the inbox to senders
    assert engine.p2p_seqs[(group.id, SRC, TAG, False)] == 1
    # another receive's record at the head: not taken, handed back numbered
    other = np.ones(2, np.float64)
    assert out.put(_header(group, 7, other), memoryview(other)) == 1
    assert lane.recv(got, group) == 1 and box.waiting(RING) and got.tolist() == [0, 0]
    # receives on the loop wait: the rings are theirs once this one is done
    mailbox.loop_waits = True
    box.take(RING)
    assert lane.recv(got, group) == 2 and loop.asked == ["drain"]


def test_a_recv_lane_wakes_when_its_message_comes(pair):
    engine, planner, group, box, out, p2p = pair
    box.set_open(True)
    got = np.zeros(3, np.int32)
    lane = recv_lane(engine, planner, group, box, p2p, got, Mailbox(), Loop(), nap=5.0)
    sent = np.array([7, 8, 9], np.int32)
    t = threading.Timer(0.1, lambda: out.put(_header(group, 0, sent), memoryview(sent)))
    t.start()
    try:
        t0 = time.monotonic()
        assert lane.recv(got, group) is True  # the GIL let go while it slept
        assert time.monotonic() - t0 < 4.0 and got.tolist() == [7, 8, 9]
    finally:
        t.join()


@pytest.mark.parametrize("why", ["early", "dead", "rendezvous"])
def test_a_recv_lane_does_not_sleep_when_the_general_receive_must_look(pair, why):
    engine, planner, group, box, out, p2p = pair
    mailbox = Mailbox()
    if why == "early":
        mailbox.early[("some", "key")] = 1
    elif why == "dead":
        mailbox.dead = RuntimeError("rank 1 died")
    else:
        engine.rendezvous_lost = RuntimeError("gone")
    got = np.zeros(3, np.int32)
    lane = recv_lane(engine, planner, group, box, p2p, got, mailbox, Loop(), nap=5.0)
    t0 = time.monotonic()
    assert lane.recv(got, group) == 0
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("other", ["readonly", "shape", "inbox_replaced", "receiver_busy",
                                   "dropped"])
def test_a_recv_lane_leaves_any_other_receive_unnumbered(pair, other):
    engine, planner, group, box, out, p2p = pair
    box.set_open(True)
    got = np.zeros(3, np.int32)
    lane = recv_lane(engine, planner, group, box, p2p, got, Mailbox(), Loop())
    sent = np.array([1, 2, 3], np.int32)
    assert out.put(_header(group, 0, sent), memoryview(sent)) == 1
    arr = got
    if other == "readonly":
        arr = np.zeros(3, np.int32)
        arr.flags.writeable = False
    elif other == "shape":
        arr = np.zeros((1, 3), np.int32)
    elif other == "inbox_replaced":
        p2p.inbox = object()
    elif other == "receiver_busy":  # another thread waits in the inbox
        busy = threading.Lock()
        lane = LANE(box.core, RING, _header(group, 0, got), group, planner, np.ndarray,
                    got.dtype, got.shape, got.nbytes, engine, (group.id, SRC, TAG, False),
                    SRC, busy, p2p, True, 0.05, (box, Mailbox(), threading.Lock(), Loop(),
                                                 "drain"))
        busy.acquire()
    elif other == "dropped":
        lane.drop()
    assert lane.recv(arr, group) is None
    assert engine.p2p_seqs == {} and box.waiting(RING) and got.tolist() == [0, 0, 0]


def test_a_lane_refuses_a_layout_that_does_not_fit(pair):
    engine, planner, group, box, out, _ = pair
    arr = np.zeros(3, np.int32)
    with pytest.raises(ValueError, match="does not fit"):
        LANE(out.core, 99, _header(group, 0, arr), group, planner, np.ndarray, arr.dtype,
             arr.shape, arr.nbytes, engine, (0, DST, TAG, True), DST, threading.Lock(), {},
             False, 0.0, out)
    with pytest.raises(ValueError, match="does not fit"):
        LANE(out.core, RING, _header(group, 0, arr), group, planner, np.ndarray, arr.dtype,
             arr.shape, 1 << 30, engine, (0, DST, TAG, True), DST, threading.Lock(), {},
             False, 0.0, out)
