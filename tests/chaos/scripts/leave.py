"""A rank leaves on purpose (its script returns, or it calls destroy() and lives on) while
other ranks wait on it, in ``recv`` from it or in a collective that needs it; the ranks
that do not wait on it (bystanders) keep working on a group of their own.

Parameters: ``leaver``, ``waiters`` (global ranks), ``wait`` (recv, all_reduce,
broadcast or scatter from the leaver, all_gather, gather to the first waiter, then a
barrier, barrier), ``how`` (return, destroy), ``size``
(bytes), ``delay`` (seconds from READY to the departure), ``gate``.
"""

from __future__ import annotations

import time

import numpy as np
from chaos_common import WrongResult, event, params, result, wait_gate

import minidist

p = params()
minidist.init()
rank, n = minidist.get_rank(), minidist.get_world_size()
leaver, waiters = p["leaver"], p["waiters"]
bystanders = [r for r in range(n) if r != leaver and r not in waiters]
needs = minidist.new_group(sorted([leaver, *waiters]))  # every rank creates both groups
others = minidist.new_group(bystanders) if bystanders else None
count = max(1, p["size"] // 4)
x = np.full(count, rank + 1, np.float32)
minidist.barrier()
event("READY", rank=rank)

if rank == leaver:
    time.sleep(p["delay"])
    event("LEAVING", rank=rank, how=p["how"])
    if p["how"] == "destroy":
        minidist.destroy()
        event("DESTROYED", rank=rank)
        wait_gate(p["gate"], 60)  # alive, but no longer in the job
    # how == "return": the script simply ends here
elif rank in waiters:
    event("WAITING", rank=rank, wait=p["wait"])
    err = None
    try:
        w = p["wait"]
        if w == "recv":
            minidist.recv(x, src=leaver)
        elif w == "all_reduce":
            minidist.all_reduce(x, group=needs)
        elif w == "broadcast":
            minidist.broadcast(x, src=leaver, group=needs)
        elif w == "all_gather":
            minidist.all_gather(np.empty(count * needs.size, np.float32), x, group=needs)
        elif w == "barrier":
            minidist.barrier(group=needs)
        elif w == "scatter":  # from the leaver: every waiter waits for its release
            minidist.scatter(x, None, src=leaver, group=needs)
        elif w == "gather":  # to the first waiter, which waits for the leaver's part;
            root = waiters[0]  # the other waiters only send, so they wait in a barrier
            out = np.empty(count * needs.size, np.float32) if rank == root else None
            minidist.gather(x, out, dst=root, group=needs)
            minidist.barrier(group=needs)
        else:
            raise ValueError(f"unknown wait {w}")
    except Exception as e:
        err = e
    result(rank, err, role="waiter")
    wait_gate(p["gate"], 60)
else:
    time.sleep(p["delay"] + 1.0)  # until after the departure
    err = None
    try:
        for _ in range(3):
            x.fill(rank + 1)
            minidist.all_reduce(x, group=others)
            want = sum(r + 1 for r in bystanders)
            if x[0] != want or x[-1] != want:
                raise WrongResult(f"all_reduce on the bystanders gave {x[0]}, not {want}")
            minidist.barrier(group=others)
    except Exception as e:
        err = e
    result(rank, err, role="bystander")
    wait_gate(p["gate"], 60)
