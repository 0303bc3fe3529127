"""The timing job of :func:`minidist.calibrate.measure`: each rank runs minidist's own
all_reduce through the blocking API, as scripts call it (the caller's thread hands each
call to the event loop), on the socket path (recursive doubling and the ring: different
numbers of messages) and the shared-memory path, small and large. Run by
``minidist run -n 4 -m minidist.calibrate_job [--quick]``; rank 0 prints
:data:`minidist.calibrate.RESULT` and what it found as JSON."""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import minidist as md
from minidist.calibrate import RESULT, SMALL, cases


def main(quick: bool) -> None:
    md.init()
    found = {}
    for name, algorithm, count in cases(quick):
        a = np.zeros(count, np.float32)
        small = count == SMALL
        batch, batches = (20, 8 if quick else 25) if small else (1, 4 if quick else 7)
        for _ in range(3 if small else 1):
            md.all_reduce(a, algorithm=algorithm)
        walls, cpus = [], []
        for _ in range(batches):
            md.barrier()
            w, c = time.perf_counter(), time.process_time()
            for _ in range(batch):
                md.all_reduce(a, algorithm=algorithm)
            walls.append((time.perf_counter() - w) / batch)
            cpus.append((time.process_time() - c) / batch)
        both = md.all_gather_object((float(np.median(walls)), float(np.median(cpus))))
        found[name] = {"wall": max(x[0] for x in both),
                       "cpu": float(np.mean([x[1] for x in both])), "count": count}
    if md.get_rank() == 0:
        print(RESULT + json.dumps(found), flush=True)
    md.destroy()


if __name__ == "__main__":
    main("--quick" in sys.argv)
