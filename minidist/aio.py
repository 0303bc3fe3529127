"""minidist for programs that already run an asyncio event loop.

``await minidist.aio.init()`` joins the job on the *running* loop (no background
thread). Every public function of :mod:`minidist` is here with the same signature:
collectives and messages are coroutines (``async_op=True`` returns an awaitable handle
instead of a Work, and so do ``isend``/``irecv``); queries and ``new_group`` are plain
functions. The loop keeps running other tasks while a call waits.

The blocking API and this one are alternatives within a process: calling one after
initializing the other raises a clear DistError.

    import asyncio, numpy as np, minidist.aio as dist

    async def main():
        await dist.init()
        x = np.ones(4)
        await dist.all_reduce(x)
        h = dist.isend(x, dst=1)          # an awaitable handle
        await h
        await dist.destroy()

    asyncio.run(main())

See ``docs/aio.md``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from . import facade, objects, startup
from .door import Door, Planned
from .env import default_timeout, detect
from .group import Group
from .kvstore import AsyncStore
from .ops import ReduceOp
from .process_state import STATE
from .shared_array import DEFAULT_BUFFERS, AsyncSharedArray

GroupArg = Group | object | None
_d = STATE.aio_door  # this process's door for minidist.aio (DistError if none)


class Handle:
    """A call in flight (``async_op=True``, ``isend``, ``irecv``): await it (or
    :meth:`wait`) for its result; its error raises there."""

    def __init__(self, task: asyncio.Task, result: Any = None) -> None:
        self._task = task
        self._result = result
        # an error nobody awaits is still retrieved, so it is not reported as lost
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def wait(self) -> Any:
        done = await self._task
        return done if self._result is None else self._result

    def __await__(self) -> Generator[Any, None, Any]:
        return self.wait().__await__()

    def is_completed(self) -> bool:
        return self._task.done()

    def __repr__(self) -> str:
        return f"<minidist.aio.Handle {'done' if self._task.done() else 'pending'}>"


async def _go(item: Planned, async_op: bool, result: Any = None) -> Any:
    d = _d()
    if async_op:
        return Handle(asyncio.ensure_future(d.run(item)), result)
    await d.run(item)
    return result


# ---------------------------------------------------------------------- lifecycle


async def init(*, rank: int | None = None, world_size: int | None = None,
               master_addr: str | None = None, master_port: int | None = None,
               timeout: float | None = None) -> None:
    """Join the job on the running loop (arguments as :func:`minidist.init`)."""
    async def start() -> Door:
        cfg = detect(os.environ, rank=rank, world_size=world_size, master_addr=master_addr,
                     master_port=master_port)
        return Door(await startup.join(cfg, float(timeout or default_timeout(os.environ))),
                    None)

    await STATE.join_aio(start)


async def destroy() -> None:
    """Leave the job and close every socket; ``init`` may be awaited again."""
    await STATE.leave_aio()


def is_initialized() -> bool:
    """Whether this process has joined a job through minidist.aio."""
    return STATE.aio is not None


# ---------------------------------------------------------------------- queries and groups


def get_rank(group: GroupArg = None) -> int:
    """See :func:`minidist.get_rank`."""
    return _d().rank_in(group)


def get_world_size(group: GroupArg = None) -> int:
    """See :func:`minidist.get_world_size`."""
    return _d().size_of(group)


def get_local_rank() -> int:
    return _d().local_rank


def get_local_world_size() -> int:
    return _d().local_world_size


def get_node_rank() -> int:
    return _d().node_rank


def new_group(ranks: list[int] | None = None, timeout: float | None = None,
              backend: str | None = None) -> Group | object:
    """See :func:`minidist.new_group` (opens no socket, so it is not a coroutine)."""
    return _d().plan.new_group(ranks, timeout)


def new_subgroups(group_size: int | None = None, group: GroupArg = None,
                  timeout: float | None = None, backend: str | None = None
                  ) -> tuple[Group | object, list[Group | object]]:
    """See :func:`minidist.new_subgroups`."""
    return _d().new_subgroups(group_size, group, timeout)


def get_process_group_ranks(group: GroupArg) -> list[int]:
    return list(_d().group_of(group).ranks)


def get_group_rank(group: GroupArg, global_rank: int) -> int:
    g = _d().group_of(group)
    r = g.rank_of(global_rank)
    if r < 0:
        raise ValueError(f"global rank {global_rank} is not part of {g!r}")
    return r


def get_global_rank(group: GroupArg, group_rank: int) -> int:
    return _d().group_of(group).global_rank(group_rank)


# ---------------------------------------------------------------------- collectives


async def all_reduce(array: np.ndarray, op: ReduceOp = ReduceOp.SUM, group: GroupArg = None,
                     async_op: bool = False, algorithm: str | None = None) -> Handle | None:
    """See :func:`minidist.all_reduce`."""
    return await _go(_d().plan.prepare_all_reduce(array, op, group, algorithm), async_op)


async def broadcast(array: np.ndarray, src: int = 0, group: GroupArg = None,
                    async_op: bool = False, algorithm: str | None = None) -> Handle | None:
    """See :func:`minidist.broadcast`."""
    return await _go(_d().plan.prepare_broadcast(array, src, group, algorithm), async_op)


async def barrier(group: GroupArg = None, async_op: bool = False) -> Handle | None:
    """See :func:`minidist.barrier`."""
    return await _go(_d().plan.prepare_barrier(group), async_op)


async def reduce(array: np.ndarray, dst: int = 0, op: ReduceOp = ReduceOp.SUM,
                 group: GroupArg = None, async_op: bool = False,
                 algorithm: str | None = None) -> Handle | None:
    """See :func:`minidist.reduce`."""
    return await _go(_d().plan.prepare_reduce(array, dst, op, group, algorithm), async_op)


async def all_gather(output: np.ndarray, input: np.ndarray, group: GroupArg = None,
                     async_op: bool = False, algorithm: str | None = None) -> Handle | None:
    """See :func:`minidist.all_gather`."""
    return await _go(_d().plan.prepare_all_gather(output, input, group, algorithm), async_op)


async def reduce_scatter(output: np.ndarray, input: np.ndarray, op: ReduceOp = ReduceOp.SUM,
                         group: GroupArg = None, async_op: bool = False,
                         algorithm: str | None = None) -> Handle | None:
    """See :func:`minidist.reduce_scatter`."""
    return await _go(_d().plan.prepare_reduce_scatter(output, input, op, group, algorithm),
                     async_op)


async def gather(input: np.ndarray, output: np.ndarray | None = None, dst: int = 0,
                 group: GroupArg = None, async_op: bool = False,
                 algorithm: str | None = None) -> Handle | None:
    """See :func:`minidist.gather`."""
    return await _go(_d().plan.prepare_gather(input, output, dst, group, algorithm), async_op)


async def scatter(output: np.ndarray, input: np.ndarray | None = None, src: int = 0,
                  group: GroupArg = None, async_op: bool = False,
                  algorithm: str | None = None) -> Handle | None:
    """See :func:`minidist.scatter`."""
    return await _go(_d().plan.prepare_scatter(output, input, src, group, algorithm), async_op)


async def all_to_all(output: np.ndarray, input: np.ndarray, group: GroupArg = None,
                     async_op: bool = False, algorithm: str | None = None) -> Handle | None:
    """See :func:`minidist.all_to_all`."""
    return await _go(_d().plan.prepare_all_to_all(output, input, group, algorithm), async_op)


async def _generated(name: str, array: np.ndarray, op: ReduceOp, group: GroupArg,
                     async_op: bool, algorithm: str | None) -> Handle | None:
    return await _go(_d().plan.prepare_collective(name, array, op, group, algorithm), async_op)


GENERATED: dict[str, Any] = {
    rec.front.function: facade.define(rec, _generated, __name__, returns="Handle | None")
    for rec in facade.records()}
"""Awaitable twins of :data:`minidist.api.GENERATED` (minidist.aio.scan, ...)."""
globals().update(GENERATED)


# ---------------------------------------------------------------------- point-to-point


def isend(array: np.ndarray, dst: int, tag: int = 0, group: GroupArg = None) -> Handle:
    """Start sending ``array`` to global rank ``dst``; await the handle for completion."""
    d = _d()
    return Handle(asyncio.ensure_future(d.run(d.plan.prepare_send(array, dst, tag, group))))


def irecv(array: np.ndarray, src: int | None = None, tag: int = 0,
          group: GroupArg = None) -> Handle:
    """Start receiving into ``array`` (``src`` None: from any rank); awaiting the handle
    gives the sender's global rank."""
    d = _d()
    item = d.plan.prepare_recv(array, src, tag, group)
    return Handle(asyncio.ensure_future(_received(d, item)))


