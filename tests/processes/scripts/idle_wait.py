"""Rank 0 sleeps before a barrier; the others wait in it. Each waiting rank measures the
CPU time it used while waiting, from /proc; rank 0 prints the total. With IDLE_ROUNDS=k
the sleep is cut into k barriers, each after rank 0 slept its share (waiters that spin
or yield before they sleep do so once per barrier). IDLE_CALLS (default "barrier") names
the calls the others wait in, one after the other, each measured and printed: "barrier",
"scatter" (a scatter from rank 0, after ten like it: planned once) or "recv" (a receive
from rank 0, after ten like it: a remembered receive)."""

import os
import time

import numpy as np

import minidist
from minidist import diagnostics

SLEEP = float(os.environ.get("IDLE_SLEEP", "5"))
ROUNDS = int(os.environ.get("IDLE_ROUNDS", "1"))
CALLS = os.environ.get("IDLE_CALLS", "barrier").split(",")
minidist.init(timeout=120)
rank, n = minidist.get_rank(), minidist.get_world_size()
act = np.zeros(1, np.int64)
acts = np.zeros(n, np.int64)


def call(what: str) -> None:
    if what == "barrier":
        minidist.barrier()
    elif what == "scatter":
        minidist.scatter(act, acts if rank == 0 else None, src=0)
    elif rank == 0:  # recv: rank 0 sends to every other rank
        for r in range(1, n):
            minidist.send(act, r)
    else:
        minidist.recv(act, 0)


for what in CALLS:
    for _ in range(10):  # (connections open, calls planned once, receives remembered)
        call(what)
    minidist.barrier()
    cpu0 = diagnostics.cpu_seconds(os.getpid())
    t0 = time.monotonic()
    for _ in range(ROUNDS):
        if rank == 0:
            time.sleep(SLEEP / ROUNDS)
        call(what)
    used = np.array([0.0 if rank == 0 else diagnostics.cpu_seconds(os.getpid()) - cpu0])
    waited = np.array([time.monotonic() - t0])
    minidist.all_reduce(used)
    minidist.all_reduce(waited, op=minidist.ReduceOp.MIN)
    if rank == 0:
        print(f"WAIT {what} cpu_seconds={used[0]:.3f} ranks={n - 1} "
              f"waited_min={waited[0]:.2f}", flush=True)
minidist.destroy()
