"""init, all_reduce, destroy, then the same again in the same process."""

import numpy as np

import minidist

for round_ in range(2):
    minidist.init(timeout=30)
    x = np.full(10, minidist.get_rank() + round_, np.int64)
    minidist.all_reduce(x)
    n = minidist.get_world_size()
    assert (x == n * (n - 1) // 2 + n * round_).all(), x
    store = minidist.get_store()
    store.set(f"r{round_}-{minidist.get_rank()}", b"x")
    minidist.destroy()
    assert not minidist.is_initialized()
print("REINIT OK", flush=True)
