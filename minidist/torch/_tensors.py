"""torch tensors <-> numpy arrays for minidist, without copies where the layout allows.

A contiguous CPU tensor is handed to minidist as a numpy view of its own memory
(``t.detach().numpy()``). A non-contiguous one is copied into a contiguous scratch
tensor and, for outputs, copied back when the call completes. bfloat16, which numpy
lacks, moves as its raw 16-bit patterns (``t.view(torch.int16)``) and is reduced in
float32, rounded back once at the end. Dtypes without a numpy twin (float8, ...) move
as raw bytes of the same width and cannot be reduced.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from operator import attrgetter, is_

import numpy as np
import torch

from ..shm import core
from ..shm.fast_slots import SLOT_BYTES

# torch dtypes numpy has an exact twin for (torch's own .numpy() conversion)
_NUMPY = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64,
    torch.complex64, torch.complex128,
}
# the integer type of each width, to move raw bits of dtypes numpy lacks
_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

Post = Callable[[], None] | None


def check_tensor(t: object, what: str) -> torch.Tensor:
    """``t`` if minidist can move it; a clear TypeError / ValueError otherwise."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} needs a torch.Tensor, not {type(t).__name__}")
    if not t.is_cpu:
        raise ValueError(
            f"{what}: tensor is on {t.device}; this call of minidist.torch moves CPU "
            "tensors only (CUDA tensors go to all_reduce, broadcast, reduce, all_gather, "
            "reduce_scatter, send and recv; elsewhere copy to the CPU first)")
    if t.layout != torch.strided:
        raise ValueError(f"{what}: {t.layout} tensors are not supported (dense only)")
    return t


def reducible(t: torch.Tensor, what: str) -> None:
    """TypeError if elementwise reductions are not defined on ``t``'s dtype."""
    if t.dtype not in _NUMPY and t.dtype != torch.bfloat16:
        raise TypeError(f"{what}: cannot reduce tensors of dtype {t.dtype} "
                        "(they can only be moved: broadcast, gather, send, ...)")


def overlaps(t: torch.Tensor) -> bool:
    """True unless ``t``'s elements provably occupy distinct memory (conservative)."""
    need = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride < need:
            return True
        need = stride * size
    return False


def _plain(t: torch.Tensor) -> bool:
    """Whether ``t`` can be viewed by numpy in place."""
    return t.is_contiguous() and not t.is_conj() and not t.is_neg()


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor with ``t``'s values (``t`` itself when it already is one)."""
    t = t.detach()
    if _plain(t):
        return t
    return t.resolve_conj().resolve_neg().contiguous()


def _numpy(t: torch.Tensor, reduce: bool) -> tuple[np.ndarray, torch.Tensor]:
    """(numpy view, the tensor that owns its memory) of a contiguous tensor."""
    if t.dtype in _NUMPY:
        return t.numpy(), t
    if t.dtype == torch.bfloat16 and reduce:
        f = t.float()
        return f.numpy(), f
    raw = _RAW.get(t.element_size())
    if raw is None:
        raise TypeError(f"minidist cannot move tensors of dtype {t.dtype}")
    return t.view(raw).numpy(), t


def as_input(t: torch.Tensor, what: str, reduce: bool = False) -> np.ndarray:
    """A numpy array with ``t``'s values that minidist only reads.

    ``reduce``: the values take part in a reduction (bfloat16 becomes float32).
    Zero-copy for a contiguous tensor of a numpy dtype (or bfloat16 when not reduced).
    """
    check_tensor(t, what)
    if reduce:
        reducible(t, what)
    return _numpy(_dense(t), reduce)[0]


REMEMBER_BYTES = SLOT_BYTES  # plain_view remembers the last views of tensors this small
_NO_VIEW = (None, 0, (), None, None, False)
_last = _NO_VIEW  # (tensor, data_ptr, shape, dtype, its numpy view, at most one element)
_prev = _NO_VIEW  # the one before (an RL step alternates two: the action, the observation)


def plain_view(t: object) -> np.ndarray | None:
    """The numpy view of a plain CPU tensor (dense, contiguous, of a numpy dtype, not
    requiring grad); None for any other tensor or object. ``Tensor.numpy()`` refuses
    every other kind of tensor itself (another device or layout, a dtype numpy lacks,
    autograd, the conjugate and negative bits), so the common case costs one call.

    The views of the last two such tensors of at most REMEMBER_BYTES are remembered and
    given again (half the cost of ``numpy()``: small calls in a loop on the same
    tensors) while that tensor still has the same memory address, shape and dtype, is
    contiguous and does not require grad: the view is then the memory ``numpy()`` would
    give, in the same shape. Whatever changed it in place (``set_``, ``resize_``,
    ``.data =``, ``t_()``, ``requires_grad_()``) shows in one of these. (A tensor of at
    most one element is contiguous whatever its strides: its shape says so.)"""
    global _last, _prev
    if type(t) is not torch.Tensor:
        return None
    seen = _last if _last[0] is t else _prev if _prev[0] is t else None
    if seen is not None:
        if (t.data_ptr() == seen[1] and t.shape == seen[2] and t.dtype is seen[3]
                and not t.requires_grad and (seen[5] or t.is_contiguous())):
            return seen[4]
    try:
        arr = t.numpy()
    except (TypeError, RuntimeError, NotImplementedError, ValueError):
        return None
    if not arr.flags.c_contiguous:
        return None
    if arr.nbytes <= REMEMBER_BYTES:
        if _last[0] is not t:
            _prev = _last
        _last = (t, t.data_ptr(), t.shape, t.dtype, arr, arr.size <= 1)
    return arr


