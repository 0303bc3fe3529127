"""A first look at minidist: run with ``minidist run -n 4 examples/demo.py``."""

import numpy as np

import minidist

minidist.init()  # reads the launcher's environment; with none, a world of one
rank, size = minidist.get_rank(), minidist.get_world_size()

x = np.full(1_000_003, rank, dtype=np.float32)
minidist.all_reduce(x)  # in place, SUM by default
assert (x == sum(range(size))).all()

y = np.arange(8, dtype=np.int64) * (rank + 1)
minidist.broadcast(y, src=size - 1)  # everyone gets the last rank's array
minidist.barrier()

w = minidist.all_reduce(np.array([float(rank)]), op=minidist.ReduceOp.MAX, async_op=True)
w.wait()

print(f"rank {rank}/{size}: all_reduce -> {x[0]:.0f}, broadcast -> {y[:4]}", flush=True)
minidist.destroy()
