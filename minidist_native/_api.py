"""The public calls on CUDA tensors (names and arguments as ``minidist``'s: groups are
minidist groups, ``src`` / ``dst`` global ranks)."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import minidist
from minidist.errors import DistError, DistTimeoutError
from minidist.ops import ReduceOp, as_op

from ._errors import PREFIX
from ._keys import group_key, host_declaration, pair_key

#: calls are started under this lock: minidist numbers calls in the order they start,
#: and NCCL needs every rank to enqueue in the same order
_order = threading.RLock()


class NativeWork:
    """A call on CUDA tensors in flight (what ``async_op=True`` returns).

    ``future`` is a ``concurrent.futures.Future`` completed when the GPU has finished
    the call (its outputs may be read from any stream), or failed with the call's
    minidist error. This is what ``minidist.torch``'s Work wraps.
    """

    def __init__(self, future: concurrent.futures.Future, what: str) -> None:
        self.future = future
        self.what = what

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; raise the call's error. ``timeout`` (seconds) bounds only
        this wait (DistTimeoutError; the call goes on)."""
        from ._watchdog import watchdog

        if not watchdog().settle(self.future, timeout):
            raise DistTimeoutError(f"{PREFIX}{self.what} not done within {timeout:g} s "
                                   "(the call itself goes on)",
                                   collective=self.what) from None
        self.future.result()
        return True

    def is_completed(self) -> bool:
        return self.future.done()

    def exception(self) -> BaseException | None:
        return self.future.exception() if self.future.done() else None

    def get_future(self) -> concurrent.futures.Future:
        return self.future

    def __repr__(self) -> str:
        return f"<minidist_native.NativeWork {self.what} " \
               f"{'done' if self.future.done() else 'pending'}>"


def handles(tensor: Any) -> bool:
    """True for a CUDA tensor: what ``minidist.torch`` routes here."""
    return getattr(getattr(tensor, "device", None), "type", None) == "cuda"


_served: Any = None  # the Availability, once it said that CUDA tensors can be served


def require(what: str = "minidist_native") -> Any:
    """The :class:`Availability` when CUDA tensors can be served here; else DistError
    saying why (no CUDA ...)."""
    global _served
    if _served is not None:
        return _served
    from ._availability import available

    av = available()
    if not av.serves_cuda:
        raise DistError(f"{PREFIX}{what} needs CUDA: {av.reason}")
    _served = av
    return av


def _cuda(t: Any, what: str) -> Any:
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} needs a torch.Tensor, not {type(t).__name__}")
    if t.device.type != "cuda":
        av = require(what)  # on a machine without CUDA, say that first
        raise DistError(f"{PREFIX}{what}: the tensor is on {t.device}; minidist_native "
                        "serves CUDA tensors only (CPU tensors go through minidist.torch "
                        f"or minidist's numpy API) [{av.reason}]")
    require(what)
    if t.layout != torch.strided:
        raise ValueError(f"{what}: {t.layout} tensors are not supported (dense only)")
    return t


def _index(t: Any) -> int:
    i = t.device.index
    return 0 if i is None else int(i)


def _where(group: Any, t: Any, what: str) -> tuple[Any, Any, Any, int]:
    from ._context import context

    ctx = context()
    g = ctx.door.plan.group(group, what)
    device = _index(t)
    where = ctx.keys.get((g.id, g.ranks, device))
    if where is None:
        where = ctx.keys[(g.id, g.ranks, device)] = (group_key(g.id, g.ranks, device),
                                                     g.rank_of(ctx.door.rank))
    return ctx, g, where[0], where[1]


def _finish(fut: concurrent.futures.Future, what: str, async_op: bool
            ) -> NativeWork | None:
    from ._watchdog import watchdog

    if async_op:
        watchdog().start(fut)
        return NativeWork(fut, what)
    watchdog().settle(fut)  # polled on this thread
    fut.result()
    return None


def _root(g: Any, rank: int, what: str, name: str) -> int:
    r = g.rank_of(rank)
    if r < 0:
        raise ValueError(f"{what}: {name}={rank} is not a member of {g!r}")
    return r


def _same(what: str, a: Any, b: Any) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{what}: the tensors' dtypes differ ({a.dtype} and {b.dtype})")
    if a.device != b.device:
        raise ValueError(f"{what}: the tensors are on different devices ({a.device} and "
                         f"{b.device})")


# ---------------------------------------------------------------------- collectives


def all_reduce(tensor: Any, op: ReduceOp = ReduceOp.SUM, group: Any = None,
               async_op: bool = False) -> NativeWork | None:
    """Reduce a CUDA tensor across the group in place; every rank gets identical bits."""
    from ._dtypes import check_reduce

    what = "all_reduce"
    with _order:
        t = _cuda(tensor, what)
        op = as_op(op)
        check_reduce(op, t.dtype, what)
        ctx, g, key, me = _where(group, t, what)
        fut = ctx.run(key, g, g.ranks, me, what, lambda p: p.all_reduce(t, op))
    return _finish(fut, what, async_op)