def plain_views(ts: object, like: np.ndarray) -> list[np.ndarray] | None:
    """The numpy views of a list (or tuple) of plain CPU tensors (see
    :func:`plain_view`) of ``like``'s dtype and number of elements, in order; None if
    any is not one (the caller then takes the general path, which says what is
    wrong)."""
    if type(ts) is not list and type(ts) is not tuple:
        return None
    views = []
    dtype, size = like.dtype, like.size
    for t in ts:
        if type(t) is not torch.Tensor:
            return None
        try:
            arr = t.numpy()
        except (TypeError, RuntimeError, NotImplementedError, ValueError):
            return None
        if arr.dtype != dtype or arr.size != size or not arr.flags.c_contiguous:
            return None
        views.append(arr)
    return views


def forget_views() -> None:
    """Drop the remembered views (and so the tensors they hold), lists' too."""
    global _last, _prev
    _last = _prev = _NO_VIEW
    _lists.clear()


def as_output(t: torch.Tensor, what: str, reduce: bool = False) -> tuple[np.ndarray, Post]:
    """(a numpy array that minidist reads and writes, a step that puts its values into
    ``t`` once the call is done, or None when the array is ``t``'s own memory).

    The array starts with ``t``'s values (in-place collectives read them).
    """
    arr = plain_view(t)
    if arr is not None:
        return arr, None
    check_tensor(t, what)
    if reduce:
        reducible(t, what)
    d = t.detach() if t.requires_grad else t
    if _plain(d) and (d.dtype in _NUMPY or not reduce):
        return _numpy(d, reduce)[0], None
    if not _plain(d) and overlaps(d):
        raise ValueError(f"{what}: the output tensor has overlapping memory (stride "
                         f"{tuple(d.stride())} for shape {tuple(d.shape)}, e.g. from "
                         "expand()); pass a contiguous tensor")
    arr, owner = _numpy(_dense(d), reduce)

    def post() -> None:
        d.copy_(owner)

    return arr, post


def scratch_like(t: torch.Tensor, n: int, reduce: bool = False) -> tuple[torch.Tensor,
                                                                         np.ndarray]:
    """A new contiguous tensor of ``n`` blocks shaped like ``t`` and a numpy view of it
    (float32 for bfloat16 when ``reduce``)."""
    dtype = torch.float32 if reduce and t.dtype == torch.bfloat16 else t.dtype
    buf = torch.empty((n, *t.shape), dtype=dtype)
    return buf, _numpy(buf, reduce)[0]


def packed(ts: list[torch.Tensor], what: str, reduce: bool = False) -> np.ndarray:
    """One contiguous numpy array holding the tensors of ``ts`` one after the other."""
    for t in ts:
        check_tensor(t, what)
        if reduce:
            reducible(t, what)
    if not ts:
        raise ValueError(f"{what}: empty tensor list")
    flat = torch.cat([t.detach().resolve_conj().resolve_neg().reshape(-1) for t in ts])
    return _numpy(flat, reduce)[0]


def same_dtype(what: str, *ts: torch.Tensor) -> None:
    dtypes = {t.dtype for t in ts}
    if len(dtypes) > 1:
        raise TypeError(f"{what}: all tensors must have the same dtype, got "
                        f"{sorted(str(d) for d in dtypes)}")


_T = torch.Tensor
_data_ptr, _numel, _contiguous, _conj, _neg = (_T.data_ptr, _T.numel, _T.is_contiguous,
                                               _T.is_conj, _T.is_neg)
_PLAIN = {torch.Tensor}
_dtype_grad = attrgetter("dtype", "requires_grad")
_SAME = getattr(core.compiled, "tensors_same", None)  # ListViews.same in C (None: pure)
_lists: dict[int, list] = {}  # per thread: the ListViews it used last, newest first
KEEP_LISTS = 4  # lists remembered per thread (a learner's scatter and gather lists)
KEEP_BYTES = 4 << 20  # ... of at most this many bytes in all (their rows are kept too)


