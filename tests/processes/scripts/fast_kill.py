"""Small calls through the shared slots; one rank SIGKILLs itself mid-loop. The others
must raise PeerLostError within seconds (argv: the victim, the size above which groups
gather at group rank 0 and are released, optionally the all_reduce's count, and
``broadcast`` to broadcast that array from rank 0 instead)."""

import os
import signal
import sys
import time

import numpy as np

import minidist
from minidist.shm import fast_slots

victim, fast_slots.CENTRAL_ABOVE = int(sys.argv[1]), int(sys.argv[2])
minidist.init(timeout=60)
rank = minidist.get_rank()
x = np.ones(int(sys.argv[3]) if len(sys.argv) > 3 else 4, np.float32)
if len(sys.argv) > 4 and sys.argv[4] == "broadcast":
    def call(a):
        minidist.broadcast(a, src=0)
else:
    call = minidist.all_reduce
for _ in range(300):
    call(x)
    minidist.barrier()
t0 = time.monotonic()
try:
    for i in range(100_000):
        if rank == victim and i == 50:
            os.kill(os.getpid(), signal.SIGKILL)
        minidist.barrier() if i % 2 else call(x)
    print("NO ERROR", flush=True)
except minidist.PeerLostError as e:
    print(f"LOST {list(e.ranks)} {time.monotonic() - t0:.1f}", flush=True)
    sys.exit(3)
