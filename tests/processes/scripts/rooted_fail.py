"""The RL loop through the rooted area (scatter of one action, gather of one
observation) where something goes wrong on a worker mid-stepping (argv: what, the
victim's rank):

* ``kill``: the victim SIGKILLs itself; every other rank must raise PeerLostError naming
  it within seconds;
* ``exit``: the victim leaves normally (minidist.destroy, then exits);
* ``mismatch``: at step 30 the victim gathers an observation of another size; the
  learner and the victim raise CollectiveMismatchError (the learner's output unchanged),
  the other senders, which did not wait in the gather, a DistError at their next call;
* ``mismatch_scatter``: at step 30 the victim's scatter output has another size; the
  victim raises CollectiveMismatchError before its output is written; the root (which
  does not wait for its receivers) and the other receivers raise it too, naming the
  victim, at once or at their next call (their scatter output then holds their block).
"""

import os
import signal
import sys
import time

import numpy as np

import minidist

what, victim = sys.argv[1], int(sys.argv[2])
minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
act = np.zeros(1, np.int64)
acts = np.arange(n, dtype=np.int64)
obs = np.zeros(64, np.uint8)
allobs = np.zeros((n, 64), np.uint8)
t0 = time.monotonic()
try:
    for step in range(100_000):
        if rank == victim and step == 30:
            if what == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if what == "exit":
                minidist.destroy()
                print("EXITED", flush=True)
                sys.exit(0)
        t0 = time.monotonic()
        bad = rank == victim and step == 30
        out = np.full(2 if bad and what == "mismatch_scatter" else 1, -7, np.int64)
        minidist.scatter(out, acts + step if rank == 0 else None, src=0)
        if rank != victim or step != 30 or what != "mismatch_scatter":
            assert out[0] == rank + step, (out, rank, step)
        obs[:] = (rank + step) % 256
        send = obs[:32] if bad and what == "mismatch" else obs
        before = allobs.copy()
        minidist.gather(send, allobs if rank == 0 else None, dst=0)
        if rank == 0:
            assert (allobs[:, 0] == (np.arange(n) + step) % 256).all()
    print("NO ERROR", flush=True)
except minidist.PeerLostError as e:
    print(f"LOST {list(e.ranks)} left={e.left} {time.monotonic() - t0:.1f}", flush=True)
    sys.exit(3)
except minidist.CollectiveMismatchError as e:
    untouched = bool((out == -7).all()) if what == "mismatch_scatter" else \
        bool((allobs == before).all())
    mine = what == "mismatch_scatter" and out.size == 1 and out[0] == rank + step
    print(f"MISMATCH untouched={untouched} mine={bool(mine)} "
          f"named={f'rank {victim}' in str(e)}", flush=True)
    sys.exit(4)
except minidist.DistError as e:  # a gather's other senders: the group's abort
    print(f"ABORTED {type(e).__name__} {time.monotonic() - t0:.1f} {e}", flush=True)
    sys.exit(5)