class ListViews:
    """The numpy views of a list of plain CPU tensors (see :func:`plain_views`), with
    ``flat`` (each view as one row) and ``rows``, a scratch array of one row per tensor
    that a gather lands in (:meth:`land` copies it into the tensors; ``packed``: the
    same memory as one row, which :meth:`pack` packs the tensors into for a scatter's
    root). Once kept (:meth:`keep`, by :func:`list_views`) they are given again for a
    list whose tensors, in order, have the same memory addresses, numbers of elements
    and dtypes, are contiguous, plain (``torch.Tensor``, neither the conjugate nor the
    negative bit set) and do not require grad: the same tensors, or new views of the
    same memory (``list(batch.unbind())`` every step). The views keep the first
    tensors, so that memory stays where they point.

    When the kept tensors lie one after another in memory (the rows of one tensor:
    ``list(batch.unbind())``, ``list(batch)``), ``rows`` and ``packed`` are that memory
    itself: a scatter's root sends from it and a gather's lands in it, with no copy
    (:meth:`pack` and :meth:`land` then do nothing)."""

    __slots__ = ("tensors", "ptrs", "numels", "dtype", "meta", "views", "flat", "rows",
                 "packed", "in_place")

    def __init__(self, views: list[np.ndarray]) -> None:
        self.views = views
        self.flat = [v.reshape(-1) for v in views]
        self.rows = np.empty((len(views), views[0].size), views[0].dtype)
        self.packed = self.rows.reshape(-1)
        self.in_place = False  # rows and packed are the tensors' own memory
        self.tensors: tuple = ()
        self.ptrs: tuple[int, ...] = ()
        self.numels: tuple[int, ...] = ()
        self.dtype: torch.dtype | None = None
        self.meta: list[tuple] = []

    def keep(self, ts: list | tuple) -> None:
        """Note what :meth:`same` compares, of the tensors ``ts`` these views are of."""
        self.tensors = tuple(ts)
        self.ptrs = tuple(map(_data_ptr, ts))
        self.numels = tuple(map(_numel, ts))
        self.meta = list(map(_dtype_grad, ts))
        self.dtype = self.meta[0][0]
        first = self.flat[0]
        step = first.nbytes
        if step and self.ptrs == tuple(self.ptrs[0] + i * step for i in range(len(self.ptrs))):
            # one after another: the rows are the tensors' memory (they keep it alive)
            self.rows = np.lib.stride_tricks.as_strided(
                first, shape=(len(self.views), first.size), strides=(step, first.itemsize))
            self.packed = self.rows.reshape(-1)
            self.in_place = True

    def same(self, ts: list | tuple) -> bool:
        """Whether ``ts`` holds tensors of this kept list's memory and layout, in order
        (one call into the compiled core when it runs)."""
        if _SAME is not None:
            return _SAME(ts, self.tensors, self.ptrs, self.numels, self.dtype, torch.Tensor)
        try:
            return (len(ts) == len(self.ptrs)
                    and (all(map(is_, ts, self.tensors)) or (  # else: new views
                        set(map(type, ts)) == _PLAIN and not any(map(_conj, ts))
                        and not any(map(_neg, ts))))
                    and tuple(map(_data_ptr, ts)) == self.ptrs
                    and tuple(map(_numel, ts)) == self.numels
                    and all(map(_contiguous, ts))
                    and list(map(_dtype_grad, ts)) == self.meta)
        except (TypeError, RuntimeError):
            return False

    def pack(self) -> np.ndarray:
        """The tensors' values one after another (``packed``)."""
        if self.in_place:
            return self.packed
        return np.concatenate(self.views, axis=None, out=self.packed)

    def land(self) -> None:
        """Copy ``rows`` into the tensors, one row each."""
        if self.in_place:
            return
        for v, row in zip(self.flat, self.rows):
            v[:] = row


def fresh_views(ts: object, like: np.ndarray) -> ListViews | None:
    """:func:`plain_views` of ``ts`` as a :class:`ListViews`, not kept; None where
    that gives None or an empty list."""
    views = plain_views(ts, like)
    return ListViews(views) if views else None


def list_views(ts: object, like: np.ndarray) -> ListViews | None:
    """:func:`fresh_views` of ``ts``, kept: a learner scatters from and gathers into
    the same lists of tensors every step, and checking that they are unchanged costs a
    third of taking their views again. None where :func:`fresh_views` gives None, and
    for lists of more than KEEP_BYTES (large calls, whose views cost little beside
    their copies, keep no memory here)."""
    if (type(ts) is not list and type(ts) is not tuple) or \
            like.nbytes * len(ts) > KEEP_BYTES:
        return None
    kept = _lists.get(threading.get_ident())
    if kept is None:
        kept = _lists[threading.get_ident()] = []
    for lv in kept:
        if lv.views[0].dtype == like.dtype and lv.views[0].size == like.size and \
                lv.same(ts):
            return lv
    lv = fresh_views(ts, like)
    if lv is None:
        return None
    lv.keep(ts)
    kept.insert(0, lv)
    del kept[KEEP_LISTS:]
    return lv
