"""The collectives on torch tensors, over minidist groups; each returns a :class:`Work`.

Shared by the drop-in module (``minidist.torch.all_reduce`` ...) and the registered
torch.distributed backend. Arguments are already resolved: ``g`` is a minidist Group
(None: the world) this rank belongs to, and every rank is a global rank.

Each function validates everything first and only then submits minidist calls, so a bad
argument raises here and sends nothing. Calls are submitted under one lock: minidist
numbers calls in submission order, and torch may call from more than one thread (DDP
launches its all_reduces from the autograd engine's thread).
"""

from __future__ import annotations

import functools
import math
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .. import api as md
from ..errors import DistTimeoutError
from ..group import Group
from ..ops import ReduceOp
from ..plan import P2P_TAG_LIMIT, Prepared
from ..shm import repeat
from ._tensors import (
    as_input,
    as_output,
    check_tensor,
    fresh_views,
    list_views,
    packed,
    plain_view,
    same_dtype,
    scratch_like,
)
from ._work import DONE, Blocking, Done, Work, run_blocking, torch_worded

# point-to-point tags of minidist's internal space (2**31 and up) used by this adapter
TAG_COLLECTIVE = P2P_TAG_LIMIT + 0x7410  # all_to_all built on messages
TAG_OBJECT = P2P_TAG_LIMIT + 0x7411  # send_object_list / recv_object_list

class _Numbering:
    """The lock under which this adapter numbers its calls (a call of several minidist
    calls gets consecutive numbers, whichever threads issue calls meanwhile), and
    ``busy``: ``[how many times it is held]``, which a repeated scatter or gather's
    compiled step reads instead of taking the lock (it numbers its call only while no
    other is being numbered, holding the GIL from that look to its numbering)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.busy = [0]

    def __enter__(self) -> None:
        self.lock.acquire()
        self.busy[0] += 1

    def __exit__(self, *exc: object) -> None:
        self.busy[0] -= 1
        self.lock.release()


_order = _Numbering()


def _ordered(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _order:
            return fn(*args, **kwargs)
    return wrapper


# ---------------------------------------------------------------------- helpers


def to_op(op: Any) -> ReduceOp:
    """A minidist ReduceOp from minidist's, torch.distributed's (by name) or a name."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        name = op.upper()
    elif isinstance(op, int) and not isinstance(op, bool):
        return ReduceOp(op)
    else:
        inner = getattr(op, "op", None)  # a torch.distributed.ReduceOp instance
        name = getattr(inner if inner is not None and hasattr(inner, "name") else op,
                       "name", None)
    if name == "PREMUL_SUM":
        raise NotImplementedError("ReduceOp.PREMUL_SUM is not supported by minidist "
                                  "(multiply the tensor first, then use SUM)")
    try:
        return ReduceOp[name]
    except (KeyError, TypeError):
        raise ValueError(f"unsupported reduce op {op!r}; use one of "
                         f"{[o.name for o in ReduceOp]}") from None


def members(g: Group | None) -> tuple[int, ...]:
    """The global ranks of ``g`` in group-rank order (None: the world)."""
    if g is None:
        return tuple(range(md.get_world_size()))
    return g.ranks


def _size(g: Group | None) -> int:
    return md.get_world_size() if g is None else g.size


def _futures(*works: Any) -> list:
    return [w.get_future() for w in works]


def _issue(item: Any, post: Callable[[], None] | None, result: Any, what: str,
           blocking: bool, again: tuple | None = None) -> Work | Blocking:
    """A Work for a prepared minidist call, submitted now; for a blocking caller's call
    that takes the shared-memory fast path, a :class:`Blocking` that runs it when
    waited for, on the caller's thread (no hop to minidist's event loop). ``again``:
    (group, output, input) of a scatter or gather, which the fast path then remembers
    (:mod:`minidist.shm.repeat`)."""
    d = md.door()
    if blocking and isinstance(item, Prepared) and item.fast >= 0:
        if again is not None:
            g, out, inp = again
            post = _chain(post, lambda: repeat.remember(d, item, g, out, inp))
        return Blocking(d, item, post)
    return Work([d.submit(item)], post, result, what)


