"""Blocking receives like the last one from their rank (minidist.shm.takes), on a node
whose 9 ranks crowd its cores (receivers sleep at once, in the remembered receive).

``loop``: rank 0 (a learner) sends an action to each of ranks 1 - 8 and receives an
observation from each, 300 steps, every value checked on both sides; then, between
ranks 0 and 1 (the others wait at a barrier), every case a remembered receive must
leave to the general path: a message of another group with the same sender and tag
ahead of it, a message of another dtype or shape of the same size (CollectiveMismatchError,
the buffer unchanged, the next message taken), a receive that times out (its message
taken by the next receive), an inbox closed by a receive on the loop (the messages
came through the socket), receives from any rank, bad arguments (they raise and change
nothing). Every rank checks that its remembered receives took messages. Prints
"REPEAT RECVS OK" on rank 0.

``kill`` / ``leave``: after 105 steps, rank 0 SIGKILLs itself (or leaves: destroy, then
a normal exit) while every worker sleeps in its remembered receive; each worker prints
"LOST <ranks> left=<left> <seconds>" and exits 3.

``stop``: rank 1 stops rank 0 (SIGSTOP) for 1.5 s twice during 600 steps, while the
workers wait in their remembered receives; every value is checked after SIGCONT.
Prints "STOPPED OK" on rank 0.
"""

import os
import signal
import sys
import time

import numpy as np

import minidist
from minidist.process_state import STATE
from minidist.shm import core

what = sys.argv[1]
minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
W = n - 1
act = np.zeros(1, np.int64)
obs = np.zeros((n, 16), np.float32)


def taken() -> int:
    return STATE.blocking._session.p2p.takes.taken


def steps(count: int, first: int = 0) -> None:
    for step in range(first, first + count):
        if rank == 0:
            for w in range(1, n):
                minidist.send(np.array([step * 100 + w], np.int64), w)
            if step % 7 == 3:
                time.sleep(0.002)  # the workers sleep in their receives meanwhile
            for w in range(1, n):
                assert minidist.recv(obs[w], w, tag=1) == w
                assert (obs[w] == step * 100 + w + 0.5).all(), (step, w, obs[w])
        else:
            assert minidist.recv(act, 0) == 0
            assert act[0] == step * 100 + rank, (step, act)
            minidist.send(np.full(16, act[0] + 0.5, np.float32), 0, tag=1)


if what in ("kill", "leave"):
    steps(105)
    if rank == 0:  # while the workers wait for step 105
        if what == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        minidist.destroy()
        sys.exit(0)
    t0 = time.monotonic()
    try:
        steps(10, 105)
        print("NO ERROR", flush=True)
    except minidist.PeerLostError as e:
        print(f"LOST {list(e.ranks)} left={e.left} {time.monotonic() - t0:.1f}", flush=True)
        time.sleep(3)  # the other workers raise meanwhile (before this one's exit)
        os._exit(3)
    sys.exit(1)

if what == "stop":
    import threading

    pids = minidist.all_gather_object(os.getpid())

    def pause_rank0() -> None:
        for _ in range(2):
            time.sleep(0.3)
            os.kill(pids[0], signal.SIGSTOP)
            time.sleep(1.5)
            os.kill(pids[0], signal.SIGCONT)

    pauser = threading.Thread(target=pause_rank0) if rank == 1 else None
    if pauser is not None:
        pauser.start()
    steps(600)
    if pauser is not None:
        pauser.join()
    minidist.barrier()
    if rank == 0:
        print("STOPPED OK", flush=True)
    minidist.destroy()
    sys.exit(0)

