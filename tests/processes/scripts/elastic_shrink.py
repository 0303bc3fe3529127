"""Shrink after kill -9: the last rank kills itself; the survivors see the error, shrink,
and check in the job that every one has the same members and epoch. With ``during``,
rank n-2 dies while the others are inside shrink_group (it is left out too)."""

import os
import signal
import sys
import time

import numpy as np

import minidist

during = "during" in sys.argv
minidist.init(timeout=30)
rank, n = minidist.get_rank(), minidist.get_world_size()
minidist.barrier()
if rank == n - 1:
    os.kill(os.getpid(), signal.SIGKILL)
x = np.ones(4)
t0 = time.monotonic()
try:
    for _ in range(100000):
        minidist.all_reduce(x)
    print("NO ERROR", flush=True)
    sys.exit(1)
except minidist.PeerLostError:
    pass
if during and rank == n - 2:
    time.sleep(0.3)  # the others are inside shrink_group, waiting for this rank
    os.kill(os.getpid(), signal.SIGKILL)
t1 = time.monotonic()
g = minidist.shrink_group()
t2 = time.monotonic()
seen = minidist.all_gather_object((list(g.ranks), g.epoch, g.id), group=g)
same = all(s == seen[0] for s in seen)
y = np.full(3, float(rank))
minidist.all_reduce(y, group=g)
good = bool(np.all(y == sum(g.ranks)))
default = minidist.get_process_group_ranks(None) == list(g.ranks)
print(f"SHRUNK rank={rank} ranks={list(g.ranks)} epoch={g.epoch} same={same} sum={good} "
      f"default={default} grank={minidist.get_rank(g)} ms={1000 * (t2 - t1):.1f}",
      flush=True)
minidist.barrier()  # on the default group: the shrunk one
