"""All_reduces above a slot (the fast path's mid area), back to back with each other and
with small calls, on the world and on a subgroup: sizes across chunk boundaries and
around the largest that every rank reduces whole, several dtypes and ops, in-place and
strided arrays, one rank now and then late (so the others run ahead into the next
call's bank). Every result must equal the reduction in rank order, bit for bit, on
every rank."""

import time

import numpy as np
from exact_reduce import check, data, expected

import minidist
from minidist.shm import fast_slots

minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
sub = minidist.new_group(list(range(1, n)))
whole = fast_slots.GATHER_BYTES // n // 8 * 8  # the largest that every rank reduces whole
SIZES = [fast_slots.SLOT_BYTES + 4, 3 * 4096 + 8, whole, whole + 8, fast_slots.MID_BYTES]
for chunk_bytes in (fast_slots.MID_CHUNK, fast_slots.MID_CHUNK_PAIR):  # pairs use both
    SIZES[-1:-1] = [chunk_bytes - 8, chunk_bytes, chunk_bytes + 8, 2 * chunk_bytes - 8,
                    2 * chunk_bytes + 12]
OPS = [minidist.ReduceOp.SUM, minidist.ReduceOp.MAX, minidist.ReduceOp.PRODUCT]


for i in range(90):
    nbytes = SIZES[i % len(SIZES)]
    dt = np.dtype([np.float32, np.int64, np.float64, np.int32][i % 4])
    op = OPS[i % 3]
    count = nbytes // dt.itemsize
    members = list(range(n)) if i % 4 else list(range(1, n))
    group = None if i % 4 else sub
    if rank not in members:
        continue
    want = expected(members, i, count, dt, op)
    mine = data(rank, i, count, dt)
    if i % 7 == rank:
        time.sleep(0.002)
    check(i, mine, want, op, group)
    if i % 3 == 0:
        continue
    small = np.array([rank], np.int32)
    minidist.all_reduce(small, group=group)
    assert small[0] == sum(members)
# a one-barrier call, then straight into a chunked one (no small call between them)
total = sum(range(n))
for i in range(300):
    for k, nbytes in enumerate((whole, fast_slots.MID_CHUNK_PAIR * 2 + 8)):
        x = np.full(nbytes // 8, rank + 1000 * (2 * i + k), np.int64)
        minidist.all_reduce(x)
        want = total + n * 1000 * (2 * i + k)
        assert (x == want).all(), f"pair {i}, {nbytes} B: {x[:4]} {x[-4:]}, not {want}"
print("MID STRESS OK", flush=True)
