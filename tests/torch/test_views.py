"""plain_view remembers the numpy view of the last small tensor: it must give the same
view again only while that view is exactly what ``Tensor.numpy()`` would give, and must
not keep large tensors alive."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from minidist.torch import _tensors  # noqa: E402
from minidist.torch._tensors import REMEMBER_BYTES, forget_views, plain_view  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True, params=["compiled", "pure"])
def _forget(request, monkeypatch):
    """Each test on both checks of a kept list: the compiled core's and Python's."""
    if request.param == "pure":
        monkeypatch.setattr(_tensors, "_SAME", None)
    elif _tensors._SAME is None:
        pytest.skip("the compiled core is not active")
    forget_views()
    yield
    forget_views()


def _writes_through(t: torch.Tensor) -> None:
    """The view plain_view gives now is t's memory, in t's shape and dtype."""
    v = plain_view(t)
    assert v is not None
    assert v.shape == tuple(t.shape) and v.dtype == t.numpy().dtype
    v[...] = np.arange(v.size, dtype=v.dtype).reshape(v.shape)
    assert np.array_equal(t.numpy(), v)


def test_the_last_two_small_tensors_views_are_given_again():
    t = torch.zeros(4)
    v = plain_view(t)
    assert plain_view(t) is v
    v[2] = 5.0
    assert t[2].item() == 5.0
    other = torch.zeros(4)
    w = plain_view(other)
    assert w is not v  # another tensor: its own view
    assert plain_view(t) is v and plain_view(other) is w  # both remembered (a step's two)
    third = torch.zeros(4)
    plain_view(third)
    plain_view(other)
    assert plain_view(t) is not v  # two others since: t's view was dropped


CHANGES = {  # each changes one of what plain_view compares, keeping the rest
    "set_": lambda t: t.set_(torch.zeros(2, 2).untyped_storage(), 0, (2, 2)),  # address
    "data": lambda t: setattr(t, "data", torch.zeros(2, 2)),  # address
    "shrink": lambda t: t.resize_(1, 2),  # shape only (same address, strides (2, 1))
    "data_dtype": lambda t: setattr(t, "data", t.view(torch.int32)),  # dtype only
    "unsqueeze_": lambda t: t.unsqueeze_(0),
    "as_strided_": lambda t: t.as_strided_((2,), (1,)),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_tensor_changed_in_place_gets_a_fresh_view(change):
    t = torch.zeros(2, 2)
    old = plain_view(t)
    assert plain_view(t) is old
    CHANGES[change](t)
    assert plain_view(t) is not old
    _writes_through(t)


ONE_ELEMENT_CHANGES = {  # a one-element tensor's contiguity is not asked: its shape is
    "set_": lambda t: t.set_(torch.zeros(1, dtype=torch.float64).untyped_storage(), 0, (1,)),
    "as_strided_ offset": lambda t: t.as_strided_((1,), (3,), 1),  # the next element
    "shrink": lambda t: t.resize_(0),
    "data_dtype": lambda t: setattr(t, "data", t.view(torch.int64)),
    "unsqueeze_": lambda t: t.unsqueeze_(0),
    "requires_grad_": lambda t: t.requires_grad_(True),
}


@pytest.mark.parametrize("change", sorted(ONE_ELEMENT_CHANGES))
def test_a_one_element_tensor_changed_in_place_gets_a_fresh_view_or_none(change):
    base = torch.zeros(4, dtype=torch.float64)
    t = base[:1]
    old = plain_view(t)
    assert plain_view(t) is old
    ONE_ELEMENT_CHANGES[change](t)
    now = plain_view(t)
    assert now is not old
    if now is not None:
        _writes_through(t)


def test_a_one_element_tensor_with_any_stride_is_viewed_in_place():
    base = torch.zeros(4, dtype=torch.int64)
    t = base[:1]
    old = plain_view(t)
    t.as_strided_((1,), (7,))  # the same element: still contiguous, the same view
    assert plain_view(t) is old
    old[0] = 9
    assert int(base[0]) == 9


def test_a_transposed_tensor_gets_no_view():
    t = torch.zeros(2, 2)
    assert plain_view(t) is not None
    t.t_()  # the same address and shape, strides (1, 2): not contiguous
    assert plain_view(t) is None


def test_a_tensor_that_now_requires_grad_gets_no_view():
    t = torch.zeros(3)
    assert plain_view(t) is not None
    t.requires_grad_(True)
    assert plain_view(t) is None


def test_only_small_tensors_are_kept_alive():
    big = torch.zeros(REMEMBER_BYTES // 4 + 1)
    ref = weakref.ref(big)
    assert plain_view(big) is not None
    del big
    gc.collect()
    assert ref() is None
    small = torch.zeros(REMEMBER_BYTES // 4)
    ref = weakref.ref(small)
    assert plain_view(small) is not None
    del small
    gc.collect()
    assert ref() is not None  # remembered
    forget_views()
    gc.collect()
    assert ref() is None
    assert _tensors._last[0] is None and _tensors._prev[0] is None


def test_plain_views_are_the_tensors_memory_in_order():
    like = np.zeros(4, np.float32)
    ts = [torch.full((2, 2), float(i)) for i in range(3)]
    views = _tensors.plain_views(ts, like)
    assert views is not None and len(views) == 3
    for i, (t, v) in enumerate(zip(ts, views)):
        assert v.shape == (2, 2) and (v == i).all()
        v[0, 0] = 100 + i  # written through to the tensor
        assert t[0, 0].item() == 100 + i
    assert _tensors.plain_views(tuple(ts), like) is not None


@pytest.mark.parametrize("odd", ["dtype", "size", "strided", "grad", "not a tensor",
                                 "not a list"])
def test_plain_views_refuse_what_the_general_path_must_check(odd):
    like = np.zeros(4, np.float32)
    ts = [torch.zeros(4) for _ in range(3)]
    if odd == "dtype":
        ts[1] = torch.zeros(4, dtype=torch.float64)
    elif odd == "size":
        ts[2] = torch.zeros(5)
    elif odd == "strided":
        ts[1] = torch.zeros(8)[::2]
    elif odd == "grad":
        ts[0] = torch.zeros(4, requires_grad=True)
    elif odd == "not a tensor":
        ts[1] = np.zeros(4, np.float32)
    if odd == "not a list":
        ts = iter(ts)
    assert _tensors.plain_views(ts, like) is None


# ---------------------------------------------------------------- a learner's lists


def _lists_write_through(lv, ts) -> None:
    """The kept views are ts' memory, in order."""
    assert lv is not None and len(lv.views) == len(ts)
    for i, (v, t) in enumerate(zip(lv.flat, ts)):
        v[:] = 10 * i + np.arange(v.size, dtype=v.dtype)
        assert np.array_equal(t.numpy().reshape(-1), v)


