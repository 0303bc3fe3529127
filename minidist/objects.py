"""Object collectives (pickled, like mpi4py's lower-case methods), written once for the
blocking and the asyncio API: each runs on the session's loop as a few array calls
through the door."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from .door import Door


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def _pickle(obj: Any) -> np.ndarray:
    return np.frombuffer(dumps(obj), np.uint8)


async def broadcast_object(d: Door, obj: Any, src: int, group: object) -> Any:
    """``obj`` of global rank ``src``, on every rank of the group."""
    mine = d.rank == src
    data = _pickle(obj) if mine else None
    size = np.array([0 if data is None else data.size], np.int64)
    await d.on_loop(d.plan.prepare_broadcast(size, src, group, None))
    buf = data.copy() if data is not None else np.empty(int(size[0]), np.uint8)
    await d.on_loop(d.plan.prepare_broadcast(buf, src, group, None))
    return obj if mine else loads(buf.tobytes())


async def _padded(d: Door, obj: Any, group: object) -> tuple[np.ndarray, np.ndarray, int]:
    """(every rank's pickled size, this rank's pickle padded to the largest, that width)."""
    data = _pickle(obj)
    sizes = np.empty(d.size_of(group), np.int64)
    await d.on_loop(d.plan.prepare_all_gather(sizes, np.array([data.size], np.int64), group,
                                              None))
    width = int(sizes.max())
    padded = np.zeros(width, np.uint8)
    padded[:data.size] = data
    return sizes, padded, width


def _unpickle_all(out: np.ndarray, sizes: np.ndarray, width: int) -> list[Any]:
    return [loads(out[i * width:i * width + int(n)].tobytes()) for i, n in enumerate(sizes)]


async def all_gather_object(d: Door, obj: Any, group: object) -> list[Any]:
    """Every rank's ``obj``, in group-rank order, on every rank."""
    sizes, padded, width = await _padded(d, obj, group)
    out = np.empty(width * sizes.size, np.uint8)
    await d.on_loop(d.plan.prepare_all_gather(out, padded, group, None))
    return _unpickle_all(out, sizes, width)


async def gather_object(d: Door, obj: Any, dst: int, group: object) -> list[Any] | None:
    """Every rank's ``obj`` in group-rank order on global rank ``dst``; None elsewhere."""
    sizes, padded, width = await _padded(d, obj, group)
    mine = d.rank == dst
    out = np.empty(width * sizes.size, np.uint8) if mine else None
    await d.on_loop(d.plan.prepare_gather(padded, out, dst, group, None))
    return _unpickle_all(out, sizes, width) if mine else None


async def scatter_object(d: Door, objs: list[Any] | None, src: int, group: object) -> Any:
    """Object ``i`` of ``objs`` (given on global rank ``src``) on group rank ``i``."""
    n = d.size_of(group)
    mine = d.rank == src
    if mine:
        if objs is None or len(objs) != n:
            raise ValueError(f"scatter_object: src must pass a list of {n} objects")
        datas = [_pickle(o) for o in objs]
        sizes = np.array([x.size for x in datas], np.int64)
    else:
        sizes = np.empty(n, np.int64)
    await d.on_loop(d.plan.prepare_broadcast(sizes, src, group, None))
    width = int(sizes.max())
    padded = None
    if mine:
        padded = np.zeros(width * n, np.uint8)
        for i, x in enumerate(datas):
            padded[i * width:i * width + x.size] = x
    out = np.empty(width, np.uint8)
    await d.on_loop(d.plan.prepare_scatter(out, padded, src, group, None))
    return loads(out[:int(sizes[d.rank_in(group)])].tobytes())
