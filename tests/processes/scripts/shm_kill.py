"""Large all_reduces through shared memory; rank 1 is killed with SIGKILL mid-job."""

import os
import signal
import sys

import numpy as np

import minidist

minidist.init(timeout=60)
rank = minidist.get_rank()
x = np.ones(1 << 20, np.float32)
minidist.all_reduce(x)  # sets the group's segment up
print(f"JOB {minidist.api.door().job}", flush=True)
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    for _ in range(1000):
        minidist.all_reduce(x)
except minidist.PeerLostError:
    sys.exit(3)
