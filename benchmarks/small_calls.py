"""Time small calls in a plain loop: run it with `minidist run -n N` (and again with
MINIDIST_FASTPATH=0 to see the socket path). Prints, per rank, the mean time of a
4-byte and a 1 KiB all_reduce and of a barrier."""

import time

import numpy as np

import minidist

minidist.init()
rank, n = minidist.get_rank(), minidist.get_world_size()
MAX = minidist.ReduceOp.MAX
x = np.ones(1, np.float32)
y = np.ones(256, np.float32)
for _ in range(2000):  # warm up (set up the shared slots; let the scheduler settle)
    minidist.all_reduce(x, op=MAX)
minidist.barrier()


def mean_us(call, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - t0) / reps * 1e6


t4 = mean_us(lambda: minidist.all_reduce(x, op=MAX), 3000)
t1k = mean_us(lambda: minidist.all_reduce(y, op=MAX), 3000)
tb = mean_us(minidist.barrier, 300)
print(f"rank {rank} of {n}: all_reduce 4 B {t4:.1f} us, 1 KiB {t1k:.1f} us, "
      f"barrier {tb:.1f} us", flush=True)
