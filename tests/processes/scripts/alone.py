"""Run without any launcher: a world of one."""

import numpy as np

import minidist

minidist.init()
assert (minidist.get_rank(), minidist.get_world_size()) == (0, 1)
x = np.arange(5, dtype=np.float32)
minidist.all_reduce(x)
minidist.all_reduce(x, op=minidist.ReduceOp.AVG)
minidist.broadcast(x, src=0)
minidist.barrier()
minidist.all_reduce(x, async_op=True).wait()
assert (x == np.arange(5)).all()
s = minidist.get_store()
s.set("k", "v")
assert s.get("k") == b"v" and s.add("c", 2) == 2
minidist.destroy()
print("ALONE OK", flush=True)