async def _received(d: Door, item: Planned) -> int:
    await d.run(item)
    return item.source


async def send(array: np.ndarray, dst: int, tag: int = 0, group: GroupArg = None) -> None:
    """See :func:`minidist.send`."""
    await _go(_d().plan.prepare_send(array, dst, tag, group), False)


async def recv(array: np.ndarray, src: int | None = None, tag: int = 0,
               group: GroupArg = None) -> int:
    """See :func:`minidist.recv`; returns the sender's global rank."""
    d = _d()
    return await _received(d, d.plan.prepare_recv(array, src, tag, group))


async def recv_many(output: np.ndarray, src: int | Sequence[int] | None = None, tag: int = 0,
                    group: GroupArg = None, async_op: bool = False) -> np.ndarray | Handle:
    """See :func:`minidist.recv_many`; the senders (global ranks, int64), or with
    ``async_op`` a handle that gives them."""
    d = _d()
    m = d.plan_many(output, src, tag, group)
    if async_op:
        return Handle(asyncio.ensure_future(d.run_many(m)))
    return await d.run_many(m)


async def send_object(obj: Any, dst: int, tag: int = 0, group: GroupArg = None) -> None:
    """See :func:`minidist.send_object`."""
    d = _d()
    await d.run(d.plan.prepare_send(objects.dumps(obj), dst, tag, group, is_object=True))