def test_a_learners_list_is_viewed_once_and_given_again():
    like = np.zeros(4, np.float32)
    ts = [torch.zeros(4) for _ in range(3)]
    lv = _tensors.list_views(ts, like)
    _lists_write_through(lv, ts)
    assert _tensors.list_views(ts, like) is lv
    assert _tensors.list_views(tuple(ts), like) is lv  # the same tensors in a tuple
    assert lv.rows.shape == (3, 4) and lv.packed.base is lv.rows
    # new views of one batch's memory every step (list(batch.unbind())): kept too
    batch = torch.zeros(3, 4)
    first = _tensors.list_views(list(batch.unbind()), like)
    again = list(batch.unbind())
    assert _tensors.list_views(again, like) is first
    _lists_write_through(first, again)
    assert _tensors.list_views(ts, like) is lv  # both lists kept


def test_a_list_of_one_batchs_rows_is_used_in_place():
    like = np.zeros(4, np.float32)
    batch = torch.zeros(3, 4)
    lv = _tensors.list_views(list(batch.unbind()), like)
    assert lv.in_place and np.shares_memory(lv.rows, batch.numpy())
    lv.rows[...] = np.arange(12).reshape(3, 4)  # what a gather lands
    lv.land()
    assert batch.numpy().reshape(-1).tolist() == list(range(12))
    batch.add_(1)
    assert lv.pack().tolist() == list(range(1, 13))  # what a scatter's root sends
    # every other row of a batch: not one after another, copied through rows
    big = torch.zeros(6, 4)
    gapped = _tensors.list_views(list(big[::2].unbind()), like)
    assert not gapped.in_place and not np.shares_memory(gapped.rows, big.numpy())
    gapped.rows[...] = 7
    gapped.land()
    assert bool(big[::2].eq(7).all()) and bool(big[1::2].eq(0).all())
    assert gapped.pack().tolist() == [7.0] * 12


