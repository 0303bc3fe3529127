"""Dtypes on the three paths: NCCL lowerings, GPU reductions (run here on the CPU),
host staging dtypes (as minidist.torch moves CPU tensors)."""

from __future__ import annotations

import numpy as np
import pytest

from minidist import ReduceOp
from minidist_native import _dtypes as D
from minidist_native import _nccl as N

from .conftest import torch

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("dtype,op,kind,as_dtype,nccl_op", [
    (torch.float32, ReduceOp.SUM, "direct", torch.float32, N.SUM),
    (torch.bfloat16, ReduceOp.AVG, "direct", torch.bfloat16, N.AVG),
    (torch.int64, ReduceOp.MIN, "direct", torch.int64, N.MIN),
    (torch.bool, ReduceOp.SUM, "view", torch.uint8, N.MAX),
    (torch.bool, ReduceOp.PRODUCT, "view", torch.uint8, N.MIN),
    (torch.bool, ReduceOp.BOR, "view", torch.uint8, N.MAX),
    (torch.bool, ReduceOp.BXOR, "gather", torch.bool, -1),
    (torch.complex64, ReduceOp.SUM, "view", torch.float32, N.SUM),
    (torch.complex128, ReduceOp.AVG, "view", torch.float64, N.AVG),
    (torch.complex64, ReduceOp.PRODUCT, "gather", torch.complex64, -1),
    (torch.int16, ReduceOp.SUM, "widen", torch.int32, N.SUM),
    (torch.int32, ReduceOp.BXOR, "gather", torch.int32, -1),
])
def test_nccl_lowerings(dtype, op, kind, as_dtype, nccl_op):
    low = D.lower(op, dtype)
    assert (low.kind, low.as_dtype, low.nccl_op) == (kind, as_dtype, nccl_op)
    if kind in ("direct", "view", "widen"):
        assert low.nccl_dtype == D.NCCL_DTYPES[as_dtype]


def test_lowered_tensors_share_memory_where_they_can():
    t = torch.tensor([True, False])
    v = D.as_lowered(t, D.lower(ReduceOp.SUM, torch.bool))
    assert v.dtype == torch.uint8 and v.data_ptr() == t.data_ptr()
    c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    r = D.as_lowered(c, D.lower(ReduceOp.SUM, c.dtype))
    assert r.shape == (2, 2) and r.data_ptr() == c.data_ptr()
    w = D.as_lowered(torch.tensor([-3, 7], dtype=torch.int16),
                     D.lower(ReduceOp.SUM, torch.int16))
    assert w.dtype == torch.int32 and w.tolist() == [-3, 7]


@pytest.mark.parametrize("op,dtype,message", [
    (ReduceOp.BAND, torch.float32, "needs an integer or bool"),
    (ReduceOp.AVG, torch.int32, "AVG needs a floating-point"),
    (ReduceOp.MAX, torch.complex64, "not defined on complex"),
])
def test_undefined_reductions_are_type_errors(op, dtype, message):
    with pytest.raises(TypeError, match=message):
        D.check_reduce(op, dtype, "all_reduce")


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="no float8 in this torch")
def test_float8_moves_but_does_not_reduce():
    with pytest.raises(TypeError, match="can only be moved"):
        D.lower(ReduceOp.SUM, torch.float8_e4m3fn)
    assert D.staging_dtype(torch.float8_e4m3fn, False) == torch.uint8


NP = {torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16,
      torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32,
      torch.float64: np.float64, torch.bool: np.bool_}
NP_OP = {ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum,
         ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
         ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}


@pytest.mark.parametrize("dtype", list(NP))
@pytest.mark.parametrize("op", list(NP_OP))
def test_gpu_reductions_match_numpy(dtype, op):
    try:
        D.check_reduce(op, dtype, "x")
    except TypeError:
        pytest.skip("not defined")
    rng = np.random.default_rng(5)
    parts = [rng.integers(-9 if dtype not in (torch.uint8, torch.bool) else 0, 9, 50)
             .astype(NP[dtype]) for _ in range(4)]
    want = parts[0].copy()
    for p in parts[1:]:
        want = NP_OP[op](want, p)
    out = torch.empty(50, dtype=dtype)
    D.reduce_into(out, [torch.from_numpy(p) for p in parts], op)
    np.testing.assert_array_equal(out.numpy(), want)


def test_half_floats_accumulate_in_float32_and_round_once():
    # 2048 + 1 + 1 in float16 step by step stays 2048; in float32 then rounded: 2050
    parts = [torch.tensor([2048.0], dtype=torch.float16), torch.tensor([1.0], dtype=torch.float16),
             torch.tensor([1.0], dtype=torch.float16)]
    out = torch.empty(1, dtype=torch.float16)
    D.reduce_into(out, parts, ReduceOp.SUM)
    assert out.item() == 2050.0
    avg = torch.empty(1, dtype=torch.bfloat16)
    D.reduce_into(avg, [torch.tensor([1.0], dtype=torch.bfloat16)] * 3 +
                  [torch.tensor([5.0], dtype=torch.bfloat16)], ReduceOp.AVG)
    assert avg.item() == 2.0


def test_staging_dtypes_follow_minidist_torch():
    assert D.staging_dtype(torch.bfloat16, True) == torch.float32
    assert D.staging_dtype(torch.bfloat16, False) == torch.int16
    assert D.staging_dtype(torch.float16, True) == torch.float16
    assert D.staging_dtype(torch.bool, False) == torch.bool
    assert D.staging_dtype(torch.complex64, True) == torch.complex64
    assert D.converts(torch.bfloat16, True) and not D.converts(torch.bfloat16, False)
