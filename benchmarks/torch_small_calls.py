"""One-float all_reduce through `import minidist.torch as dist` beside the numpy API, in
the same processes, interleaved: run it with `minidist run -n 2
benchmarks/torch_small_calls.py`. Rank 0 prints the best of 5 loops of 2000 calls each."""

import time

import numpy as np
import torch

import minidist
import minidist.torch as dist

dist.init_process_group()
x = np.ones(1, np.float32)
t = torch.ones(1)


def mean_us(call, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - t0) / reps * 1e6


best = {"numpy": [], "torch": []}
for _ in range(5):
    best["numpy"].append(mean_us(lambda: minidist.all_reduce(x), 2000))
    best["torch"].append(mean_us(lambda: dist.all_reduce(t), 2000))
if minidist.get_rank() == 0:
    a, b = min(best["numpy"]), min(best["torch"])
    print(f"all_reduce of one float: numpy API {a:.1f} us, minidist.torch {b:.1f} us "
          f"({b / a:.2f}x)", flush=True)
dist.destroy_process_group()