LIST_CHANGES = {  # each makes one tensor of a kept list other memory or not plain
    "replaced": lambda ts: ts.__setitem__(1, torch.zeros(4)),
    "set_": lambda ts: ts[1].set_(torch.zeros(4).untyped_storage(), 0, (4,)),
    "data": lambda ts: setattr(ts[2], "data", torch.zeros(4)),
    "shrink": lambda ts: ts[0].resize_(2),
    "data_dtype": lambda ts: setattr(ts[0], "data", ts[0].view(torch.int32)),
    "as_strided_": lambda ts: ts[1].as_strided_((2,), (2,)),
    "requires_grad_": lambda ts: ts[2].requires_grad_(True),
    "reordered": lambda ts: ts.reverse(),
    "shorter": lambda ts: ts.pop(),
    "parameter": lambda ts: ts.__setitem__(0, torch.nn.Parameter(ts[0], requires_grad=False)),
    "negative view": lambda ts: ts.__setitem__(1, torch._neg_view(ts[1])),
}
ONE_ELEMENT_LIST_CHANGES = {  # lists of one-element tensors: contiguity is not asked
    "set_": lambda ts: ts[1].set_(torch.zeros(1).untyped_storage(), 0, (1,)),
    "as_strided_ offset": lambda ts: ts[0].as_strided_((1,), (5,), 1),
    "shrink": lambda ts: ts[2].resize_(0),
    "data_dtype": lambda ts: setattr(ts[0], "data", ts[0].view(torch.int32)),
    "requires_grad_": lambda ts: ts[1].requires_grad_(True),
}


@pytest.mark.parametrize("change", sorted(ONE_ELEMENT_LIST_CHANGES))
def test_a_changed_list_of_one_element_tensors_is_viewed_afresh(change):
    like = np.zeros(1, np.float32)
    batch = torch.zeros(3, 2)
    ts = [row[:1] for row in batch.unbind()]
    lv = _tensors.list_views(ts, like)
    assert _tensors.list_views(ts, like) is lv
    ONE_ELEMENT_LIST_CHANGES[change](ts)
    now = _tensors.list_views(ts, like)
    assert now is not lv
    if now is not None:
        _lists_write_through(now, ts)


@pytest.mark.parametrize("change", sorted(LIST_CHANGES))
def test_a_changed_list_is_viewed_afresh(change):
    like = np.zeros(4, np.float32)
    ts = [torch.zeros(4) for _ in range(3)]
    lv = _tensors.list_views(ts, like)
    LIST_CHANGES[change](ts)
    now = _tensors.list_views(ts, like)
    assert now is not lv
    if now is not None:  # still plain tensors of 4 float32 each: their own memory
        _lists_write_through(now, ts)
    else:
        assert _tensors.plain_views(ts, like) is None


def test_a_conjugate_view_of_a_kept_list_is_viewed_afresh():
    like = np.zeros(2, np.complex64)
    ts = [torch.full((2,), 1 + 2j, dtype=torch.complex64) for _ in range(2)]
    lv = _tensors.list_views(ts, like)
    assert lv is not None
    conj = [t.conj() for t in ts]  # the same memory, read conjugated
    assert _tensors.list_views(conj, like) is None  # numpy() refuses: the general path


def test_lists_kept_are_few_and_forgotten():
    like = np.zeros(1, np.int64)
    lists = [[torch.zeros(1, dtype=torch.int64)] for _ in range(_tensors.KEEP_LISTS + 1)]
    ref = weakref.ref(lists[0][0])
    kept = [_tensors.list_views(ts, like) for ts in lists]
    assert _tensors.list_views(lists[-1], like) is kept[-1]
    assert _tensors.list_views(lists[0], like) is not kept[0]  # the oldest was dropped
    del kept, lists
    forget_views()
    gc.collect()
    assert ref() is None


def test_large_lists_are_not_kept():
    like = np.zeros(1 << 16, np.float32)  # 256 KiB a tensor
    n = _tensors.KEEP_BYTES // like.nbytes
    small = [torch.zeros(1 << 16) for _ in range(n)]
    assert _tensors.list_views(small, like) is not None  # KEEP_BYTES in all: kept
    big = [torch.zeros(1 << 16) for _ in range(n + 1)]
    ref = weakref.ref(big[0])
    assert _tensors.list_views(big, like) is None
    assert _tensors.plain_views(big, like) is not None  # the general path's views
    del big
    gc.collect()
    assert ref() is None
