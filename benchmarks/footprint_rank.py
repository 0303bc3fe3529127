"""One rank of the footprint benchmark's jobs: the calls users make, then held for a look.

    python -m minidist run -n N benchmarks/footprint_rank.py WORKLOAD [--torch]

WORKLOAD is one of

* ``init``: ``minidist.init()`` and a barrier, nothing else;
* ``each``: one of each collective (all_reduce, broadcast, reduce, all_gather,
  reduce_scatter, gather, scatter, all_to_all, barrier, scan), a send/recv ring, and the
  object calls (broadcast_object, all_gather_object), on vectors of 1024 float32 (a row
  per rank for the calls that take one), fewer from 129 ranks on so that a row per
  rank is at most 512 KiB (128 floats at 1024 ranks: with 1024 floats the job's own
  arrays would need 12 GiB there, more than its ranks' memory);
* ``rl``: the RL loop: rank 0 scatters actions to every worker and gathers their
  observations (the shared-memory rooted area), then each worker sends rows to rank 0,
  which takes them with ``recv_many`` (the inboxes), and answers each with a send.

With ``--torch`` the calls go through ``minidist.torch`` on CPU tensors instead
(``footprint_rank_torch.py`` runs this with torch imported at its top, as a torch
script has it, so that ``minidist run`` imports torch once before forking the ranks).

Every rank then prints ``READY <pid>`` and waits until the file named by
``MINIDIST_TEST_GATE`` exists (at most 600 s), so that benchmarks/footprint.py can read
/proc while the job holds still; then a barrier and ``destroy()``.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

STEPS = 20  # RL steps: enough to reach the steady state of every path the loop uses


def ring(api, x, got, rank: int, world: int) -> None:
    """Send ``x`` to the next rank and receive ``got`` from the previous one."""
    if world < 2:
        return
    right, left = (rank + 1) % world, (rank - 1) % world
    if rank % 2 == 0:
        api.send(x, right)
        api.recv(got, left)
    else:
        api.recv(got, left)
        api.send(x, right)


def row(world: int) -> int:
    """Floats per rank of ``each``'s calls: 1024, fewer above 128 ranks (512 KiB a row
    per rank at most)."""
    return min(1024, 131072 // world)


def each_numpy(md, rank: int, world: int) -> None:
    k = row(world)
    x = np.full(k, rank, np.float32)
    md.all_reduce(x)
    md.broadcast(x, src=0)
    md.reduce(x, dst=0)
    out = np.zeros((world, k), np.float32)
    md.all_gather(out, x)
    md.reduce_scatter(x, np.ones((world, k), np.float32))
    md.gather(x, out if rank == 0 else None, dst=0)
    md.scatter(x, out if rank == 0 else None, src=0)
    md.all_to_all(out, np.ones((world, k), np.float32))
    md.scan(x)
    md.barrier()
    ring(md, x, np.zeros(k, np.float32), rank, world)
    md.broadcast_object({"step": 1}, src=0)
    md.all_gather_object(rank)


def each_torch(dist, rank: int, world: int) -> None:
    import torch

    k = row(world)
    x = torch.full((k,), float(rank))
    dist.all_reduce(x)
    dist.broadcast(x, src=0)
    dist.reduce(x, dst=0)
    dist.all_gather([torch.zeros(k) for _ in range(world)], x)
    dist.reduce_scatter(x, [torch.ones(k) for _ in range(world)])
    dist.gather(x, [torch.zeros(k) for _ in range(world)] if rank == 0 else None, dst=0)
    dist.scatter(x, [torch.ones(k) for _ in range(world)] if rank == 0 else None, src=0)
    dist.all_to_all([torch.zeros(k) for _ in range(world)],
                    [torch.ones(k) for _ in range(world)])
    dist.barrier()
    ring(dist, x, torch.zeros(k), rank, world)
    objs = [{"step": 1}]
    dist.broadcast_object_list(objs, src=0)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, rank)


def rl_numpy(md, rank: int, world: int) -> None:
    obs_dim = 4
    if rank == 0:
        actions = np.zeros(world, np.int64)
        obs = np.zeros((world, obs_dim), np.float32)
        act = np.zeros(1, np.int64)
        mine = np.zeros(obs_dim, np.float32)
        for step in range(STEPS):
            actions[:] = step
            md.scatter(act, actions, src=0)
            md.gather(mine, obs, dst=0)
            assert obs[1:, 0].tolist() == [step] * (world - 1), obs[:, 0]
        rows = np.zeros((world - 1, obs_dim), np.float32)
        reply = np.zeros(1, np.int64)
        for _ in range(STEPS):  # every worker sends one row a round; take them all
            senders = md.recv_many(rows)
            for w in senders.tolist():
                md.send(reply, int(w))
    else:
        act = np.zeros(1, np.int64)
        row = np.zeros(obs_dim, np.float32)
        for step in range(STEPS):
            md.scatter(act, None, src=0)
            assert act[0] == step
            row[:] = act[0]
            md.gather(row, None, dst=0)
        reply = np.zeros(1, np.int64)
        for _ in range(STEPS):
            md.send(row, 0)
            md.recv(reply, 0)


def rl_torch(dist, rank: int, world: int) -> None:
    import torch

    obs_dim = 4
    if rank == 0:
        act = torch.zeros(1, dtype=torch.int64)
        mine = torch.zeros(obs_dim)
        for step in range(STEPS):
            actions = [torch.full((1,), step, dtype=torch.int64) for _ in range(world)]
            obs = [torch.zeros(obs_dim) for _ in range(world)]
            dist.scatter(act, actions, src=0)
            dist.gather(mine, obs, dst=0)
            assert all(int(o[0]) == step for o in obs[1:])
        rows = torch.zeros((world - 1, obs_dim))
        reply = torch.zeros(1, dtype=torch.int64)
        for _ in range(STEPS):
            senders = dist.recv_many(rows)
            for w in senders.tolist():
                dist.send(reply, int(w))
    else:
        act = torch.zeros(1, dtype=torch.int64)
        row = torch.zeros(obs_dim)
        for step in range(STEPS):
            dist.scatter(act, None, src=0)
            assert int(act[0]) == step
            row[:] = float(act[0])
            dist.gather(row, None, dst=0)
        reply = torch.zeros(1, dtype=torch.int64)
        for _ in range(STEPS):
            dist.send(row, 0)
            dist.recv(reply, 0)


def hold() -> None:
    gate = os.environ.get("MINIDIST_TEST_GATE")
    if not gate:
        return
    print(f"READY {os.getpid()}", flush=True)
    end = time.time() + 600
    while not os.path.exists(gate) and time.time() < end:
        time.sleep(0.1)


def main() -> None:
    workload = sys.argv[1] if len(sys.argv) > 1 else "each"
    use_torch = "--torch" in sys.argv[2:]
    if workload not in ("init", "each", "rl"):
        raise SystemExit(f"unknown workload {workload!r}: init, each or rl")
    if use_torch:
        import minidist.torch as dist

        dist.init_process_group()
        rank, world = dist.get_rank(), dist.get_world_size()
        api = dist
        done = dist.destroy_process_group
    else:
        import minidist as md

        md.init()
        rank, world = md.get_rank(), md.get_world_size()
        api = md
        done = md.destroy
    api.barrier()
    if workload == "each":
        (each_torch if use_torch else each_numpy)(api, rank, world)
    elif workload == "rl" and world > 1:
        (rl_torch if use_torch else rl_numpy)(api, rank, world)
    api.barrier()
    hold()
    api.barrier()
    done()


if __name__ == "__main__":
    main()
