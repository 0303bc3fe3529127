"""Shared-memory calls back to back: a rank that finishes one may start the next while
a slower rank still copies its result out of the segment. Results must stay exact."""

import numpy as np

import minidist

minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
x = np.empty(4 << 20, np.float32)  # 16 MiB: shared memory for both calls
for i in range(12):
    root = i % n
    x.fill(rank + 1)
    minidist.broadcast(x, src=root, algorithm="shared_memory")
    bad = np.flatnonzero(x != root + 1)
    assert bad.size == 0, f"broadcast {i}: {bad.size} elements wrong from {bad[0]}"
    x.fill(rank + 1)
    minidist.all_reduce(x, algorithm="shared_memory")
    bad = np.flatnonzero(x != n * (n + 1) / 2)
    assert bad.size == 0, f"all_reduce {i}: {bad.size} elements wrong from {bad[0]}"
print("SHM BACK TO BACK OK", flush=True)