def _chain(*posts: Callable[[], None] | None) -> Callable[[], None] | None:
    steps = [p for p in posts if p is not None]
    if not steps:
        return None

    def run() -> None:
        for p in steps:
            p()
    return run


def _copy_out(buf: torch.Tensor, outs: Sequence[torch.Tensor]) -> Callable[[], None]:
    def post() -> None:
        for i, o in enumerate(outs):
            o.detach().copy_(buf[i].reshape(o.shape))
    return post


def _check_blocks(what: str, ts: Sequence[torch.Tensor], like: torch.Tensor, n: int,
                  name: str, gpu: bool = False) -> None:
    if not isinstance(ts, (list, tuple)):
        raise TypeError(f"{what}: {name} must be a list of tensors")
    if len(ts) != n:
        raise ValueError(f"{what}: {name} has {len(ts)} tensors; the group has {n} ranks")
    for t in ts:
        if not gpu:
            check_tensor(t, what)
        elif not isinstance(t, torch.Tensor) or t.device != like.device:
            raise ValueError(f"{what}: every tensor of {name} must be on {like.device} "
                             "(like the single tensor)")
    same_dtype(what, like, *ts)
    for t in ts:
        if t.numel() != like.numel():
            raise ValueError(f"{what}: every tensor of {name} must have {like.numel()} "
                             f"elements (like the single tensor), got {t.numel()}")


# ---------------------------------------------------------------------- CUDA tensors


def _on_gpu(*ts: Any) -> bool:
    """Whether the call's tensors are CUDA tensors (served by ``minidist_native``)."""
    for t in ts:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return True
    return False


def _native() -> Any:
    import minidist_native

    return minidist_native


def _gpu_work(nw: Any, post: Callable[[], None] | None, result: Any, what: str,
              device: torch.device) -> Work:
    """A Work for a ``minidist_native`` call (its ``NativeWork``)."""
    return Work([nw.future], post, result, what, devices=[device])


def _gpu_only(what: str, *ts: Any) -> None:
    """Refuse CUDA tensors in a call that minidist_native does not serve."""
    if _on_gpu(*ts):
        raise ValueError(f"{what}: CUDA tensors are not supported by this call in "
                         "minidist.torch (all_reduce, broadcast, reduce, all_gather, "
                         "reduce_scatter, send and recv are); copy to the CPU first")


# ---------------------------------------------------------------------- collectives


def all_reduce(t: torch.Tensor, op: Any, g: Group | None,
               blocking: bool = False) -> Work | Blocking | Done:
    if type(op) is not ReduceOp:
        op = to_op(op)
    arr = plain_view(t)
    if arr is None:
        return _all_reduce_other(t, op, g, blocking)
    # the common case: only the planning and the start hold the order lock
    d = md.door()
    with _order:
        item = d.plan.prepare_all_reduce(arr, op, g, None)
        if not blocking or item.fast < 0:
            return _issue(item, None, [t], "all_reduce", blocking)
    run_blocking(d, item)  # the shared-memory fast path, on this thread, now
    return DONE


@_ordered
def collective(name: str, t: torch.Tensor, op: Any, g: Group | None,
               blocking: bool = False) -> Work | Blocking:
    """A collective with a generated front end (:mod:`minidist.facade`) on ``t``, which
    is its input and receives its result."""
    if type(op) is not ReduceOp:
        op = to_op(op)
    arr, post = as_output(t, name, reduce=True)
    item = md.door().plan.prepare_collective(name, arr, op, g, None)
    return _issue(item, post, [t], name, blocking)


@_ordered
def _all_reduce_other(t: Any, op: ReduceOp, g: Group | None,
                      blocking: bool) -> Work | Blocking:
    """all_reduce of anything but a plain CPU tensor: sparse, CUDA, or one that minidist
    reduces through a copy (strided, bfloat16, requiring grad)."""
    if isinstance(t, torch.Tensor) and t.layout == torch.sparse_coo:
        return sparse_all_reduce(t, op, g)
    if _on_gpu(t):
        nw = _native().all_reduce(t, op, g, async_op=True)
        return _gpu_work(nw, None, [t], "all_reduce", t.device)
    arr, post = as_output(t, "all_reduce", reduce=True)
    item = md.door().plan.prepare_all_reduce(arr, op, g, None)
    return _issue(item, post, [t], "all_reduce", blocking)


