"""Rank 1 dies with os._exit(1) mid-job; every other rank must raise PeerLostError naming it."""

import os
import sys
import time

import numpy as np

import minidist

minidist.init(timeout=60)
rank = minidist.get_rank()
minidist.barrier()
x = np.ones(1000)
if rank == 1:
    time.sleep(0.5)
    os._exit(1)
t0 = time.monotonic()
try:
    while time.monotonic() - t0 < 60:
        minidist.all_reduce(x)
except minidist.PeerLostError as e:
    print(f"LOST ranks={list(e.ranks)} after={time.monotonic() - t0:.2f} msg={e}", flush=True)
    sys.exit(3)
print("NO ERROR", flush=True)
