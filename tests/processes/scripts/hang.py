"""Every rank blocks in a barrier that rank 0 never enters (for Ctrl-C tests)."""

import os
import time

import minidist

minidist.init(timeout=120)
print(f"PID {os.getpid()}", flush=True)
if minidist.get_rank() == 0:
    time.sleep(120)
minidist.barrier()