@_ordered
def sparse_all_reduce(t: torch.Tensor, op: Any, g: Group | None) -> Work:
    """The sum of a sparse COO tensor over the group, in place (as gloo does it): the
    indices and values of every rank are gathered (padded to the largest count of
    entries), then added up and coalesced. Only ReduceOp.SUM. Runs to the end before it
    returns (three minidist calls: entry counts, indices, values); the Work is done."""
    what = "all_reduce (sparse)"
    op = to_op(op)
    if op is not ReduceOp.SUM:
        raise ValueError(f"{what}: sparse tensors can only be reduced with "
                         f"ReduceOp.SUM, not {op.name}")
    if t.device.type != "cpu":
        check_tensor(t, what)  # raises: CPU tensors only
    n = len(members(g))
    ranks = members(g)
    with torch.no_grad():
        src = t.detach().coalesce()
        idx, vals = src.indices().contiguous(), src.values().contiguous()
        nnz, sd, dd = int(idx.shape[1]), t.sparse_dim(), t.dense_dim()
        meta = torch.tensor([nnz, sd, dd, *t.shape], dtype=torch.int64)
        metas = torch.empty(n, meta.numel(), dtype=torch.int64)
        all_gather_into_tensor(metas, meta, g).wait()
        for r in range(n):
            if not torch.equal(metas[r, 1:], meta[1:]):
                raise ValueError(
                    f"{what}: global rank {ranks[r]} has a sparse tensor of shape "
                    f"{tuple(metas[r, 3:].tolist())} with {int(metas[r, 1])} sparse "
                    f"dimensions; this rank's is {tuple(t.shape)} with {sd}")
        counts = metas[:, 0].tolist()
        top = max(counts)
        dense = tuple(t.shape[sd:])
        if top:
            pidx = torch.zeros(sd, top, dtype=torch.int64)
            pidx[:, :nnz] = idx
            pvals = torch.zeros((top, *dense), dtype=vals.dtype)
            pvals[:nnz] = vals
            gidx = torch.empty((n, sd, top), dtype=torch.int64)
            gvals = torch.empty((n, top, *dense), dtype=vals.dtype)
            w1 = all_gather_into_tensor(gidx, pidx, g)
            w2 = all_gather_into_tensor(gvals, pvals, g)
            w1.wait()
            w2.wait()
            all_idx = torch.cat([gidx[r, :, :c] for r, c in enumerate(counts)], dim=1)
            all_vals = torch.cat([gvals[r, :c] for r, c in enumerate(counts)])
        else:
            all_idx, all_vals = idx, vals
        total = torch.sparse_coo_tensor(all_idx, all_vals, t.shape).coalesce()
        t.copy_(total)
    return Work([], None, [t], "all_reduce")


@_ordered
def broadcast(t: torch.Tensor, src: int, g: Group | None, blocking: bool = False) -> Work:
    if _on_gpu(t):
        nw = _native().broadcast(t, src, g, async_op=True)
        return _gpu_work(nw, None, [t], "broadcast", t.device)
    arr, post = as_output(t, "broadcast")
    item = md.door().plan.prepare_broadcast(arr, src, g, None)
    return _issue(item, post, [t], "broadcast", blocking)


@_ordered
def reduce(t: torch.Tensor, dst: int, op: Any, g: Group | None,
           blocking: bool = False) -> Work:
    op = to_op(op)
    if _on_gpu(t):
        nw = _native().reduce(t, dst, op, g, async_op=True)
        return _gpu_work(nw, None, [t], "reduce", t.device)
    arr, post = as_output(t, "reduce", reduce=True)
    item = md.door().plan.prepare_reduce(arr, dst, op, g, None)
    return _issue(item, post, [t], "reduce", blocking)


@_ordered
def barrier(g: Group | None, blocking: bool = False) -> Work:
    return _issue(md.door().plan.prepare_barrier(g), None, None, "barrier", blocking)


