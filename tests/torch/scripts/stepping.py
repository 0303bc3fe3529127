"""The RL step with torch tensors through ``import minidist.torch as dist`` (lockstep
scatter + gather, then first-k with recv_many), and recv_many through minidist.aio on
its own loop; every value checked. Prints "STEPPING OK" on rank 0 (argv: "torch" or
"aio")."""

import asyncio
import sys

import numpy as np
import torch

if sys.argv[1] == "torch":
    import minidist.torch as dist

    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    act = torch.zeros(1, dtype=torch.int64)
    obs = torch.zeros(16, dtype=torch.float32)
    for step in range(200):
        acts = [torch.full((1,), step * 100 + r, dtype=torch.int64) for r in range(n)]
        dist.scatter(act, acts if rank == 0 else None, src=0)
        assert int(act) == step * 100 + rank, (act, step, rank)
        obs.fill_(float(int(act)))
        outs = [torch.zeros(16) for _ in range(n)] if rank == 0 else None
        dist.gather(obs, outs, dst=0)
        if rank == 0:
            assert all(bool((o == step * 100 + r).all()) for r, o in enumerate(outs))
    # repeated calls on a subgroup rooted at 2, alternating with the world's, with a
    # fresh output tensor now and then and a rank outside the subgroup
    sub = dist.new_group([0, 2, 3])
    for step in range(60):
        mine = act if step % 7 else torch.zeros(1, dtype=torch.int64)
        vals = [torch.full((1,), step * 10 + r, dtype=torch.int64) for r in (0, 2, 3)]
        assert dist.scatter(mine, vals if rank == 2 else None, src=2, group=sub) is None
        if rank != 1:
            assert int(mine) == step * 10 + rank, (mine, step, rank)
        obs.fill_(float(step + rank))
        if rank != 1:  # the same root on the subgroup, then on the world
            outs = [torch.zeros(16) for _ in range(3)] if rank == 0 else None
            dist.gather(obs, outs, dst=0, group=sub)
            if rank == 0:
                assert all(bool((o == step + r).all()) for r, o in zip((0, 2, 3), outs))
        outs = [torch.zeros(16) for _ in range(n)] if rank == 0 else None
        dist.gather(obs, outs, dst=0)
        if rank == 0:
            assert all(bool((o == step + r).all()) for r, o in enumerate(outs))
    # a learner's own lists, the same every step (their views kept), then new views of
    # one batch every step; on the way a tensor replaced and one set_ to other memory
    from minidist.torch import _collectives

    real, hits = _collectives.again_sent, [0]

    def counted(*args):
        got = real(*args)
        hits[0] += got
        return got

    _collectives.again_sent = counted
    acts = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    outs = [torch.zeros(16) for _ in range(n)]
    batch = torch.zeros(n, 16)
    for step in range(150):
        if rank == 0:
            if step == 40:
                acts[2] = torch.zeros(1, dtype=torch.int64)
            if step == 60:
                outs[1].set_(torch.zeros(16).untyped_storage(), 0, (16,))
            for r, t in enumerate(acts):
                t.fill_(step * 7 + r)
        dist.scatter(act, acts if rank == 0 else None, src=0)
        assert int(act) == step * 7 + rank, (act, step, rank)
        obs.fill_(float(step * 3 + rank))
        # (torch's gather takes an empty list on the other ranks as none)
        into = (list(batch.unbind()) if step >= 100 else outs) if rank == 0 else []
        dist.gather(obs, into, dst=0)
        if rank == 0:
            assert all(bool((o == step * 3 + r).all()) for r, o in enumerate(into)), step
    _collectives.again_sent = real
    assert hits[0] >= 290, hits  # 300 calls; the first and the changed ones planned
    # lockstep with send / recv: sends and receives like the last ones planned once
    from minidist.process_state import STATE

    rows = torch.zeros((n, 16))
    for step in range(200):
        if rank == 0:
            for w in range(1, n):
                dist.send(torch.full((1,), step * 100 + w, dtype=torch.int64), w)
            for w in range(1, n):
                assert dist.recv(rows[w], w) == w
                assert bool((rows[w] == step * 100 + w + 0.5).all()), (step, w, rows[w])
        else:
            assert dist.recv(act, 0) == 0
            assert int(act) == step * 100 + rank, (act, step, rank)
            obs.fill_(float(int(act)) + 0.5)
            dist.send(obs, 0)
    p2p = STATE.blocking._session.p2p
    counts = [None] * n
    dist.all_gather_object(counts, (p2p.routes.sent, p2p.takes.taken))
    # (a send that finds its receiver's ring full goes the general way)
    assert all(sent > 50 for sent, _ in counts), counts
    assert sum(taken for _, taken in counts) > 50, counts
    # first k: every worker sends 50 rows; the learner takes them 2 at a time
    if rank == 0:
        seen = {r: 0 for r in range(1, n)}
        rows = torch.zeros((2, 16))
        for _ in range(50 * (n - 1) // 2):
            senders = dist.recv_many(rows)
            assert senders.dtype == torch.int64 and senders.shape == (2,)
            for row, s in zip(rows, senders.tolist(), strict=True):
                assert bool((row == s * 1000 + seen[s]).all()), (row, s, seen[s])
                seen[s] += 1
        last = torch.zeros((1, 16))
        s = int(dist.recv_many(last, async_op=True).result()[0])  # the one left
        assert bool((last[0] == s * 1000 + seen[s]).all()), (last, s, seen[s])
    else:
        for i in range(51 if rank == 1 else 50):  # one more: the async recv_many's
            dist.send(torch.full((16,), float(rank * 1000 + i)), 0)
    dist.barrier()
    if rank == 0:
        print("STEPPING OK", flush=True)
    dist.destroy_process_group()
else:
    import minidist.aio as aio

    async def main() -> None:
        await aio.init()
        rank, n = aio.get_rank(), aio.get_world_size()
        if rank == 0:
            got = np.zeros((n - 1, 4), np.int64)
            senders = await aio.recv_many(got, tag=5)
            assert sorted(senders.tolist()) == list(range(1, n)), senders
            for row, s in zip(got, senders.tolist(), strict=True):
                assert (row == s).all()
            h = await aio.recv_many(got[:1], src=[1], tag=6, async_op=True)
            assert (await h.wait()).tolist() == [1]
            print("STEPPING OK", flush=True)
        else:
            await aio.send(np.full(4, rank, np.int64), 0, tag=5)
            if rank == 1:
                await aio.send(np.full(4, 1, np.int64), 0, tag=6)
        await aio.barrier()
        await aio.destroy()

    asyncio.run(main())
