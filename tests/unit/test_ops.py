"""ops.reduce_all_into: the rank-order reduction that every fast-path rank computes."""

import numpy as np
import pytest

from minidist import ops
from minidist.ops import ReduceOp


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MAX])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_parts_are_reduced_in_their_order_bit_for_bit(op, n):
    rng = np.random.default_rng(n)
    parts = [rng.standard_normal(1000).astype(np.float32) for _ in range(n)]
    want = parts[0].copy()
    ufunc = {ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MAX: np.maximum}
    for p in parts[1:]:
        want = ufunc[op](want, p)
    out = np.empty_like(parts[0])
    ops.reduce_all_into(op, out, parts)
    assert out.tobytes() == want.tobytes()
    if n > 1:  # out may be the first part (an in-place call)
        first = parts[0].copy()
        ops.reduce_all_into(op, first, [first, *parts[1:]])
        assert first.tobytes() == want.tobytes()


def test_check_op_remembers_only_what_passed():
    for _ in range(2):  # the second time from what the first one remembered
        ops.check_op(ReduceOp.SUM, np.dtype(np.int32))
        ops.check_op(ReduceOp.BAND, np.int64)
        with pytest.raises(TypeError, match="BAND needs an integer"):
            ops.check_op(ReduceOp.BAND, np.dtype(np.float32))
        with pytest.raises(TypeError, match="AVG needs a floating-point"):
            ops.check_op(ReduceOp.AVG, np.dtype(np.int32))
        with pytest.raises(ValueError):
            ops.check_op(99, np.dtype(np.int32))
