"""Small calls through the shared slots where rank 2 passes a different count: every
rank must raise CollectiveMismatchError, before its array is touched (argv: the size
above which groups gather at group rank 0 and are released; optionally the count of the
others and of rank 2, which may take the mid area of the fast path)."""

import sys

import numpy as np

import minidist
from minidist import fastpath

fastpath.CENTRAL_ABOVE = int(sys.argv[1])
counts = [int(c) for c in sys.argv[2:4]] or [4, 3]
minidist.init(timeout=30)
rank = minidist.get_rank()
for _ in range(20):
    minidist.barrier()
x = np.full(counts[1] if rank == 2 else counts[0], 7.0, np.float32)
try:
    minidist.all_reduce(x)
    print("NO ERROR", flush=True)
except minidist.CollectiveMismatchError as e:
    untouched = bool((x == 7.0).all())
    print(f"MISMATCH untouched={untouched} {'rank 2' in str(e)}", flush=True)
