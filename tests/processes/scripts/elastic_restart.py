"""Restart and rejoin: the last rank kills itself once; the launcher (--restart-failed)
starts it again. The survivors shrink, wait for it, and make a group with it again; the
same new_group call on the newcomer makes the same group; messages both ways work."""

import os
import signal
import sys
import time

import numpy as np

import minidist

minidist.init(timeout=30)
rank, n = minidist.get_rank(), minidist.get_world_size()
victim = n - 1
everyone = list(range(n))
restarted = int(os.environ.get("MINIDIST_RESTART_COUNT", "0"))
if restarted:
    # the newcomer: the same call as the survivors', whatever groups they made before
    g2 = minidist.new_group(everyone)
else:
    first = minidist.new_group(everyone)  # a group the newcomer never made
    minidist.barrier(group=first)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        minidist.all_reduce(np.ones(2), group=first)
        print("NO ERROR", flush=True)
        sys.exit(1)
    except minidist.PeerLostError:
        t_err = time.monotonic()
    g = minidist.shrink_group(group=first)
    assert victim not in g.ranks
    back = minidist.wait_ranks([victim], timeout=20)
    t_back = time.monotonic()
    assert back == [victim], back
    g2 = minidist.new_group(everyone)
    print(f"BACK rank={rank} after={1000 * (t_back - t_err):.0f}ms", flush=True)
ids = minidist.all_gather_object(g2.id, group=g2)
same = len(set(ids)) == 1
y = np.full(3, float(rank + 1))
minidist.all_reduce(y, group=g2)
good = bool(np.all(y == sum(r + 1 for r in everyone)))
# messages with the newcomer, both ways, from a rank of the same node
if rank == 0:
    for k in range(3):
        a = np.full(5, float(k))
        minidist.send(a, victim)
        minidist.recv(a, victim)
        assert np.all(a == k + 1), a
    minidist.send_object({"hello": rank}, victim, tag=7)
elif rank == victim:
    for _ in range(3):
        a = np.empty(5)
        minidist.recv(a, 0)
        minidist.send(a + 1, 0)
    assert minidist.recv_object(0, tag=7) == {"hello": 0}
minidist.barrier(group=g2)
print(f"REJOINED rank={rank} restarted={restarted} same={same} sum={good}", flush=True)
