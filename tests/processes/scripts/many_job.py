"""recv_many between a learner (rank 0) and the other ranks (argv: what):

* ``exact``: every worker sends 300 messages (its rank and a counter, with 64 bytes of
  payload) as fast as it can, interleaved with messages of another tag (so rings fill
  and messages go through sockets too); the learner takes them k at a time (k = 3),
  blocking (in the inbox), with async_op=True (on the loop) and from a subset of ranks,
  and checks each sender's messages come in order, whole and exact, and nothing is lost
  or taken twice; then "MANY OK";
* ``kill`` / ``exit``: worker 2 is killed (exits normally) after 20 messages; the learner's
  recv_many raises PeerLostError naming it (left for ``exit``) within seconds;
* ``mismatch``: worker 2's 10th message is too short: the learner's recv_many raises
  CollectiveMismatchError naming rank 2, and the messages it had taken wait for the next
  call (every other message still arrives, once).
"""

import os
import signal
import sys
import time

import numpy as np

import minidist
from minidist.shm import first_k

what = sys.argv[1]
minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
COUNT, K = (300 if what == "exact" else 60), 3
ROW = 8 + 8 + 64


def message(r: int, i: int) -> np.ndarray:
    m = np.random.default_rng([r, i]).integers(0, 256, ROW, dtype=np.uint8)
    m[:16] = np.array([r, i], np.int64).view(np.uint8)
    return m


if rank != 0:
    for i in range(COUNT):
        if rank == 2 and i == 20 and what == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 2 and i == 20 and what == "exit":
            minidist.destroy()
            print("EXITED", flush=True)
            sys.exit(0)
        msg = message(rank, i)
        if what == "mismatch" and rank == 2 and i == 10:
            msg = msg[:40]
        if what == "exact" and i % 7 == 3:
            minidist.send(np.full(5, rank, np.int32), 0, tag=9)  # another receive's
        minidist.send(msg, 0, tag=1)
    minidist.recv(np.zeros(1, np.int64), 0, tag=2)  # until the learner is done
    minidist.destroy()
    sys.exit(0)

seen = {r: 0 for r in range(1, n)}
want = (n - 1) * COUNT - (1 if what == "mismatch" else 0)
got_total = 0
out = np.zeros((K, ROW), np.uint8)
t0 = time.monotonic()
calls = reused = 0
last = kept = mine = None  # the last blocking call's senders (and a copy), its plan
try:
    while got_total < want:
        k = min(K, want - got_total)
        rows = out if k == K else out[:k]  # the same array: planned once, run again
        if what == "exact" and calls % 5 == 1:
            senders = minidist.recv_many(rows, tag=1, async_op=True).result()
        elif what == "exact" and calls % 5 == 2 and any(seen[r] < COUNT for r in (1, 3)):
            subset = [r for r in (1, 3) if r < n and seen[r] < COUNT]
            k = min(k, sum(COUNT - seen[r] for r in subset))
            rows = out[:k]
            senders = minidist.recv_many(rows, src=subset, tag=1)
            assert set(senders.tolist()) <= set(subset), (senders, subset)
        else:
            try:
                senders = minidist.recv_many(rows, tag=1)
            except minidist.CollectiveMismatchError as e:
                assert what == "mismatch" and "rank 2" in str(e), e
                print(f"MISMATCH named=True {time.monotonic() - t0:.1f}", flush=True)
                continue
            if last is not None:  # a result handed out stays the caller's
                assert senders is not last and (last == kept).all(), (last, kept)
            plan = first_k._local.many
            reused += plan is mine and rows is out
            last, kept, mine = senders, senders.copy(), plan
        calls += 1
        assert senders.dtype == np.int64 and len(senders) == k, senders
        for row, s in zip(rows, senders.tolist(), strict=True):
            i = seen[s]
            if what == "mismatch" and s == 2 and i == 10:
                i = 11  # the short one was dropped
            assert row.tobytes() == message(s, i).tobytes(), (s, i, row[:16])
            seen[s] = i + 1
        got_total += k
    for r in range(1, n):  # the other tag: all there, in order
        for _ in range(len(range(3, COUNT, 7)) if what == "exact" else 0):
            x = np.zeros(5, np.int32)
            minidist.recv(x, r, tag=9)
            assert (x == r).all()
    assert reused > 10, reused
    print(f"MANY OK {got_total} in {calls} calls ({reused} planned once)", flush=True)
except minidist.PeerLostError as e:
    print(f"LOST {list(e.ranks)} left={e.left} {time.monotonic() - t0:.1f}", flush=True)
    os._exit(3)
for r in range(1, n):
    minidist.send(np.zeros(1, np.int64), r, tag=2)
minidist.destroy()
