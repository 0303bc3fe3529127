"""minidist.aio inside a running event loop: collectives and messages as coroutines,
while another task keeps running."""

import asyncio

import numpy as np

import minidist.aio as dist


async def main() -> None:
    await dist.init(timeout=60)
    rank, n = dist.get_rank(), dist.get_world_size()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    t = asyncio.create_task(ticker())
    x = np.full(1000, rank, np.float64)
    await dist.all_reduce(x)
    assert (x == sum(range(n))).all()
    await dist.send_object({"r": rank}, (rank + 1) % n)
    assert await dist.recv_object((rank - 1) % n) == {"r": (rank - 1) % n}
    y = np.arange(3.0) if rank == 0 else np.zeros(3)
    await dist.broadcast(y, src=0)
    assert (y == np.arange(3.0)).all()
    await dist.barrier()
    t.cancel()
    print(f"AIO OK rank={rank} ticks>0={ticks > 0}", flush=True)
    await dist.destroy()


asyncio.run(main())
