"""Awaitable collectives for programs that already run an asyncio event loop.

``await minidist.aio.init()`` joins the job on the *running* loop (no background
thread); every call is a coroutine. The blocking API and this one are alternatives
within a process: use one or the other.

    import asyncio, numpy as np, minidist.aio as dist

    async def main():
        await dist.init()
        x = np.ones(4)
        await dist.all_reduce(x)
        await dist.barrier()
        await dist.destroy()

    asyncio.run(main())
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .env import default_timeout, detect
from .errors import DistError
from .group import Group
from .ops import ReduceOp
from .session import Session

GroupArg = Group | object | None
_session: Session | None = None


def _s() -> Session:
    if _session is None:
        raise DistError("minidist.aio is not initialized: await minidist.aio.init() first")
    return _session


async def init(*, rank: int | None = None, world_size: int | None = None,
               master_addr: str | None = None, master_port: int | None = None,
               timeout: float | None = None) -> None:
    """Join the job on the running loop (arguments as :func:`minidist.init`)."""
    global _session
    if _session is not None:
        raise DistError("minidist.aio is already initialized")
    cfg = detect(os.environ, rank=rank, world_size=world_size, master_addr=master_addr,
                 master_port=master_port)
    session = Session(cfg, float(timeout or default_timeout(os.environ)))
    try:
        await session.start()
    except BaseException:
        await session.close(graceful=False)
        raise
    _session = session


async def destroy() -> None:
    """Leave the job and close every socket."""
    global _session
    session, _session = _session, None
    if session is not None:
        await session.close()


def get_rank(group: GroupArg = None) -> int:
    s = _s()
    return (group or s.world).rank_of(s.rank) if isinstance(group or s.world, Group) else -1


def get_world_size(group: GroupArg = None) -> int:
    g = group or _s().world
    return g.size if isinstance(g, Group) else -1


def new_group(ranks: list[int] | None = None) -> Group | object:
    """See :func:`minidist.new_group`."""
    return _s().new_group(ranks)


async def all_reduce(array: np.ndarray, op: ReduceOp = ReduceOp.SUM, group: GroupArg = None,
                     algorithm: str | None = None) -> None:
    s = _s()
    await s.execute(s.prepare_all_reduce(array, op, group, algorithm))


async def broadcast(array: np.ndarray, src: int = 0, group: GroupArg = None,
                    algorithm: str | None = None) -> None:
    s = _s()
    await s.execute(s.prepare_broadcast(array, src, group, algorithm))


async def barrier(group: GroupArg = None) -> None:
    s = _s()
    await s.execute(s.prepare_barrier(group))


async def all_gather(output: np.ndarray, input: np.ndarray, group: GroupArg = None) -> None:
    s = _s()
    await s.execute(s.prepare_all_gather(output, input, group, None))


async def send(array: np.ndarray, dst: int, tag: int = 0, group: GroupArg = None) -> None:
    s = _s()
    await s.send(s.prepare_send(array, dst, tag, group))


async def recv(array: np.ndarray, src: int, tag: int = 0, group: GroupArg = None) -> int:
    s = _s()
    await s.recv(s.prepare_recv(array, src, tag, group))
    return src


async def send_object(obj: Any, dst: int, tag: int = 0, group: GroupArg = None) -> None:
    import pickle

    s = _s()
    await s.send(s.prepare_send(pickle.dumps(obj), dst, tag, group, is_object=True))


async def recv_object(src: int, tag: int = 0, group: GroupArg = None) -> Any:
    import pickle

    s = _s()
    return pickle.loads(await s.recv(s.prepare_recv(None, src, tag, group)))
