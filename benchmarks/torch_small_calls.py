"""One-float all_reduce through `import minidist.torch as dist` beside the numpy API, in
the same processes, interleaved: run it with `minidist run -n 2
benchmarks/torch_small_calls.py`. 40 rounds, each one loop of 500 calls of either kind
back to back (which goes first alternates); rank 0 prints the best loop of each kind and
the median over rounds of the ratio within a round (the two loops of a round are
milliseconds apart, so a shared machine's slow spells cancel out of it)."""

import time

import numpy as np
import torch

import minidist
import minidist.torch as dist

dist.init_process_group()
x = np.zeros(1, np.float32)  # zeros: repeated sums stay finite
t = torch.zeros(1)


def mean_us(call, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - t0) / reps * 1e6


times: dict[str, list[float]] = {"numpy": [], "torch": []}
calls = {"numpy": lambda: minidist.all_reduce(x), "torch": lambda: dist.all_reduce(t)}
mean_us(calls["numpy"], 2000)
mean_us(calls["torch"], 2000)
for i in range(40):
    for kind in (("numpy", "torch") if i % 2 else ("torch", "numpy")):
        times[kind].append(mean_us(calls[kind], 500))
if minidist.get_rank() == 0:
    a, b = min(times["numpy"]), min(times["torch"])
    ratio = float(np.median(np.array(times["torch"]) / np.array(times["numpy"])))
    print(f"all_reduce of one float: numpy API {a:.1f} us, minidist.torch {b:.1f} us "
          f"(best loops: {b / a:.2f}x; median ratio within a round: {ratio:.2f}x)",
          flush=True)
dist.destroy_process_group()