@_ordered
def all_gather(outs: Sequence[torch.Tensor], t: torch.Tensor, g: Group | None) -> Work:
    what = "all_gather"
    if _on_gpu(t, *outs):
        _check_blocks(what, outs, t, len(members(g)), "tensor_list", gpu=True)
        buf = torch.empty((len(outs), t.numel()), dtype=t.dtype, device=t.device)
        nw = _native().all_gather(buf.view(-1), t, g, async_op=True)
        return _gpu_work(nw, _copy_out(buf, outs), [list(outs)], what, t.device)
    check_tensor(t, what)
    _check_blocks(what, outs, t, len(members(g)), "tensor_list")
    inp = as_input(t, what)
    buf, arr = scratch_like(t, len(outs))
    w = md.all_gather(arr, inp, g, async_op=True)
    return Work(_futures(w), _copy_out(buf, outs), [list(outs)], what)


@_ordered
def all_gather_into_tensor(out: torch.Tensor, t: torch.Tensor, g: Group | None) -> Work:
    what = "all_gather_into_tensor"
    gpu = _on_gpu(out, t)
    if not gpu:
        check_tensor(t, what)
        check_tensor(out, what)
    same_dtype(what, out, t)
    n = len(members(g))
    if out.numel() != t.numel() * n:
        raise ValueError(f"{what}: the output has {out.numel()} elements; it needs the "
                         f"input's {t.numel()} times the group size {n}")
    if gpu:
        nw = _native().all_gather(out, t, g, async_op=True)
        return _gpu_work(nw, None, [out], what, out.device)
    inp = as_input(t, what)
    arr, post = as_output(out, what)
    w = md.all_gather(arr.reshape(-1), inp, g, async_op=True)
    return Work(_futures(w), post, [out], what)


@_ordered
def reduce_scatter(out: torch.Tensor, ins: Sequence[torch.Tensor], op: Any,
                   g: Group | None) -> Work:
    what = "reduce_scatter"
    op = to_op(op)
    if _on_gpu(out, *ins):
        _check_blocks(what, ins, out, len(members(g)), "input_list", gpu=True)
        flat = torch.cat([x.detach().reshape(-1) for x in ins])
        nw = _native().reduce_scatter(out, flat, op, g, async_op=True)
        return _gpu_work(nw, None, [out], what, out.device)
    check_tensor(out, what)
    _check_blocks(what, ins, out, len(members(g)), "input_list")
    inp = packed(list(ins), what, reduce=True)
    arr, post = as_output(out, what, reduce=True)
    w = md.reduce_scatter(arr.reshape(-1), inp, op, g, async_op=True)
    return Work(_futures(w), post, [out], what)


@_ordered
def reduce_scatter_tensor(out: torch.Tensor, t: torch.Tensor, op: Any,
                          g: Group | None) -> Work:
    what = "reduce_scatter_tensor"
    op = to_op(op)
    gpu = _on_gpu(out, t)
    if not gpu:
        check_tensor(t, what)
        check_tensor(out, what)
    same_dtype(what, out, t)
    n = len(members(g))
    if t.numel() != out.numel() * n:
        raise ValueError(f"{what}: the input has {t.numel()} elements; it needs the "
                         f"output's {out.numel()} times the group size {n}")
    if gpu:
        nw = _native().reduce_scatter(out, t, op, g, async_op=True)
        return _gpu_work(nw, None, [out], what, out.device)
    inp = as_input(t, what, reduce=True)
    arr, post = as_output(out, what, reduce=True)
    w = md.reduce_scatter(arr.reshape(-1), inp.reshape(-1), op, g, async_op=True)
    return Work(_futures(w), post, [out], what)


