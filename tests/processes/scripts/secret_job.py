"""A torchrun-style rank: init, READY (rank 0), wait for the gate file, then 20
all_reduces checked; ``SECRET JOB OK <rank>`` at the end."""

import os
import sys
import time

import numpy as np

import minidist as md

md.init(timeout=60)
rank, n = md.get_rank(), md.get_world_size()
md.barrier()
if rank == 0:
    print("READY", flush=True)
gate, end = os.environ["SECRET_TEST_GATE"], time.monotonic() + 90
while not os.path.exists(gate):
    if time.monotonic() > end:
        sys.exit("the gate never opened")
    time.sleep(0.02)
for i in range(20):
    a = np.full(8, float(rank + 1) * (i + 1))
    md.all_reduce(a)
    assert np.all(a == (i + 1) * n * (n + 1) / 2), a
md.destroy()
print(f"SECRET JOB OK {rank}", flush=True)
