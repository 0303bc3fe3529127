"""The workers wait in a scatter while the learner (rank 0) sleeps 5 s (IDLE_SLEEP)
before it scatters; each worker measures the CPU time it used while waiting, from /proc,
and rank 0 prints the total."""

import os
import time

import numpy as np

import minidist
from minidist import diagnostics

SLEEP = float(os.environ.get("IDLE_SLEEP", "5"))
minidist.init(timeout=120)
rank, n = minidist.get_rank(), minidist.get_world_size()
act = np.zeros(1, np.int64)
acts = np.arange(n, dtype=np.int64)
for _ in range(3):  # the rooted area is set up, every rank is past its first calls
    minidist.scatter(act, acts if rank == 0 else None, src=0)
    minidist.gather(act, np.zeros(n, np.int64) if rank == 0 else None, dst=0)
cpu0 = diagnostics.cpu_seconds(os.getpid())
t0 = time.monotonic()
if rank == 0:
    time.sleep(SLEEP)
minidist.scatter(act, acts if rank == 0 else None, src=0)
assert act[0] == rank
used = np.array([0.0 if rank == 0 else diagnostics.cpu_seconds(os.getpid()) - cpu0])
waited = np.array([time.monotonic() - t0])
minidist.all_reduce(used)
minidist.all_reduce(waited, op=minidist.ReduceOp.MIN)
if rank == 0:
    print(f"WAIT cpu_seconds={used[0]:.3f} ranks={n - 1} waited_min={waited[0]:.2f}",
          flush=True)
minidist.destroy()
