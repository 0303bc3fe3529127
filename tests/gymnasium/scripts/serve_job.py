"""Rank 0 steps envs served by the job's other ranks (``minidist.gymnasium.serve``),
lockstep and first-k, and checks every result against SyncVectorEnv; prints SERVED."""

import sys
from functools import partial
from pathlib import Path

import numpy as np
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import SyncVectorEnv

import minidist
import minidist.gymnasium as mg

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tests.gymnasium.envs import Counter  # noqa: E402

minidist.init()
rank, world = minidist.get_rank(), minidist.get_world_size()
fns = [partial(Counter, i, limit=4) for i in range(5)]
if rank == 0:
    workers = list(range(1, world))
    acts = np.random.default_rng(0).integers(0, 3, (12, 5))
    results = []
    for cls in (partial(mg.AsyncVectorEnv, ranks=workers), SyncVectorEnv):
        env = cls(fns)
        got = [env.reset(seed=3)] + [env.step(a) for a in acts]
        env.close()
        results.append(got)
    for a, b in zip(*results, strict=True):
        # observations hold the pid of the process that stepped the env
        a, b = (a[0][:, :2], *a[1:]), (b[0][:, :2], *b[1:])
        assert data_equivalence(a, b, exact=True), (a, b)
    env = mg.AsyncVectorEnv(fns, ranks=workers, batch_size=2)
    env.async_reset()
    seen = set()
    for _ in range(10):
        *_, info = env.recv()
        seen.update(info["env_id"].tolist())
        env.send(np.ones(2, int), info["env_id"])
    env.close()
    assert seen, seen
    minidist.barrier()
    print("SERVED", flush=True)
else:
    mg.serve()  # the lockstep vector env
    mg.serve()  # the first-k one
    minidist.barrier()
minidist.destroy()
