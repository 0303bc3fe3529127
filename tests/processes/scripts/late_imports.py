"""A rank forked by ``minidist run`` imports no module of its own while it runs one of
each call (the launcher imported them once, before the fork, for every rank to share):
prints the modules imported after the script started, and the threads the rank runs
(blocking object calls run on the caller's thread: no pool thread)."""

import sys
import threading

sys.path.insert(0, sys.argv[1])  # benchmarks/: footprint_rank's "each" workload

import footprint_rank  # noqa: E402

import minidist  # noqa: E402

before = set(sys.modules)
minidist.init(timeout=60)
rank, world = minidist.get_rank(), minidist.get_world_size()
footprint_rank.each_numpy(minidist, rank, world)
footprint_rank.rl_numpy(minidist, rank, world)
late = sorted(set(sys.modules) - before)
print(f"LATE IMPORTS {rank}: {late}")
print(f"THREADS {rank}: {sorted(t.name for t in threading.enumerate())}")
minidist.barrier()
minidist.destroy()