def again_sent(kind: str, t: object, ts: object, root: int, g: object) -> bool:
    """A blocking scatter or gather (``kind``) of a plain CPU tensor ``t`` on group ``g``
    (the torch world's group for the default one; a call on any other object is never
    one remembered), with ``ts`` the root's list of tensors (None elsewhere), run at
    once if it repeats this thread's last such call (:mod:`minidist.shm.repeat`): numbered
    while no other call of this adapter is being numbered, then run (True); False, with
    nothing done, for any other call, which then takes the general path. An env worker's
    step is two such calls, and so is its learner's (its lists' views kept,
    :func:`list_views`)."""
    r = getattr(repeat.here, kind, None)
    if r is None or r.door is not md.STATE.blocking:
        return False
    arr = plain_view(t)
    if arr is None:
        return False
    lv = None
    if r.is_root:
        lv = list_views(ts, arr)
        if lv is None:
            return False
        out, inp = (arr, lv.pack()) if kind == "scatter" else (lv.rows, arr)
    elif ts is not None and (type(ts) not in (list, tuple) or ts):
        return False  # the general path says what is wrong (an empty list is None)
    else:
        out, inp = (arr, None) if kind == "scatter" else (None, arr)
    try:
        step = r.step
        if step is not None:  # the compiled core's step: numbered unless _order is held
            got = step.run(out, inp, root, g, _order.busy)
            if got is None:
                return False
            if got is not True:
                r.step_on(out, inp, got)
        else:
            with _order:
                if not r.fits(g, root, out, inp):
                    return False
                job = r.number(out, inp)
            r.go(job)
    except DistTimeoutError as e:
        raise torch_worded(e) from e.__cause__
    if lv is not None and kind == "gather":
        lv.land()
    return True


@_ordered
def gather(t: torch.Tensor, outs: Sequence[torch.Tensor] | None, dst: int,
           g: Group | None, blocking: bool = False) -> Work | Blocking:
    what = "gather"
    inp = plain_view(t)
    if inp is not None and md.get_rank() == dst:
        # plain tensors: numpy views (kept for blocking calls, which end before the next)
        lv = (list_views(outs, inp) if blocking else None) or fresh_views(outs, inp)
        if lv is not None and len(lv.views) == _size(g):
            item = md.door().plan.prepare_gather(inp, lv.rows, dst, g, None)
            return _issue(item, lv.land, [list(outs)], what, blocking, (g, lv.rows, inp))
    elif inp is not None:
        item = md.door().plan.prepare_gather(inp, None, dst, g, None)
        return _issue(item, None, [], what, blocking, (g, None, inp))
    _gpu_only(what, t, *(outs or []))
    check_tensor(t, what)
    inp = as_input(t, what)
    if md.get_rank() == dst:
        if outs is None:
            raise ValueError(f"{what}: the destination rank must pass gather_list")
        _check_blocks(what, outs, t, len(members(g)), "gather_list")
        buf, arr = scratch_like(t, len(outs))
        item = md.door().plan.prepare_gather(inp, arr, dst, g, None)
        return _issue(item, _copy_out(buf, outs), [list(outs)], what, blocking)
    item = md.door().plan.prepare_gather(inp, None, dst, g, None)
    return _issue(item, None, [], what, blocking)  # blocking and fast: this thread


@_ordered
def scatter(t: torch.Tensor, ins: Sequence[torch.Tensor] | None, src: int,
            g: Group | None, blocking: bool = False) -> Work | Blocking:
    what = "scatter"
    arr = plain_view(t)
    if arr is not None:  # plain tensors: their numpy views, no copies but the root's
        inp = None
        rooted = md.get_rank() == src
        if rooted:
            lv = (list_views(ins, arr) if blocking else None) or fresh_views(ins, arr)
            if lv is not None and len(lv.views) == _size(g):
                inp = lv.pack()
        if inp is not None or not rooted:
            item = md.door().plan.prepare_scatter(arr, inp, src, g, None)
            return _issue(item, None, [t], what, blocking, (g, arr, inp))
    _gpu_only(what, t, *(ins or []))
    check_tensor(t, what)
    inp = None
    if md.get_rank() == src:
        if ins is None:
            raise ValueError(f"{what}: the source rank must pass scatter_list")
        _check_blocks(what, ins, t, len(members(g)), "scatter_list")
        inp = packed(list(ins), what)
    arr, post = as_output(t, what)
    item = md.door().plan.prepare_scatter(arr.reshape(-1), inp, src, g, None)
    return _issue(item, post, [t], what, blocking)  # blocking and fast: this thread


# ---------------------------------------------------------------------- all_to_all


def _isend(arr: np.ndarray, dst: int, g: Group | None, tag: int = TAG_COLLECTIVE):
    d = md.door()
    return d.submit(d.plan.prepare_send(arr, dst, tag, g, internal=True))