def broadcast(tensor: Any, src: int = 0, group: Any = None,
              async_op: bool = False) -> NativeWork | None:
    """Copy global rank ``src``'s tensor into every rank's tensor of the group."""
    what = "broadcast"
    with _order:
        t = _cuda(tensor, what)
        ctx, g, key, me = _where(group, t, what)
        root = _root(g, src, what, "src")
        fut = ctx.run(key, g, g.ranks, me, what, lambda p: p.broadcast(t, root))
    return _finish(fut, what, async_op)


def reduce(tensor: Any, dst: int = 0, op: ReduceOp = ReduceOp.SUM, group: Any = None,
           async_op: bool = False) -> NativeWork | None:
    """Reduce into global rank ``dst``'s tensor; the others' tensors are left as they
    were."""
    from ._dtypes import check_reduce

    what = "reduce"
    with _order:
        t = _cuda(tensor, what)
        op = as_op(op)
        check_reduce(op, t.dtype, what)
        ctx, g, key, me = _where(group, t, what)
        root = _root(g, dst, what, "dst")
        fut = ctx.run(key, g, g.ranks, me, what, lambda p: p.reduce(t, op, root))
    return _finish(fut, what, async_op)


def all_gather(output: Any, input: Any, group: Any = None,
               async_op: bool = False) -> NativeWork | None:
    """Concatenate every rank's ``input`` into ``output`` in group-rank order
    (``output.numel() == input.numel() * group size``)."""
    what = "all_gather"
    with _order:
        out, inp = _cuda(output, what), _cuda(input, what)
        _same(what, out, inp)
        ctx, g, key, me = _where(group, inp, what)
        if out.numel() != inp.numel() * g.size:
            raise ValueError(f"{what}: the output has {out.numel()} elements; input x group "
                             f"size is {inp.numel() * g.size}")
        fut = ctx.run(key, g, g.ranks, me, what, lambda p: p.all_gather(out, inp))
    return _finish(fut, what, async_op)


def reduce_scatter(output: Any, input: Any, op: ReduceOp = ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> NativeWork | None:
    """Reduce ``input`` (group size x ``output.numel()`` elements) across the group; group
    rank ``i`` gets block ``i`` in ``output``."""
    from ._dtypes import check_reduce

    what = "reduce_scatter"
    with _order:
        out, inp = _cuda(output, what), _cuda(input, what)
        _same(what, out, inp)
        op = as_op(op)
        check_reduce(op, out.dtype, what)
        ctx, g, key, me = _where(group, inp, what)
        if inp.numel() != out.numel() * g.size:
            raise ValueError(f"{what}: the input has {inp.numel()} elements; output x group "
                             f"size is {out.numel() * g.size}")
        fut = ctx.run(key, g, g.ranks, me, what,
                      lambda p: p.reduce_scatter(out, inp, op))
    return _finish(fut, what, async_op)


# ---------------------------------------------------------------------- point-to-point


def _p2p(tensor: Any, peer: int, tag: int, group: Any, sending: bool,
         async_op: bool) -> NativeWork | None:
    what = "send" if sending else "recv"
    with _order:
        t = _cuda(tensor, what)
        from ._context import context

        ctx = context()
        g = ctx.door.plan.group(group, what)
        me = ctx.door.rank
        if peer is None:
            raise ValueError(f"{what}: CUDA tensors need a source rank (src=None, any "
                             "source, is not supported)")
        if g.rank_of(peer) < 0:
            raise ValueError(f"{what}: global rank {peer} is not a member of {g!r}")
        if peer == me:
            raise ValueError(f"{what}: a rank cannot {what} to itself")
        key = pair_key(me, peer, _index(t))
        pair = key.ranks
        i_me, i_peer = pair.index(me), pair.index(peer)

        def call(p: Any) -> concurrent.futures.Future:
            if p.name == "host":
                return (p.send(t, peer, tag) if sending else p.recv(t, peer, tag))
            return p.send(t, i_peer) if sending else p.recv(t, i_peer)

        # a pair's communicator sets up over the world's timeout; host staging uses
        # the caller's group and tag
        fut = ctx.run(key, g, pair, i_me, what, call)
    return _finish(fut, what, async_op)


def send(tensor: Any, dst: int, tag: int = 0, group: Any = None,
         async_op: bool = False) -> NativeWork | None:
    """Send a CUDA tensor to global rank ``dst``. On the NCCL path messages between two
    ranks match in the order sent (``tag`` is used by host staging only)."""
    return _p2p(tensor, dst, tag, group, True, async_op)


def recv(tensor: Any, src: int, tag: int = 0, group: Any = None,
         async_op: bool = False) -> NativeWork | None:
    """Receive into a CUDA tensor from global rank ``src``."""
    return _p2p(tensor, src, tag, group, False, async_op)


# ---------------------------------------------------------------------- the rest


def declare_host() -> None:
    """Say that this rank passes CPU tensors where its groups' other ranks pass CUDA
    tensors (a learner on a GPU, env workers on CPUs): those groups then stage the CUDA
    tensors through host memory, to meet this rank's calls on minidist's wire.
    Call it before the groups' first calls (the torch backend is meant to call it in
    processes without CUDA)."""
    d = minidist.api.door()
    minidist.Store(d).set(host_declaration(d.rank), b"1")


def communicators() -> list[dict[str, Any]]:
    """The communicators of this process: key, path (nccl / ipc / host), binding, why
    that path, and whether it failed."""
    from ._context import current

    ctx = current()
    return ctx.describe() if ctx is not None else []
