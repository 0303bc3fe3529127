"""Broadcasts above a slot (through the fast path's mid area, one bank a step), back to
back with each other and with all_reduces that use the same banks, on the world and on a
subgroup: sizes around the step, several dtypes, every root, strided arrays, one rank
now and then late (so the root runs ahead into the next step's bank). Every rank must
end with the root's array, bit for bit."""

import time

import numpy as np
from exact_reduce import data

import minidist
from minidist.shm import fast_slots

minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
sub = minidist.new_group(list(range(1, n)))
SIZES = [fast_slots.SLOT_BYTES + 8, 40_000, fast_slots.MID_CHUNK + 16]
total = sum(range(n))
for i in range(120):
    members = list(range(n)) if i % 4 else list(range(1, n))
    group = None if i % 4 else sub
    if rank not in members:
        continue
    step = fast_slots.bank_bytes(len(members))
    nbytes = (SIZES + [step - 8, step, step + 8, 2 * step + 24, 20 << 20])[i % 8]
    dt = np.dtype([np.float32, np.int64, np.uint8, np.float64][i % 4])
    count = nbytes // dt.itemsize
    root = members[i % len(members)]
    want = data(root, i, count, dt)
    if i % 5 == 0:  # a strided array: broadcast into (or from) every other element
        room = np.zeros(2 * count, dt)
        x = room[::2]
        x[:] = want if rank == root else 0
    else:
        x = want.copy() if rank == root else np.zeros(count, dt)
    if i % 7 == rank:
        time.sleep(0.002)
    minidist.broadcast(x, src=root, group=group)
    assert x.tobytes() == want.tobytes(), f"call {i}, {nbytes} B from {root}: {x[:4]}"
    if i % 5 == 0:
        assert not room[1::2].any(), f"call {i}: the gaps of the strided array changed"
    if i % 3:  # an all_reduce on the same banks, straight after
        y = np.full((fast_slots.MID_CHUNK + 8) // 8, rank, np.int64)
        minidist.all_reduce(y, group=group)
        assert (y == sum(members)).all(), f"call {i}: all_reduce after it {y[:4]}"
# broadcasts and one-barrier all_reduces back to back: both use bank f % 2
for i in range(300):
    x = np.full(5000, rank + i if rank == i % n else -1, np.int64)
    minidist.broadcast(x, src=i % n)
    assert (x == i % n + i).all(), f"pair {i}: {x[:4]}"
    y = np.full(2000, rank + i, np.int64)
    minidist.all_reduce(y)
    assert (y == total + n * i).all(), f"pair {i}: all_reduce {y[:4]}"
print("BCAST STRESS OK", flush=True)