steps(300)
pair = minidist.new_group([0, 1])
slow = minidist.new_group([0, 1], timeout=1.0)
if rank == 0:
    for i in range(20):  # another group, same sender and tag, sent first
        minidist.send(np.array([i], np.int64), 1)
        minidist.send(np.array([1000 + i], np.int64), 1, group=pair)
    minidist.send(np.array([2.5]), 1)  # float64: 8 bytes, as the int64 actions
    minidist.send(np.array([77], np.int64), 1)
    for i in range(5):
        minidist.send(np.full(4, i, np.float32), 1, tag=2)
    minidist.send(np.full((2, 2), 9, np.float32), 1, tag=2)  # same size, other shape
    minidist.send(np.full(4, 5, np.float32), 1, tag=2)
    for i in range(3):
        minidist.send(np.array([i], np.int64), 1, group=slow)
    time.sleep(2.0)  # rank 1's receive on slow times out meanwhile
    minidist.send(np.array([3], np.int64), 1, group=slow)
    minidist.recv(act, 1, tag=3)  # rank 1 received on its loop: its inbox is closed
    for i in range(10):
        minidist.send(np.array([500 + i], np.int64), 1)
    for i in range(10):
        minidist.send(np.array([600 + i], np.int64), 1, tag=4)
    minidist.send(np.array([700], np.int64), 1)
elif rank == 1:
    for i in range(20):
        minidist.recv(act, 0, group=pair)
        assert act[0] == 1000 + i, (i, act)
        minidist.recv(act, 0)
        assert act[0] == i, (i, act)
    act[0] = -1
    try:
        minidist.recv(act, 0)
        raise AssertionError("a float64 message went into an int64 buffer")
    except minidist.CollectiveMismatchError:
        assert act[0] == -1, act
    minidist.recv(act, 0)
    assert act[0] == 77, act
    got = np.zeros(4, np.float32)
    for i in range(5):
        minidist.recv(got, 0, tag=2)
        assert (got == i).all(), (i, got)
    got[:] = -1
    try:
        minidist.recv(got, 0, tag=2)
        raise AssertionError("a (2, 2) message went into a (4,) buffer")
    except minidist.CollectiveMismatchError:
        assert (got == -1).all(), got
    minidist.recv(got, 0, tag=2)
    assert (got == 5).all(), got
    for i in range(3):
        minidist.recv(act, 0, group=slow)
        assert act[0] == i, (i, act)
    t0 = time.monotonic()
    try:
        minidist.recv(act, 0, group=slow)
        raise AssertionError("no timeout")
    except minidist.DistTimeoutError:
        assert 0.9 < time.monotonic() - t0 < 1.9, time.monotonic() - t0
    minidist.recv(act, 0, group=slow)
    assert act[0] == 3, act
    seen = np.zeros(1, np.int64)
    work = minidist.irecv(seen, 0, tag=4)  # received on the loop: the inbox closes
    minidist.send(act, 0, tag=3)
    work.wait()
    assert seen[0] == 600, seen
    for i in range(10):
        assert minidist.recv(act, 0) == 0
        assert act[0] == 500 + i, (i, act)
    for i in range(1, 10):
        assert minidist.recv(act, None, tag=4) == 0
        assert act[0] == 600 + i, (i, act)
    for bad in (dict(src=[0]), dict(src=0, tag=[0]), dict(src=0, tag=-1)):  # changes nothing
        try:
            minidist.recv(act, **bad)
            raise AssertionError(f"recv with {bad} raised nothing")
        except (TypeError, ValueError) as e:
            assert "must be" in str(e), e  # the general path's words
    for bad in (dict(dst=[0]), dict(dst=0, tag=[0])):
        try:
            minidist.send(act, **bad)
            raise AssertionError(f"send with {bad} raised nothing")
        except (TypeError, ValueError) as e:
            assert "must be" in str(e), e
    assert minidist.recv(act, 0) == 0
    assert act[0] == 700, act
minidist.barrier()
if rank:
    assert taken() >= 200, (rank, taken())
    if core.name() == "compiled":  # the compiled core's lanes carried them, both ways
        p2p = STATE.blocking._session.p2p
        assert p2p.takes.by_lanes >= 200 and p2p.routes.by_lanes >= 200, \
            (rank, p2p.takes.by_lanes, p2p.routes.by_lanes)
counts = minidist.all_gather_object(taken())
if rank == 0:
    assert min(counts) >= 200, counts
    print(f"REPEAT RECVS OK {counts}", flush=True)
minidist.destroy()
