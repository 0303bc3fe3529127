"""Object collectives (pickled, like mpi4py's lower-case methods), written once for the
blocking and the asyncio API: each is a generator of the few array calls it makes
(yielded to the front end, which runs each as it runs its own: the blocking API on the
caller's thread, :meth:`minidist.door.Door.steps`; the asyncio API on the loop,
:meth:`~minidist.door.Door.steps_on_loop`) that returns the call's result."""

from __future__ import annotations

import pickle
from collections.abc import Generator
from typing import Any

import numpy as np

from .door import Door, Planned

Steps = Generator[Planned, None, Any]  # array calls to run in turn; returns the result


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def _pickle(obj: Any) -> np.ndarray:
    return np.frombuffer(dumps(obj), np.uint8)


def broadcast_object(d: Door, obj: Any, src: int, group: object) -> Steps:
    """``obj`` of global rank ``src``, on every rank of the group."""
    mine = d.rank == src
    data = _pickle(obj) if mine else None
    size = np.array([0 if data is None else data.size], np.int64)
    yield d.plan.prepare_broadcast(size, src, group, None)
    buf = data.copy() if data is not None else np.empty(int(size[0]), np.uint8)
    yield d.plan.prepare_broadcast(buf, src, group, None)
    return obj if mine else loads(buf.tobytes())


def _padded(d: Door, obj: Any, group: object) -> Generator[
        Planned, None, tuple[np.ndarray, np.ndarray, int]]:
    """(every rank's pickled size, this rank's pickle padded to the largest, that width)."""
    data = _pickle(obj)
    sizes = np.empty(d.size_of(group), np.int64)
    yield d.plan.prepare_all_gather(sizes, np.array([data.size], np.int64), group, None)
    width = int(sizes.max())
    padded = np.zeros(width, np.uint8)
    padded[:data.size] = data
    return sizes, padded, width


def _unpickle_all(out: np.ndarray, sizes: np.ndarray, width: int) -> list[Any]:
    return [loads(out[i * width:i * width + int(n)].tobytes()) for i, n in enumerate(sizes)]


def all_gather_object(d: Door, obj: Any, group: object) -> Steps:
    """Every rank's ``obj``, in group-rank order, on every rank."""
    sizes, padded, width = yield from _padded(d, obj, group)
    out = np.empty(width * sizes.size, np.uint8)
    yield d.plan.prepare_all_gather(out, padded, group, None)
    return _unpickle_all(out, sizes, width)


def gather_object(d: Door, obj: Any, dst: int, group: object) -> Steps:
    """Every rank's ``obj`` in group-rank order on global rank ``dst``; None elsewhere."""
    sizes, padded, width = yield from _padded(d, obj, group)
    mine = d.rank == dst
    out = np.empty(width * sizes.size, np.uint8) if mine else None
    yield d.plan.prepare_gather(padded, out, dst, group, None)
    return _unpickle_all(out, sizes, width) if mine else None


def scatter_object(d: Door, objs: list[Any] | None, src: int, group: object) -> Steps:
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
    yield d.plan.prepare_broadcast(sizes, src, group, None)
    width = int(sizes.max())
    padded = None
    if mine:
        padded = np.zeros(width * n, np.uint8)
        for i, x in enumerate(datas):
            padded[i * width:i * width + x.size] = x
    out = np.empty(width, np.uint8)
    yield d.plan.prepare_scatter(out, padded, src, group, None)
    return loads(out[:int(sizes[d.rank_in(group)])].tobytes())
