"""The adapter in one process: tensor views, reduce ops, a world of one through the
drop-in module and through the registered backend, and the clear errors."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as tdist  # noqa: E402

import minidist  # noqa: E402
import minidist.torch as dist  # noqa: E402
from minidist.torch import _collectives, _tensors  # noqa: E402

from ..processes.harness import LAUNCH_VARS, ROOT  # noqa: E402


@pytest.fixture
def no_launcher(monkeypatch):
    for var in (*LAUNCH_VARS, "MINIDIST_ADDR", "MINIDIST_TIMEOUT", "GROUP_RANK", "NODE_RANK"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def world_of_one(no_launcher):
    dist.init_process_group("gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()
    assert not minidist.is_initialized() and not tdist.is_initialized()


def test_import_minidist_does_not_import_torch():
    code = "import sys, minidist; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ---------------------------------------------------------------------- tensors


def test_contiguous_tensors_are_viewed_not_copied():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    arr, post = _tensors.as_output(t, "x")
    assert post is None and np.shares_memory(arr, t.numpy())
    arr[0, 0] = 42
    assert t[0, 0] == 42
    assert np.shares_memory(_tensors.as_input(t[1], "x"), t.numpy())


def test_bfloat16_moves_as_raw_bits_and_reduces_in_float32():
    t = torch.tensor([1.5, -2.25, 3.0e38], dtype=torch.bfloat16)
    raw, post = _tensors.as_output(t, "x")
    assert post is None and raw.dtype == np.int16
    assert np.array_equal(raw, t.view(torch.int16).numpy())
    f, post = _tensors.as_output(t, "x", reduce=True)
    assert f.dtype == np.float32 and np.array_equal(f, t.float().numpy())
    f[:] = [1.0 + 2 ** -9, 2.0, 4.0]  # 1 + 2**-9 rounds to 1 in bfloat16 (to nearest even)
    post()
    assert t.tolist() == [1.0, 2.0, 4.0]


def test_non_contiguous_tensors_are_copied_in_and_out():
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    t = base.t()
    arr, post = _tensors.as_output(t, "x")
    assert arr.flags.c_contiguous and np.array_equal(arr, t.numpy())
    assert not np.shares_memory(arr, base.numpy())
    arr += 100
    post()
    assert torch.equal(base, torch.arange(12, dtype=torch.float64).reshape(3, 4) + 100)
    leaf = torch.zeros(2, 3, requires_grad=True).t()  # a view of a leaf requiring grad
    arr, post = _tensors.as_output(leaf, "x")
    arr[:] = 1
    post()
    assert leaf.detach().sum() == 6


def test_clear_errors_for_tensors_minidist_cannot_take():
    with pytest.raises(ValueError, match="overlapping"):
        _tensors.as_output(torch.zeros(3).expand(2, 3), "all_reduce")
    assert _tensors.as_input(torch.zeros(3).expand(2, 3), "send").shape == (2, 3)
    with pytest.raises(ValueError, match="CPU tensors only"):
        _tensors.as_output(torch.zeros(3, device="meta"), "all_reduce")
    with pytest.raises(TypeError, match="torch.Tensor"):
        _tensors.as_output(np.zeros(3), "all_reduce")
    f8 = torch.zeros(4, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="cannot reduce"):
        _tensors.as_output(f8, "all_reduce", reduce=True)
    assert _tensors.as_output(f8, "broadcast")[0].dtype == np.uint8  # moved as bytes


def test_reduce_ops_map_by_name():
    R = minidist.ReduceOp
    assert _collectives.to_op(tdist.ReduceOp.MAX) is R.MAX
    assert _collectives.to_op(tdist.ReduceOp(tdist.ReduceOp.BXOR)) is R.BXOR
    assert _collectives.to_op(dist.ReduceOp.AVG) is R.AVG
    assert _collectives.to_op("product") is R.PRODUCT
    with pytest.raises(NotImplementedError, match="PREMUL_SUM"):
        _collectives.to_op(tdist._make_nccl_premul_sum(2.0))
    with pytest.raises(ValueError, match="unsupported reduce op"):
        _collectives.to_op("median")


# ---------------------------------------------------------------------- a world of one


def test_gpu_backends_raise_clearly(no_launcher):
    with pytest.raises(NotImplementedError, match="CPU"):
        dist.init_process_group("nccl")
    assert not minidist.is_initialized()
    assert dist.is_available() and not dist.is_nccl_available()


def test_world_of_one_drop_in(world_of_one):
    assert (dist.get_rank(), dist.get_world_size(), dist.is_initialized()) == (0, 1, True)
    assert dist.get_backend() == "minidist"
    assert tdist.is_initialized() and tdist.get_backend() == "minidist"  # torch's mirror
    with pytest.raises(ValueError, match="twice"):
        dist.init_process_group("gloo")

    t = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t()
    dist.all_reduce(t, op=tdist.ReduceOp.MAX)
    assert torch.equal(t, torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t())
    w = dist.all_reduce(torch.ones(3), async_op=True)
    fut = w.get_future()
    assert isinstance(fut, torch.Future)
    assert fut.then(lambda f: f.value()[0].sum().item()).wait() == 3.0
    assert w.wait() and w.is_completed() and w.is_success()

    outs = [torch.empty(2, dtype=torch.int64)]
    dist.all_gather(outs, torch.tensor([4, 5]))
    assert outs[0].tolist() == [4, 5]
    out = torch.empty(3)
    dist.all_to_all_single(out, torch.tensor([1.0, 2.0, 3.0]), [3], [3])
    assert out.tolist() == [1.0, 2.0, 3.0]
    objs = [None]
    dist.all_gather_object(objs, {"a": 1})
    assert objs == [{"a": 1}]

    g = dist.new_group([0])
    assert dist.get_process_group_ranks(g) == [0] and dist.get_group_rank(g, 0) == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dist.all_reduce(torch.ones(1), group=tdist.GroupMember.NON_GROUP_MEMBER) is None
    assert "does not belong" in str(caught[0].message)
    assert dist.get_rank(dist.GroupMember.NON_GROUP_MEMBER) == -1

    t = torch.ones(2)
    tdist.all_reduce(t)  # torch.distributed itself, on the same session
    assert t.tolist() == [1.0, 1.0]

    with pytest.raises(ValueError, match="no other rank"):
        dist.recv(torch.zeros(1))  # from any source, in a world of one
    with pytest.raises(ValueError, match="itself"):
        dist.send(torch.zeros(1), dst=0)
    with pytest.raises(NotImplementedError, match="PREMUL_SUM"):
        dist.all_reduce(torch.ones(1), op=tdist._make_nccl_premul_sum(2.0))
    with pytest.raises(ValueError, match="Must specify"):
        dist.broadcast(torch.ones(1))
    with pytest.raises(ValueError, match="CPU tensors only"):
        dist.all_reduce(torch.ones(1, device="meta"))
    with pytest.raises(TypeError, match="another torch.distributed backend"):
        dist.all_reduce(torch.ones(1), group=tdist.ProcessGroup(0, 1))


def test_world_of_one_registered_backend(no_launcher):
    tdist.init_process_group("minidist", store=tdist.HashStore(), rank=0, world_size=1)
    try:
        assert minidist.is_initialized() and tdist.get_backend() == "minidist"
        t = torch.tensor([1.0, 2.0])
        work = tdist.all_reduce(t, async_op=True)
        assert work.get_future().wait() == [t]
        g = tdist.new_group([0], backend="minidist")
        assert isinstance(g, dist.ProcessGroupMinidist) and g.size() == 1
        out = torch.empty(2)
        tdist.all_gather_single(out, torch.tensor([7.0, 8.0]), group=g)
        assert out.tolist() == [7.0, 8.0]
        dist.all_reduce(t, group=g)  # the drop-in module takes the backend's groups
    finally:
        tdist.destroy_process_group()
    assert not minidist.is_initialized()  # the session began with this group, ends with it
