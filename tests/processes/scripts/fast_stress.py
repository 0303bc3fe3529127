"""Small calls through the shared slots, many times, with every rank's data changing each
call, mixed with calls that take the socket path: every result must be exact."""

import sys

import numpy as np

import minidist
from minidist.shm import fast_slots

if len(sys.argv) > 1:  # groups above this size gather at rank 0, then are released
    fast_slots.CENTRAL_ABOVE = int(sys.argv[1])
minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
sub = minidist.new_group(list(range(0, n, 2)))
for i in range(1500):
    count = 1 + (i * 7) % 1000  # up to 4 KiB of int32
    x = (np.arange(count, dtype=np.int64) * (rank + 1) + i).astype(np.int32)
    minidist.all_reduce(x)
    want = (np.arange(count, dtype=np.int64) * (n * (n + 1) // 2) + n * i).astype(np.int32)
    assert (x == want).all(), f"all_reduce {i}: {np.flatnonzero(x != want)[:5]}"
    if i % 3 == 0:
        root = i % n
        b = np.full(count, -1, np.int32) if rank != root else np.arange(count, dtype=np.int32)
        minidist.broadcast(b, src=root)
        assert (b == np.arange(count)).all(), f"broadcast {i}"
    if i % 5 == 0:
        minidist.barrier()
    if i % 50 == 0:  # a large call between small ones (the socket or segment path)
        big = np.full(100_000, rank, np.float64)
        minidist.all_reduce(big)
        assert (big == n * (n - 1) / 2).all()
    if sub is not minidist.GroupMember.NON_GROUP_MEMBER and i % 7 == 0:
        y = np.array([rank], np.float64)
        minidist.all_reduce(y, op=minidist.ReduceOp.MAX, group=sub)
        assert y[0] == max(range(0, n, 2))
print("FAST STRESS OK", flush=True)
