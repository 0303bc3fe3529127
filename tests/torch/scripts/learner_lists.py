"""A torch learner's repeated scatter and gather with its own lists (their views kept,
minidist.torch._tensors.list_views) on 5 ranks, every value checked, under trouble
(argv[1]): ``kill``: worker 4 kills itself with SIGKILL at step 60, and the learner's
gather must raise PeerLostError naming it within seconds, the other workers
PeerLostError too (they lose rank 4 or the learner, which then leaves); ``stop``: the
learner stops worker 2 with SIGSTOP for 1.5 s at steps 40 and 120 and every value of
all 200 steps must still be right. Prints "LISTS OK <rank>" per rank that did its part.
"""

import os
import signal
import sys
import time

import torch

import minidist
import minidist.torch as dist

mode = sys.argv[1]
dist.init_process_group(timeout=60)
rank, n = dist.get_rank(), dist.get_world_size()
pids = [None] * n
dist.all_gather_object(pids, os.getpid())
act = torch.zeros(1, dtype=torch.int64)
obs = torch.zeros(8, dtype=torch.float64)
acts = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
outs = [torch.zeros(8, dtype=torch.float64) for _ in range(n)]
step = 0
try:
    for step in range(200):
        if rank == 0:
            if mode == "stop" and step in (40, 120):
                os.kill(pids[2], signal.SIGSTOP)
                time.sleep(1.5)
                os.kill(pids[2], signal.SIGCONT)
            for r, t in enumerate(acts):
                t.fill_(step * 10 + r)
        if mode == "kill" and rank == 4 and step == 60:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.scatter(act, acts if rank == 0 else None, src=0)
        assert int(act) == step * 10 + rank, (act, step, rank)
        obs.fill_(step + rank / 10)
        dist.gather(obs, outs if rank == 0 else None, dst=0)
        if rank == 0:
            for r, o in enumerate(outs):
                assert bool((o == step + r / 10).all()), (step, r, o)
except minidist.PeerLostError as e:
    assert mode == "kill", e
    print(f"LOST {rank} {sorted(e.ranks)} at step {step}", flush=True)
    if rank == 0:
        assert list(e.ranks) == [4] and step == 60, (e.ranks, step)
    sys.exit(0)
assert mode == "stop" or rank == 4, "a kill that nobody noticed"
if rank == 0:
    print("LISTS OK", flush=True)
dist.destroy_process_group()
