"""Rank 0 sleeps before a barrier; the others wait in it. Each waiting rank measures the
CPU time it used while waiting, from /proc; rank 0 prints the total. With IDLE_ROUNDS=k
the sleep is cut into k barriers, each after rank 0 slept its share (waiters that spin
or yield before they sleep do so once per barrier)."""

import os
import time

import numpy as np

import minidist
from minidist import diagnostics

SLEEP = float(os.environ.get("IDLE_SLEEP", "5"))
ROUNDS = int(os.environ.get("IDLE_ROUNDS", "1"))
minidist.init(timeout=120)
rank = minidist.get_rank()
minidist.barrier()
minidist.barrier()  # connections of the barrier are open before the measurement
cpu0 = diagnostics.cpu_seconds(os.getpid())
t0 = time.monotonic()
for _ in range(ROUNDS):
    if rank == 0:
        time.sleep(SLEEP / ROUNDS)
    minidist.barrier()
used = np.array([0.0 if rank == 0 else diagnostics.cpu_seconds(os.getpid()) - cpu0])
waited = np.array([time.monotonic() - t0])
minidist.all_reduce(used)
minidist.all_reduce(waited, op=minidist.ReduceOp.MIN)
if rank == 0:
    print(f"WAIT cpu_seconds={used[0]:.3f} ranks={minidist.get_world_size() - 1} "
          f"waited_min={waited[0]:.2f}", flush=True)
minidist.destroy()
