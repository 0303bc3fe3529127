"""Small calls through the shared slots; one rank SIGKILLs itself mid-loop. The others
must raise PeerLostError within seconds (argv: the victim, the size above which groups
gather at group rank 0 and are released, and optionally the all_reduce's count)."""

import os
import signal
import sys
import time

import numpy as np

import minidist
from minidist import fastpath

victim, fastpath.CENTRAL_ABOVE = int(sys.argv[1]), int(sys.argv[2])
minidist.init(timeout=60)
rank = minidist.get_rank()
x = np.ones(int(sys.argv[3]) if len(sys.argv) > 3 else 4, np.float32)
for _ in range(300):
    minidist.all_reduce(x)
    minidist.barrier()
t0 = time.monotonic()
try:
    for i in range(100_000):
        if rank == victim and i == 50:
            os.kill(os.getpid(), signal.SIGKILL)
        minidist.barrier() if i % 2 else minidist.all_reduce(x)
    print("NO ERROR", flush=True)
except minidist.PeerLostError as e:
    print(f"LOST {list(e.ranks)} {time.monotonic() - t0:.1f}", flush=True)
    sys.exit(3)