async def recv_object(src: int | None = None, tag: int = 0, group: GroupArg = None,
                      return_source: bool = False) -> Any:
    """See :func:`minidist.recv_object`."""
    d = _d()
    item = d.plan.prepare_recv(None, src, tag, group)
    obj = objects.loads(await d.run(item))
    return (obj, item.source) if return_source else obj


def isend_object(obj: Any, dst: int, tag: int = 0, group: GroupArg = None) -> Handle:
    """Start sending a picklable object; await the handle for completion."""
    d = _d()
    item = d.plan.prepare_send(objects.dumps(obj), dst, tag, group, is_object=True)
    return Handle(asyncio.ensure_future(d.run(item)))


def irecv_object(src: int | None = None, tag: int = 0, group: GroupArg = None) -> Handle:
    """Start receiving the next object (``src`` None: from any rank); awaiting the
    handle gives ``(obj, sender's global rank)``."""
    d = _d()
    item = d.plan.prepare_recv(None, src, tag, group)

    async def received() -> tuple[Any, int]:
        return objects.loads(await d.run(item)), item.source

    return Handle(asyncio.ensure_future(received()))


async def iprobe(src: int | None = None, tag: int = 0, group: GroupArg = None) -> int | None:
    """See :func:`minidist.iprobe`."""
    return await _d().probe(src, tag, group, wait=False)


async def probe(src: int | None = None, tag: int = 0, group: GroupArg = None) -> int:
    """See :func:`minidist.probe`."""
    return await _d().probe(src, tag, group, wait=True)


# ---------------------------------------------------------------------- objects


async def broadcast_object(obj: Any, src: int = 0, group: GroupArg = None) -> Any:
    """See :func:`minidist.broadcast_object`."""
    return await objects.broadcast_object(_d(), obj, src, group)


async def all_gather_object(obj: Any, group: GroupArg = None) -> list[Any]:
    """See :func:`minidist.all_gather_object`."""
    return await objects.all_gather_object(_d(), obj, group)


async def gather_object(obj: Any, dst: int = 0, group: GroupArg = None) -> list[Any] | None:
    """See :func:`minidist.gather_object`."""
    return await objects.gather_object(_d(), obj, dst, group)


async def scatter_object(objs: list[Any] | None, src: int = 0, group: GroupArg = None) -> Any:
    """See :func:`minidist.scatter_object`."""
    return await objects.scatter_object(_d(), objs, src, group)


# ---------------------------------------------------------------------- failures


async def shrink_group(ranks_to_exclude: list[int] | None = None,
                       group: GroupArg = None) -> Group:
    """See :func:`minidist.shrink_group`."""
    return await _d().shrink_group(ranks_to_exclude, group)


async def agree(flag: bool, group: GroupArg = None) -> bool:
    """See :func:`minidist.agree`."""
    return await _d().agree(flag, group)


async def wait_ranks(ranks: list[int], timeout: float | None = None) -> list[int]:
    """See :func:`minidist.wait_ranks`."""
    return await _d().wait_ranks(ranks, timeout)


# ---------------------------------------------------------------------- store


def get_store() -> AsyncStore:
    """The job's key/value store; its methods are awaited."""
    return AsyncStore(_d())


# ---------------------------------------------------------------------- shared arrays

SharedArray = AsyncSharedArray  # see minidist.SharedArray; made with shared_array()


async def shared_array(name: str, shape: Any, dtype: Any, src: int = 0,
                       group: GroupArg = None, *,
                       buffers: int = DEFAULT_BUFFERS) -> AsyncSharedArray:
    """:class:`minidist.SharedArray` on this loop, made by every member of the group:
    ``await shared.publish(a)`` on ``src``, ``shared.read()`` (never waits),
    ``await shared.wait(version)`` (sleeps in an executor thread, the loop runs on),
    ``await shared.close()``."""
    return await AsyncSharedArray.create(_d(), name, shape, dtype, src, group,
                                         buffers=buffers)
