"""Peak memory of a rank during a 64 MiB all_reduce, from /proc (VmHWM), against the
same process's peak before the call: the extra must stay under 16 MiB.

Run: python -m minidist run -n 4 benchmarks/peak_memory.py [MiB]
"""

import os
import sys

import numpy as np

import minidist
from minidist import diagnostics

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
minidist.init()
x = np.ones(mib << 18, np.float32)
x[:] = 1  # touch every page before measuring
small = np.ones(1, np.float32)
minidist.all_reduce(small)
before = diagnostics.memory_kib(os.getpid())["hwm"]
for _ in range(3):
    minidist.all_reduce(x)
after = diagnostics.memory_kib(os.getpid())["hwm"]
extra = np.array([(after - before) / 1024], np.float64)
minidist.all_reduce(extra, op=minidist.ReduceOp.MAX)
if minidist.get_rank() == 0:
    print(f"n={minidist.get_world_size()} all_reduce {mib} MiB float32: peak RSS grew by "
          f"{extra[0]:.1f} MiB at most (limit: 16 MiB beyond the array)", flush=True)
minidist.destroy()
