"""A stream of collectives on the world group until the first error.

Used where a rank is killed (any rank, or the rendezvous host under a torchrun-like
environment), stopped and continued, or where the launcher is killed. Parameters (JSON,
first argument): ``ops`` (each call's collective is drawn from it with ``seed``, the same
on every rank), ``size`` (bytes per rank, float32), ``duration`` (seconds to keep going
without an error), ``later`` (after the first error: this many more calls at once, then,
once ``later_gate`` exists, as many again, each reported with its duration), ``gate``
(wait for it before exiting), ``idle`` (after READY, do work that never calls minidist).
"""

from __future__ import annotations

import random
import time

import numpy as np
from chaos_common import WrongResult, event, now, params, result, wait_gate

import minidist

p = params()
minidist.init()
rank, n = minidist.get_rank(), minidist.get_world_size()
count = max(1, p["size"] // 4)
ops = p["ops"]
x = np.empty(count, np.float32)
out = np.empty(count * n, np.float32) if {"all_gather", "gather"} & set(ops) else None
blocks = np.repeat(np.arange(1, n + 1, dtype=np.float32), count) if "scatter" in ops else None
ranks_plus_one = np.arange(1, n + 1, dtype=np.float32)


def call(op: str, i: int) -> None:
    """One collective, with its first and last elements checked. Every call's values
    depend on its number (rank r contributes (r + 1) * (i % 4096 + 1), exact in float32),
    so that a rank reading another call's data, earlier or later, is caught."""
    if op == "barrier":
        minidist.barrier()
        return
    scale = i % 4096 + 1
    x.fill((rank + 1) * scale)
    if op == "all_reduce":
        minidist.all_reduce(x)
        want = n * (n + 1) / 2 * scale
        got = (x[0], x[-1])
    elif op == "broadcast":
        root = i % n
        minidist.broadcast(x, src=root)
        want = (root + 1) * scale
        got = (x[0], x[-1])
    elif op == "scatter":  # rank r's block holds (r + 1) * scale
        root = i % n
        minidist.scatter(x, blocks * scale if rank == root else None, src=root)
        want = (rank + 1) * scale
        got = (x[0], x[-1])
    elif op in ("all_gather", "gather"):
        root = i % n
        if op == "all_gather":
            minidist.all_gather(out, x)
        else:
            minidist.gather(x, out if rank == root else None, dst=root)
            if rank != root:
                return
        if not (np.array_equal(out[::count], ranks_plus_one * scale)
                and np.array_equal(out[count - 1::count], ranks_plus_one * scale)):
            raise WrongResult(f"{op} #{i} gave {out[::count].tolist()} (first "
                              f"elements), expected {(ranks_plus_one * scale).tolist()}")
        return
    else:
        raise ValueError(f"unknown op {op}")
    if got[0] != want or got[1] != want:
        bad = np.flatnonzero(x != want)
        raise WrongResult(f"{op} #{i} gave {x[bad[0]]} at element {bad[0]} and "
                          f"{bad.size - 1} more wrong ({[float(v) for v in got]} at the "
                          f"first and last), expected {want}")


minidist.barrier()
event("READY", rank=rank)
if p.get("idle"):  # the application's own work, no minidist call
    end = now() + p.get("duration", 60)
    while now() < end:
        time.sleep(0.01)
    result(rank, None, phase="first", op="idle", i=0)
    raise SystemExit(0)

rng = random.Random(p["seed"])
end = now() + p.get("duration", 60)
i, op, first = 0, "", None
try:
    while now() < end:
        op = rng.choice(ops)
        call(op, i)
        i += 1
except Exception as e:  # DistError expected; anything else is reported as it is
    first = e
result(rank, first, phase="first", op=op, i=i)

if first is not None and p.get("later"):
    batches = [None, p.get("later_gate")]
    k = 0
    for gate in batches:
        if gate and not wait_gate(gate, 60):
            break
        for _ in range(p["later"]):
            later_op = ops[k % len(ops)] if len(ops) > 1 else ops[0]
            t0 = now()
            err = None
            try:
                call(later_op, i + 1 + k)
            except Exception as e:
                err = e
            result(rank, err, phase="later" if gate is None else "later2", op=later_op,
                   i=i + 1 + k, dt=now() - t0)
            k += 1

wait_gate(p.get("gate"), 60)
