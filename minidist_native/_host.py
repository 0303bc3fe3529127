"""Host staging: a CUDA tensor copied to host memory, moved by minidist's numpy API,
copied back.

The path of last resort, and the path of groups that mix CPU and GPU ranks: a staged
tensor becomes exactly the numpy array ``minidist.torch`` makes of a CPU tensor (same
dtype rules, same shape), so a GPU rank's call meets a CPU rank's call on the wire.
Every call is synchronous (the copies synchronize the stream). The staging buffers are
pinned (page-locked) when CUDA is there, and kept for reuse.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

import minidist
from minidist.ops import ReduceOp

from ._dtypes import staging_dtype


def done_future() -> concurrent.futures.Future:
    f: concurrent.futures.Future = concurrent.futures.Future()
    f.set_result(None)
    return f


class PinnedPool:
    """A few page-locked host buffers, reused by size (CPU memory when ``pinned`` is
    False, as on a machine without CUDA)."""

    def __init__(self, pinned: bool, keep: int = 4) -> None:
        self.pinned = pinned
        self.keep = keep
        self._bufs: OrderedDict[int, list[torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            free = self._bufs.get(nbytes)
            if free:
                return free.pop()
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=self.pinned)

    def give(self, buf: torch.Tensor) -> None:
        with self._lock:
            self._bufs.setdefault(buf.numel(), []).append(buf)
            self._bufs.move_to_end(buf.numel())
            while sum(len(v) for v in self._bufs.values()) > self.keep:
                size, lst = next(iter(self._bufs.items()))
                lst.pop(0)
                if not lst:
                    del self._bufs[size]


class Staged:
    """A host copy of (or a host buffer for) a tensor: ``host`` (CPU, the staging dtype,
    the tensor's shape) and ``array``, numpy's view of it."""

    def __init__(self, pool: PinnedPool, t: torch.Tensor, reduce: bool, fill: bool,
                 numel: int | None = None) -> None:
        self.pool = pool
        self.dtype = staging_dtype(t.dtype, reduce)
        shape = tuple(t.shape) if numel is None else (numel,)
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        width = torch.empty(0, dtype=self.dtype).element_size()
        self.buf = pool.take(n * width)
        self.host = self.buf[:n * width].view(self.dtype).view(shape)
        self.source_dtype = t.dtype
        if fill:
            self.load(t)

    def _typed(self) -> torch.Tensor:
        """``host`` seen with the source tensor's dtype when staging only relabels bits."""
        if self.dtype == self.source_dtype or (self.source_dtype == torch.bfloat16
                                               and self.dtype == torch.float32):
            return self.host
        return self.host.view(self.source_dtype)

    def load(self, t: torch.Tensor) -> None:
        self._typed().copy_(t.detach().reshape(self.host.shape))

    @property
    def array(self) -> np.ndarray:
        return self.host.numpy()

    def store(self, t: torch.Tensor) -> None:
        """Copy the host values back into ``t`` (cast back for a float32-staged bf16)."""
        src = self._typed()
        t.detach().copy_(src.reshape(t.shape))

    def release(self) -> None:
        self.pool.give(self.buf)


class HostPath:
    """Collectives of one group (``group``: a minidist Group, None for the world, whose
    global ranks in group-rank order are ``ranks``) staged through host memory. Roots
    are group ranks (as on the other paths); point-to-point peers are global ranks."""

    name = "host"

    def __init__(self, group: Any, ranks: tuple[int, ...],
                 pool: PinnedPool | None = None) -> None:
        self.group = group
        self.ranks = tuple(ranks)
        self.pool = pool or PinnedPool(torch.cuda.is_available())

    def _stage(self, t: torch.Tensor, reduce: bool, fill: bool = True,
               numel: int | None = None) -> Staged:
        return Staged(self.pool, t, reduce, fill, numel)

    def all_reduce(self, t: torch.Tensor, op: ReduceOp) -> concurrent.futures.Future:
        s = self._stage(t, True)
        try:
            minidist.all_reduce(s.array, op, self.group)
            s.store(t)
        finally:
            s.release()
        return done_future()

    def broadcast(self, t: torch.Tensor, root: int) -> concurrent.futures.Future:
        me, src = minidist.get_rank(), self.ranks[root]
        s = self._stage(t, False, fill=(me == src))
        try:
            minidist.broadcast(s.array, src, self.group)
            if me != src:
                s.store(t)
        finally:
            s.release()
        return done_future()

    def reduce(self, t: torch.Tensor, op: ReduceOp, root: int) -> concurrent.futures.Future:
        dst = self.ranks[root]
        s = self._stage(t, True)
        try:
            minidist.reduce(s.array, dst, op, self.group)
            if minidist.get_rank() == dst:
                s.store(t)
        finally:
            s.release()
        return done_future()

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> concurrent.futures.Future:
        si = self._stage(inp, False)
        so = self._stage(out, False, fill=False, numel=out.numel())
        try:
            minidist.all_gather(so.array, si.array, self.group)
            so.store(out)
        finally:
            si.release()
            so.release()
        return done_future()

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor,
                       op: ReduceOp) -> concurrent.futures.Future:
        si = self._stage(inp, True)
        so = self._stage(out, True, fill=False)
        try:
            minidist.reduce_scatter(so.array, si.array, op, self.group)
            so.store(out)
        finally:
            si.release()
            so.release()
        return done_future()

    def send(self, t: torch.Tensor, dst: int, tag: int = 0) -> concurrent.futures.Future:
        s = self._stage(t, False)
        try:
            minidist.send(s.array, dst, tag, self.group)
        finally:
            s.release()
        return done_future()

    def recv(self, t: torch.Tensor, src: int, tag: int = 0) -> concurrent.futures.Future:
        s = self._stage(t, False, fill=False)
        try:
            minidist.recv(s.array, src, tag, self.group)
            s.store(t)
        finally:
            s.release()
        return done_future()

    def close(self) -> None:
        pass
