"""The job side of the squatter scenario.

Every rank warms up, then rank ``victim`` waits to be killed. Once ``gate`` exists (a
stranger now holds the victim's address), each live rank tries to reach the victim
(send, recv, a world all_reduce; each bounded by 5 s) and then runs ``iters``
collectives on the group of live ranks, checking every result, while the stranger sends
junk to the live ranks' addresses. It reports, prints DONE and waits for ``gate2``.
"""

from __future__ import annotations

import time

import numpy as np
from chaos_common import WrongResult, event, now, params, result, wait_gate

import minidist

p = params()
minidist.init()
rank, n = minidist.get_rank(), minidist.get_world_size()
victim = p["victim"]
live = [r for r in range(n) if r != victim]
g = minidist.new_group(live)
small = np.full(4, rank + 1, np.float32)
big = np.full(p["count"], rank + 1, np.float32)
minidist.all_reduce(small)
minidist.barrier()
event("READY", rank=rank)
if rank == victim:
    time.sleep(120)
    raise SystemExit(0)

wait_gate(p["gate"], 60)
triggers = {
    "send": lambda: minidist.isend(small, dst=victim).wait(5),
    "recv": lambda: minidist.irecv(np.empty(4, np.float32), src=victim).wait(5),
    "all_reduce": lambda: minidist.all_reduce(small, async_op=True).wait(5),
}
for name, fn in triggers.items():
    t0, err = now(), None
    try:
        fn()
    except Exception as e:  # PeerLostError expected; TimeoutError: still trying after 5 s
        err = e
    result(rank, err, phase=f"to_victim_{name}", dt=now() - t0)

err, done = None, 0
want = sum(r + 1 for r in live)
try:
    for i in range(p["iters"]):
        for arr in (small, big):
            arr.fill(rank + 1)
            minidist.all_reduce(arr, group=g)
            if arr[0] != want or arr[-1] != want:
                raise WrongResult(f"all_reduce #{i} gave {arr[0]}, expected {want}")
        small.fill(rank + 1)
        root = live[i % len(live)]
        minidist.broadcast(small, src=root, group=g)
        if small[0] != root + 1:
            raise WrongResult(f"broadcast #{i} gave {small[0]}, expected {root + 1}")
        done += 1
        time.sleep(p.get("pause", 0.05))
except Exception as e:
    err = e
result(rank, err, phase="live", iters=done)
event("DONE", rank=rank)
wait_gate(p["gate2"], 60)
