"""Small calls through the shared slots where rank 2 passes a different count: every
rank must raise CollectiveMismatchError, before its array is touched (argv: the size
above which groups gather at group rank 0 and are released)."""

import sys

import numpy as np

import minidist
from minidist import fastpath

fastpath.CENTRAL_ABOVE = int(sys.argv[1])
minidist.init(timeout=30)
rank = minidist.get_rank()
for _ in range(20):
    minidist.barrier()
x = np.full(3 if rank == 2 else 4, 7.0, np.float32)
try:
    minidist.all_reduce(x)
    print("NO ERROR", flush=True)
except minidist.CollectiveMismatchError as e:
    untouched = bool((x == 7.0).all())
    print(f"MISMATCH untouched={untouched} {'rank 2' in str(e)}", flush=True)
