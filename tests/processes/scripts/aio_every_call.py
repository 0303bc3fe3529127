"""Every public function of minidist, awaited through minidist.aio on this process's own
loop (4 ranks): two groups in flight at once, and the loop stays responsive (a ticker
task keeps ticking) while a collective waits for a late rank."""

import asyncio

import numpy as np

import minidist
import minidist.aio as dist


async def main() -> None:
    await dist.init(timeout=60)
    assert dist.is_initialized()
    rank, n = dist.get_rank(), dist.get_world_size()
    assert n == 4 and dist.get_local_world_size() == 4 and dist.get_local_rank() == rank
    assert dist.get_node_rank() == 0
    try:  # the blocking API refuses clearly in a process that uses this one
        minidist.barrier()
        raise AssertionError("the blocking API worked after minidist.aio.init()")
    except minidist.DistError as e:
        assert "minidist.aio" in str(e), e

    evens = dist.new_group([0, 2])
    odds = dist.new_group([1, 3])
    mine, subs = dist.new_subgroups(2)
    assert dist.get_process_group_ranks(mine) == [rank - rank % 2, rank - rank % 2 + 1]
    assert len(subs) == 2
    g = evens if rank % 2 == 0 else odds
    assert dist.get_group_rank(g, rank) == rank // 2
    assert dist.get_global_rank(g, 1) == (2 if rank % 2 == 0 else 3)
    assert dist.get_rank(g) == rank // 2 and dist.get_world_size(g) == 2

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    tick = asyncio.create_task(ticker())

    # the loop runs other tasks while a collective waits: rank 3 arrives late
    if rank == 3:
        await asyncio.sleep(0.3)
    before = ticks
    x = np.full(8, rank, np.float64)
    await dist.all_reduce(x)
    assert (x == 6).all()
    if rank != 3:
        assert ticks - before > 10, "the loop stalled during a collective"

    # two groups in flight at once
    a = np.full(1000, rank, np.int64)
    b = np.full(1000, 10 * rank, np.int64)
    ha = await dist.all_reduce(a, group=g, async_op=True)
    hb = await dist.all_reduce(b, group=mine, async_op=True)
    await asyncio.gather(ha, hb)
    assert (a == sum(r for r in range(4) if r % 2 == rank % 2)).all()
    assert (b == 10 * sum(dist.get_process_group_ranks(mine))).all()

    y = np.arange(5.0) if rank == 1 else np.zeros(5)
    await dist.broadcast(y, src=1)
    assert (y == np.arange(5.0)).all()
    await dist.barrier()
    z = np.full(3, rank + 1.0)
    await dist.reduce(z, dst=2, op=minidist.ReduceOp.MAX)
    if rank == 2:
        assert (z == 4).all()
    out = np.empty(4 * 2, np.int32)
    await dist.all_gather(out, np.full(2, rank, np.int32))
    assert out.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    rs = np.empty(2, np.float32)
    await dist.reduce_scatter(rs, np.ones(8, np.float32))
    assert (rs == 4).all()
    gathered = np.empty(4, np.int64) if rank == 0 else None
    await dist.gather(np.array([rank * 7]), gathered, dst=0)
    if rank == 0:
        assert gathered.tolist() == [0, 7, 14, 21]
    piece = np.empty(1, np.int64)
    await dist.scatter(piece, np.arange(4, dtype=np.int64) * 3 if rank == 3 else None, src=3)
    assert piece[0] == rank * 3
    a2a = np.empty(4, np.int64)
    await dist.all_to_all(a2a, np.arange(4, dtype=np.int64) + 10 * rank)
    assert a2a.tolist() == [rank + 10 * r for r in range(4)]

    peer = rank ^ 1
    h = dist.isend(np.full(4, float(rank)), peer, tag=3)
    buf = np.zeros(4)
    r = dist.irecv(buf, peer, tag=3)
    assert await r == peer
    await h
    assert (buf == peer).all()
    if rank % 2 == 0:
        await dist.send(np.arange(3.0), peer)
        await dist.send_object({"from": rank}, peer)
    else:
        got = np.zeros(3)
        assert await dist.recv(got, peer) == peer
        assert (got == np.arange(3.0)).all()
        assert await dist.recv_object(peer) == {"from": peer}

    # from any source: the sender is what recv returns (and what the handle gives)
    if rank == 0:
        got = sorted([await dist.recv(np.zeros(1), src=None, tag=11) for _ in range(3)])
        assert got == [1, 2, 3], got
        obj, who = await dist.irecv_object(src=None, tag=12)
        assert (obj, who) == ("hi", 2)
    else:
        await dist.send(np.ones(1), 0, tag=11)
        if rank == 2:
            await dist.isend_object("hi", 0, tag=12)
    assert await dist.iprobe(None, tag=13) is None

    assert await dist.broadcast_object({"k": rank} if rank == 2 else None, src=2) == {"k": 2}
    assert await dist.all_gather_object(rank * rank) == [0, 1, 4, 9]
    got = await dist.gather_object(f"r{rank}", dst=1)
    assert got == (["r0", "r1", "r2", "r3"] if rank == 1 else None)
    assert await dist.scatter_object([f"s{i}" for i in range(4)] if rank == 0 else None,
                                     src=0) == f"s{rank}"

    store = dist.get_store()
    await store.set(f"k{rank}", str(rank))
    await store.wait([f"k{i}" for i in range(4)], 10)
    assert await store.get("k3") == b"3"
    assert await store.add("counter", 1) >= 1
    assert await store.check(["k0"])

    tick.cancel()
    await dist.barrier()
    print(f"AIO EVERY CALL OK rank={rank}", flush=True)
    await dist.destroy()
    assert not dist.is_initialized()


asyncio.run(main())