def _irecv(arr: np.ndarray, src: int, g: Group | None, tag: int = TAG_COLLECTIVE):
    d = md.door()
    return d.submit(d.plan.prepare_recv(arr, src, tag, g, internal=True))


@_ordered
def all_to_all(outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor],
               g: Group | None) -> Work:
    """Tensor ``j`` of ``ins`` to group rank ``j``; tensor ``i`` of ``outs`` from group
    rank ``i`` (sizes may differ per peer; one message per peer)."""
    what = "all_to_all"
    ranks = members(g)
    n = len(ranks)
    me = ranks.index(md.get_rank())
    for name, ts in (("output_tensor_list", outs), ("input_tensor_list", ins)):
        if not isinstance(ts, (list, tuple)) or len(ts) != n:
            raise ValueError(f"{what}: {name} must be a list of {n} tensors (the group size)")
        for t in ts:
            check_tensor(t, what)
    same_dtype(what, *outs, *ins)
    if outs[me].numel() != ins[me].numel():
        raise ValueError(f"{what}: this rank sends itself {ins[me].numel()} elements but "
                         f"expects {outs[me].numel()}")
    srcs = [as_input(t, what) for t in ins]
    dsts = [as_output(t, what) for t in outs]
    futures = []
    for j in range(n):
        if j != me:
            futures.append(_isend(srcs[j].reshape(-1), ranks[j], g))
            futures.append(_irecv(dsts[j][0].reshape(-1), ranks[j], g))

    def post() -> None:
        np.copyto(dsts[me][0].reshape(-1), srcs[me].reshape(-1))
        for _, p in dsts:
            if p is not None:
                p()

    return Work(futures, post, [list(outs)], what)


