"""Scatters and gathers repeated and varied (minidist.shm.repeat): dtypes, shapes,
roots, groups (the default one and an explicit one, a subgroup) and other calls in
between, drawn alike on every rank with one seed; every value is checked. Then calls
a remembered one would take but must not: a read-only output and a non-contiguous one
raise on every rank (nothing was sent), and the next good call is right."""

from __future__ import annotations

import random
import sys

import numpy as np

import minidist
from minidist.shm import repeat

minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
world = minidist.new_group(list(range(n)))
sub = minidist.new_group([0, n - 1])
rng = random.Random(int(sys.argv[1]))
steps = int(sys.argv[2])
used = set()
last: dict = {}
for i in range(steps):
    what = rng.choice(("scatter", "gather", "scatter", "gather", "all_reduce"))
    if what in last and rng.random() < 0.7:  # mostly the same call again
        dtype, shape, group, root = last[what]
    else:
        dtype = rng.choice((np.int64, np.float32, np.uint8))
        shape = rng.choice(((1,), (3,), (2, 4)))
        group = rng.choice((None, world, sub))
        root = rng.choice(list(range(n)) if group is not sub else [0, n - 1])
    last[what] = (dtype, shape, group, root)
    members = list(range(n)) if group is not sub else [0, n - 1]
    if rank not in members:
        continue
    k = len(members)
    val = (i % 50) + 1
    if what == "all_reduce":
        x = np.full(4, val, np.float64)
        minidist.all_reduce(x, group=group)
        assert (x == val * k).all(), (i, x)
        continue
    used.add(what)
    size = int(np.prod(shape))
    if what == "scatter":
        out = np.zeros(shape, dtype)
        src = None
        if rank == root:
            src = np.stack([np.full(shape, (r + val) % 100, dtype) for r in range(k)])
        minidist.scatter(out, src, src=root, group=group)
        me = members.index(rank)
        assert (out == (me + val) % 100).all(), (i, what, out, me, val)
    else:
        mine = np.full(shape, (rank + val) % 100, dtype)
        out = np.zeros((k, *shape), dtype) if rank == root else None
        minidist.gather(mine, out, dst=root, group=group)
        if rank == root:
            for j, r in enumerate(members):
                assert (out[j] == (r + val) % 100).all(), (i, what, out, r)
remembered = {k: repeat.remembered(k) is not None for k in ("scatter", "gather")}
assert remembered == {k: k in used for k in remembered}, remembered

# a remembered call's twin with an output it cannot write into
out = np.zeros(2, np.float32)
src = np.arange(2 * n, dtype=np.float32) if rank == 0 else None
minidist.scatter(out, src, src=0)
minidist.scatter(out, src, src=0)
assert repeat.remembered("scatter") is not None
out.flags.writeable = False
try:
    minidist.scatter(out, src, src=0)
except ValueError as e:
    assert "read-only" in str(e), e
else:
    raise AssertionError("a read-only output was accepted")
wide = np.zeros(4, np.float32)[::2]  # the same shape and dtype, not contiguous
minidist.scatter(wide, src, src=0)  # the general path: a copy, then written back
assert (wide == [2 * rank, 2 * rank + 1]).all(), wide
good = np.zeros(2, np.float32)
minidist.scatter(good, src, src=0)
assert (good == [2 * rank, 2 * rank + 1]).all(), good
minidist.barrier()
print("REPEAT OK", flush=True)
minidist.destroy()
