"""Small calls through the shared slots where rank 2 passes a different count: every
rank must raise CollectiveMismatchError, before its array is touched (argv: the size
above which groups gather at group rank 0 and are released; optionally the count of the
others and of rank 2, which may take the mid area of the fast path, and the call:
``all_reduce``, ``broadcast`` (from rank 0), or ``broadcast_root`` (rank 2 names rank 1
as the root, the others rank 0))."""

import sys

import numpy as np

import minidist
from minidist.shm import fast_slots

fast_slots.CENTRAL_ABOVE = int(sys.argv[1])
counts = [int(c) for c in sys.argv[2:4]] or [4, 3]
minidist.init(timeout=30)
rank = minidist.get_rank()
for _ in range(20):
    minidist.barrier()
x = np.full(counts[1] if rank == 2 else counts[0], 7.0, np.float32)
what = sys.argv[4] if len(sys.argv) > 4 else "all_reduce"
try:
    if what == "all_reduce":
        minidist.all_reduce(x)
    else:
        minidist.broadcast(x, src=1 if what == "broadcast_root" and rank == 2 else 0)
    print("NO ERROR", flush=True)
except minidist.CollectiveMismatchError as e:
    untouched = bool((x == 7.0).all())
    print(f"MISMATCH untouched={untouched} {'rank 2' in str(e)}", flush=True)