def _splits(what: str, name: str, splits: Sequence[int] | None, rows: int,
            n: int) -> list[int]:
    if splits is None or len(splits) == 0:
        if rows % n:
            raise ValueError(f"{what}: dim 0 of the {name} ({rows}) does not divide "
                             f"into {n} equal splits")
        return [rows // n] * n
    splits = [int(s) for s in splits]
    if len(splits) != n or any(s < 0 for s in splits):
        raise ValueError(f"{what}: {name}_split_sizes must be {n} non-negative ints, "
                         f"got {splits}")
    if sum(splits) != rows:
        raise ValueError(f"{what}: {name}_split_sizes {splits} add up to {sum(splits)}, "
                         f"but dim 0 of the {name} is {rows}")
    return splits


@_ordered
def all_to_all_single(out: torch.Tensor, t: torch.Tensor,
                      out_splits: Sequence[int] | None, in_splits: Sequence[int] | None,
                      g: Group | None) -> Work:
    what = "all_to_all_single"
    check_tensor(t, what)
    check_tensor(out, what)
    same_dtype(what, out, t)
    ranks = members(g)
    n = len(ranks)
    in_rows = t.shape[0] if t.dim() else 1
    out_rows = out.shape[0] if out.dim() else 1
    in_row = math.prod(t.shape[1:]) if t.dim() else 1
    out_row = math.prod(out.shape[1:]) if out.dim() else 1
    if in_row != out_row:
        raise ValueError(f"{what}: a row of the input has {in_row} elements, a row of "
                         f"the output {out_row}")
    even = not out_splits and not in_splits
    ins = _splits(what, "input", in_splits, in_rows, n)
    outs = _splits(what, "output", out_splits, out_rows, n)
    src = as_input(t, what).reshape(-1)
    arr, post = as_output(out, what)
    dst = arr.reshape(-1)
    if even and out.numel() == t.numel():
        w = md.all_to_all(dst, src, g, async_op=True)
        return Work(_futures(w), post, [out], what)
    me = ranks.index(md.get_rank())
    if ins[me] != outs[me]:
        raise ValueError(f"{what}: this rank sends itself {ins[me]} rows but expects "
                         f"{outs[me]}")
    in_off = np.concatenate([[0], np.cumsum(ins)]) * in_row
    out_off = np.concatenate([[0], np.cumsum(outs)]) * out_row
    futures = []
    for j in range(n):
        if j != me:
            futures.append(_isend(src[in_off[j]:in_off[j + 1]], ranks[j], g))
            futures.append(_irecv(dst[out_off[j]:out_off[j + 1]], ranks[j], g))

    def own() -> None:
        np.copyto(dst[out_off[me]:out_off[me + 1]], src[in_off[me]:in_off[me + 1]])

    return Work(futures, _chain(own, post), [out], what)


# ---------------------------------------------------------------------- point-to-point


@_ordered
def isend(t: torch.Tensor, dst: int, tag: int, g: Group | None) -> Work:
    if _on_gpu(t):
        nw = _native().send(t, dst, tag, g, async_op=True)
        return _gpu_work(nw, None, [t], "send", t.device)
    arr = as_input(t, "send")
    w = md.isend(arr, dst, tag, g)
    return Work(_futures(w), None, [t], "send")


@_ordered
def irecv(t: torch.Tensor, src: int | None, tag: int, g: Group | None) -> Work:
    """A receive from global rank ``src`` (None: from any rank of ``g``, the first
    message with ``tag`` to arrive; the Work's ``source_rank()`` is then the sender)."""
    if _on_gpu(t):
        nw = _native().recv(t, src, tag, g, async_op=True)
        return _gpu_work(nw, None, [t], "recv", t.device)
    arr, post = as_output(t, "recv")
    w = md.irecv(arr, src, tag, g)
    return Work(_futures(w), post, [t], "recv",
                source_rank=w.source_rank if src is None else src, group_ranks=members(g))


def send_again(t: object, dst: int, tag: int, g: Group | None) -> bool:
    """A blocking send of a plain CPU tensor like the last one to ``dst`` with ``tag``
    (:meth:`minidist.door.Door.send_again`): sent without planning it again (True);
    False, with nothing done, for any other (the general path checks and sends it)."""
    arr = plain_view(t)
    return arr is not None and md.door().send_again(arr, dst, tag, g)


def recv(t: torch.Tensor, src: int, tag: int, g: Group | None) -> int:
    """A blocking receive from global rank ``src``: for a CPU tensor it runs on the
    caller's thread (only its planning holds the order lock), so that from a rank of
    this node it waits in this rank's inbox (:mod:`minidist.shm.p2p`); a receive into
    a plain CPU tensor like the last one from there is not planned again
    (:meth:`minidist.door.Door.recv_again`)."""
    if _on_gpu(t):
        irecv(t, src, tag, g).wait()
        return src
    d = md.door()
    arr = plain_view(t)
    if arr is not None and d.recv_again(arr, src, tag, g):
        return src
    with _order:
        arr, post = as_output(t, "recv")
        item = d.plan.prepare_recv(arr, src, tag, g)
    Blocking(d, item, post).wait()
    return src


def recv_many(t: torch.Tensor, src: Any, tag: int, g: Group | None,
              blocking: bool) -> torch.Tensor | md.Work:
    """First-k receives into the rows of a CPU tensor (:func:`minidist.recv_many`):
    blocking, the senders as an int64 tensor, received on the caller's thread; else a
    minidist Work whose ``result()`` is them (numpy)."""
    if _on_gpu(t):
        raise NotImplementedError("recv_many: CPU tensors only (receive GPU tensors with "
                                  "irecv)")
    d = md.door()
    with _order:
        arr, post = as_output(t, "recv_many")
        m = (blocking and d.many_again(arr, src, tag, g)) or d.plan_many(arr, src, tag, g)
    if blocking:
        try:
            senders = d.wait_many(m)
        except DistTimeoutError as e:
            raise torch_worded(e) from e.__cause__
        if post is not None:
            post()
        return torch.from_numpy(senders)
    return md.Work(d.submit_many(m), on_done=post)


@_ordered
def _submit_object(obj: Any, dst: int, g: Group | None):
    d = md.door()
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return d.submit(d.plan.prepare_send(data, dst, TAG_OBJECT, g, is_object=True,
                                        internal=True))


def send_object(obj: Any, dst: int, g: Group | None) -> None:
    """Send a picklable object to global rank ``dst`` (the adapter's own tag)."""
    _submit_object(obj, dst, g).result()


@_ordered
def _submit_recv_object(src: int | None, g: Group | None):
    d = md.door()
    item = d.plan.prepare_recv(None, src, TAG_OBJECT, g, internal=True)
    return d.submit(item), item


def recv_object(src: int | None, g: Group | None) -> tuple[Any, int]:
    """The next object sent by ``send_object`` from global rank ``src`` (None: from any
    rank of ``g``), and its sender's global rank."""
    future, item = _submit_recv_object(src, g)
    obj = pickle.loads(future.result())
    return obj, item.source


# ---------------------------------------------------------------------- monitored barrier

_monitored: dict[int, int] = {}


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def monitored_barrier(g: Group | None, timeout: float | None, wait_all_ranks: bool) -> None:
    """A barrier in which the group's first rank names the ranks that did not arrive
    within ``timeout`` (through the job's key/value store), with gloo's wording.

    Only the first rank enforces ``timeout`` (as in gloo, so that it is the one to say
    who failed); it then tells the others, which raise at once. The others wait at
    most the group's timeout (or ``timeout``, if longer) for the first rank.
    ``timeout`` 0: the first rank does not wait; it passes only if every rank already
    arrived. Ranks in messages are group ranks, as in torch; the minidist part of the
    message names the global ranks.
    """
    group_timeout = md.door().timeout_of(g)
    if timeout is None:
        timeout = group_timeout
    ranks = members(g)
    gid = 0 if g is None else g.id
    with _order:
        count = _monitored.get(gid, 0)
        _monitored[gid] = count + 1
    if len(ranks) == 1:
        return
    store = md.get_store()
    base = f"__minidist_torch/monitored_barrier/{gid:x}"
    go = f"{base}/{count}/go"
    me = md.get_rank()
    where = f"group of ranks {list(ranks)}"
    if me == ranks[0]:
        keys = [f"{base}/{count}/{r}" for r in ranks[1:]]
        missing: list[int] = []
        if timeout == 0:
            missing = [r for r, k in zip(ranks[1:], keys) if not store.check([k])]
        else:
            try:
                store.wait(keys, timeout)
            except DistTimeoutError:
                missing = [r for r, k in zip(ranks[1:], keys) if not store.check([k])]
        if missing:
            store.set(go, "failed:" + ",".join(str(ranks.index(r)) for r in missing))
            shown = missing if wait_all_ranks else missing[:1]
            names = ", ".join(str(ranks.index(r)) for r in shown)
            if timeout == 0 and not wait_all_ranks:
                head = f"Rank 0 timed out in monitoredBarrier after {_ms(timeout)} ms."
            elif wait_all_ranks:
                head = (f"[Rank 0]: Ranks {names} failed to pass monitoredBarrier in "
                        f"{_ms(timeout)} ms")
            else:
                head = (f"[Rank 0]: Rank {names} failed to pass monitoredBarrier in "
                        f"{_ms(timeout)} ms")
            raise DistTimeoutError(
                f"{head} (monitored_barrier: global rank(s) {shown} did not reach the "
                f"barrier within {timeout:g} s; {where})", collective="monitored_barrier",
                group=g, missing=shown)
        for k in keys:
            store.delete_key(k)
        if count:
            store.delete_key(f"{base}/{count - 1}/go")
        store.set(go, b"1")
        return
    mine = ranks.index(me)
    store.set(f"{base}/{count}/{me}", b"1")
    head = (f"Rank {mine} successfully reached monitoredBarrier, but received errors "
            "while waiting for send/recv from rank 0. Please check rank 0 logs for "
            "faulty rank.")
    wait = max(timeout, group_timeout)
    try:
        store.wait([go], wait)
    except DistTimeoutError:
        raise DistTimeoutError(
            f"{head} (monitored_barrier: global rank {ranks[0]}, the group's first, did "
            f"not release global rank {me} within {wait:g} s; {where})",
            collective="monitored_barrier", group=g, missing=[ranks[0]]) from None
    value = store.get(go)
    if isinstance(value, str):
        value = value.encode()
    if value.startswith(b"failed:"):
        failed = [ranks[int(r)] for r in value[7:].decode().split(",") if r]
        raise DistTimeoutError(
            f"{head} (monitored_barrier: global rank {ranks[0]}, the group's first, "
            f"reported that global rank(s) {failed} did not reach the barrier in time; "
            f"{where})", collective="monitored_barrier", group=g, missing=failed)
