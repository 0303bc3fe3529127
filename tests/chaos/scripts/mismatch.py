"""Ranks that disagree about one call; each reports the error of that call, or, if the
call returned, of the next call on the group (a barrier). ``call`` in the report says
which: ``warmup`` (the barrier before it, still running on this rank when another rank
already found the mismatch), ``op``, ``next``, or ``none`` (no error at all).

Parameters: ``case`` = ``root`` (``op`` in broadcast, scatter, reduce, gather, with
``roots[rank]`` as this rank's root), ``size`` (``all_reduce`` of ``small`` elements on
rank ``odd`` and ``count`` on the others) or ``algorithm`` (``all_reduce`` with
``algorithm="shared_memory"`` on rank ``odd`` and ``"ring"`` on the others); ``count``;
``gate``.
"""

from __future__ import annotations

import numpy as np
from chaos_common import event, params, result, wait_gate

import minidist

p = params()
minidist.init()
rank, n = minidist.get_rank(), minidist.get_world_size()
case, count = p["case"], p["count"]
event("READY", rank=rank)
call, err = "warmup", None
try:
    minidist.barrier()
    call = "op"
    event("ENTER", rank=rank)
    if case == "root":
        root, op = p["roots"][rank], p["op"]
        if op == "broadcast":
            minidist.broadcast(np.full(count, rank, np.float32), src=root)
        elif op == "scatter":
            data = np.arange(count * n, dtype=np.float32) if rank == root else None
            minidist.scatter(np.empty(count, np.float32), data, src=root)
        elif op == "reduce":
            minidist.reduce(np.full(count, rank, np.float32), dst=root)
        elif op == "gather":
            out = np.empty(count * n, np.float32) if rank == root else None
            minidist.gather(np.full(count, rank, np.float32), out, dst=root)
        else:
            raise ValueError(f"unknown op {op}")
    elif case == "size":
        minidist.all_reduce(np.ones(p["small"] if rank == p["odd"] else count, np.float32))
    elif case == "algorithm":
        algo = "shared_memory" if rank == p["odd"] else "ring"
        minidist.all_reduce(np.ones(count, np.float32), algorithm=algo)
    else:
        raise ValueError(f"unknown case {case}")
    call = "next"
    minidist.barrier()
    call = "none"
except Exception as e:
    err = e
result(rank, err, call=call)
wait_gate(p["gate"], 60)
