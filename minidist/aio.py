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
from collections.abc import Generator, Sequence  # noqa: F401 - annotations name it
from typing import Any

import numpy as np  # noqa: F401 - names that the made functions use

from . import calls, facade, objects, startup  # noqa: F401
from .door import Door
from .env import default_timeout, detect
from .group import Group
from .kvstore import AsyncStore
from .ops import ReduceOp  # noqa: F401
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


SHAPES: dict[str, str] = {
    calls.COLLECTIVE: '''
async def {name}({params}) -> {returns}:
    d = _d()
    item = {plan}
    if async_op:
        return Handle(asyncio.ensure_future(d.run(item)))
    await d.run(item)
    return None
''',
    calls.START: '''
def {name}({params}) -> {returns}:
    d = _d()
    return Handle(asyncio.ensure_future(d.run({plan})))
''',
    calls.FINISH: '''
async def {name}({params}) -> {returns}:
    d = _d()
    await d.run({plan})
''',
    calls.START_RECV: '''
def {name}({params}) -> {returns}:
    d = _d()
    return Handle(asyncio.ensure_future(_received(d, {plan})))
''',
    calls.RECV: '''
async def {name}({params}) -> {returns}:
    d = _d()
    item = {plan}
    await d.run(item)
    return item.source
''',
    calls.MANY: '''
async def {name}({params}) -> {returns}:
    d = _d()
    m = {plan}
    if async_op:
        return Handle(asyncio.ensure_future(d.run_many(m)))
    return await d.run_many(m)
''',
    calls.RECV_OBJECT: '''
async def {name}({params}) -> {returns}:
    d = _d()
    item = {plan}
    obj = objects.loads(await d.run(item))
    return (obj, item.source) if return_source else obj
''',
    calls.START_RECV_OBJECT: '''
def {name}({params}) -> {returns}:
    d = _d()
    item = {plan}

    async def unpickled():
        return objects.loads(await d.run(item)), item.source

    return Handle(asyncio.ensure_future(unpickled()))
''',
    calls.LOOP: '''
async def {name}({params}) -> {returns}:
    d = _d()
    return await {plan}
''',
    calls.STEPS: '''
async def {name}({params}) -> {returns}:
    d = _d()
    return await d.steps_on_loop({plan})
''',
    calls.QUERY: '''
def {name}({params}) -> {returns}:
    d = _d()
    return {plan}
''',
}
SHAPES[calls.SEND] = SHAPES[calls.FINISH]  # an asyncio send is planned every time
SHAPES[calls.ROOTED] = SHAPES[calls.COLLECTIVE]
"""How an asyncio call runs, by shape (:mod:`minidist.calls`): collectives and messages
are coroutines, ``isend``/``irecv`` and queries plain functions."""


async def _received(d: Door, item: Any) -> int:
    """The sender of ``item``, a receive, once it is done."""
    await d.run(item)
    return item.source


# ---------------------------------------------------------------------- written here


async def init(*, rank: int | None = None, world_size: int | None = None,
               master_addr: str | None = None, master_port: int | None = None,
               timeout: float | None = None) -> None:
    async def start() -> Door:
        cfg = detect(os.environ, rank=rank, world_size=world_size, master_addr=master_addr,
                     master_port=master_port)
        return Door(await startup.join(cfg, float(timeout or default_timeout(os.environ))),
                    None)

    await STATE.join_aio(start)


async def destroy() -> None:
    await STATE.leave_aio()


def is_initialized() -> bool:
    return STATE.aio is not None


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


# ---------------------------------------------------------------------- made from calls

calls.make(globals(), "aio", SHAPES, "Handle", calls.CALLS.values())

GENERATED: dict[str, Any] = calls.make(globals(), "aio", SHAPES, "Handle",
                                       facade.definitions())
"""Awaitable twins of :data:`minidist.api.GENERATED` (minidist.aio.scan, ...)."""

# the names made by minidist.calls are there only once the module has run (so F822)
__all__ = [
    "init", "destroy", "is_initialized", "get_rank", "get_world_size",  # noqa: F822
    "get_local_rank", "get_local_world_size", "get_node_rank", "new_group",  # noqa: F822
    "new_subgroups", "get_process_group_ranks", "get_group_rank",  # noqa: F822
    "get_global_rank", "all_reduce", "broadcast", "barrier", "reduce",  # noqa: F822
    "all_gather", "reduce_scatter", "gather", "scatter", "all_to_all",  # noqa: F822
    "isend", "irecv", "send", "recv", "recv_many", "send_object",  # noqa: F822
    "recv_object", "isend_object", "irecv_object", "iprobe", "probe",  # noqa: F822
    "broadcast_object", "all_gather_object", "gather_object",  # noqa: F822
    "scatter_object", "shrink_group", "agree", "wait_ranks", "get_store",  # noqa: F822
    "shared_array", "SharedArray", "Handle", *GENERATED,  # noqa: F822
]
