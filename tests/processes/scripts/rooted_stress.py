"""Scatter, gather and all_gather through the group's rooted area (minidist.shm.rooted_area),
mixed with all_reduce and barrier (the fast slots), with random roots, dtypes and sizes
up to the area's piece, and runs of the same kind back to back (a root that scatters
twice in a row waits for its slow readers); every value is checked bit for bit against
what each rank can compute itself (argv: the seed)."""

import sys

import numpy as np

import minidist
from minidist import api
from minidist.group import WORLD_ID
from minidist.shm import rooted_area

minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
rng = np.random.default_rng(int(sys.argv[1]))  # the same draws on every rank
piece = rooted_area.piece_bytes(n)
DTYPES = [np.uint8, np.int32, np.float32, np.float64, np.int64]


def data(seed: int, r: int, count: int, dtype) -> np.ndarray:
    bits = np.random.default_rng([seed, r]).integers(0, 256, count * np.dtype(dtype).itemsize,
                                                     dtype=np.uint8)
    return bits.view(dtype)


calls = 0
for step in range(int(sys.argv[2]) if len(sys.argv) > 2 else 600):
    kind = ["scatter", "gather", "all_gather", "all_reduce", "barrier"][
        rng.integers(0, 5) if step % 50 >= 20 else step % 2]
    if step % 100 >= 94:  # runs of one kind: the root writes again what others may read
        kind = ["scatter", "gather", "all_gather"][step // 100 % 3]
    dtype = DTYPES[rng.integers(0, len(DTYPES))]
    most = piece // np.dtype(dtype).itemsize
    count = int(rng.choice([1, 2, 7, most // 3, most]))
    root = int(rng.integers(0, n))
    seed = step
    if kind == "scatter":
        out = np.full(count, 0, dtype)
        inp = np.concatenate([data(seed, r, count, dtype) for r in range(n)]) \
            if rank == root else None
        minidist.scatter(out, inp, src=root)
        assert out.tobytes() == data(seed, rank, count, dtype).tobytes(), (step, kind)
    elif kind in ("gather", "all_gather"):
        mine = data(seed, rank, count, dtype)
        out = np.zeros(n * count, dtype)
        if kind == "gather":
            minidist.gather(mine, out if rank == root else None, dst=root)
        else:
            minidist.all_gather(out, mine)
        if kind == "all_gather" or rank == root:
            want = np.concatenate([data(seed, r, count, dtype) for r in range(n)])
            assert out.tobytes() == want.tobytes(), (step, kind)
    elif kind == "all_reduce":
        x = np.full(3, rank + 1, np.int64)
        minidist.all_reduce(x)
        assert (x == n * (n + 1) // 2).all()
    else:
        minidist.barrier()
    calls += kind in ("scatter", "gather", "all_gather")
rooted = api.door()._session.fast_segments.slots[WORLD_ID].rooted
assert int(rooted.done[rooted.me]) > 0, "the rooted area was never used"
print(f"rank {rank} ROOTED STRESS OK {calls}", flush=True)
minidist.destroy()
