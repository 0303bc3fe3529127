"""Helpers of the stress scripts: each rank's data for a call, and one all_reduce checked
bit for bit against the reduction in rank order (a strided view every fifth call)."""

import numpy as np

import minidist


def data(r: int, i: int, count: int, dt: np.dtype) -> np.ndarray:
    """Rank ``r``'s vector for call ``i``: the same on every rank that computes it."""
    rng = np.random.default_rng(1000 * i + r)
    if dt.kind == "f":
        return rng.standard_normal(count).astype(dt)
    return rng.integers(-50, 50, count).astype(dt)


_UFUNC = {minidist.ReduceOp.SUM: np.add, minidist.ReduceOp.MAX: np.maximum,
          minidist.ReduceOp.PRODUCT: np.multiply, minidist.ReduceOp.AVG: np.add}


def expected(members: list[int], i: int, count: int, dt: np.dtype,
             op: minidist.ReduceOp) -> np.ndarray:
    """Call ``i``'s data of ``members`` reduced in rank order (AVG: then divided)."""
    want = data(members[0], i, count, dt)
    for r in members[1:]:
        want = _UFUNC[op](want, data(r, i, count, dt))
    if op == minidist.ReduceOp.AVG:
        want = want / np.asarray(len(members), dt)
    return want


def check(i: int, mine: np.ndarray, want: np.ndarray, op: minidist.ReduceOp,
          group) -> None:
    """all_reduce ``mine`` (through a strided view when ``i % 5 == 0``) and assert that
    the result is ``want``, bit for bit, and a strided view's gaps are untouched."""
    count, dt = mine.size, mine.dtype
    if i % 5 == 0:  # a strided view: reduced through a copy, written back
        x = np.zeros(2 * count, dt)
        x[::2] = mine
        minidist.all_reduce(x[::2], op=op, group=group)
        got = x[::2]
        assert (x[1::2] == 0).all(), f"call {i}: the gaps of a strided array were written"
    else:
        got = mine
        minidist.all_reduce(got, op=op, group=group)
    if dt.kind == "f":
        same = got.tobytes() == want.tobytes()
    else:
        same = np.array_equal(got, want)
    assert same, f"call {i} ({mine.nbytes} B of {dt}, {op.name}): " \
                 f"{np.flatnonzero(got != want)[:5]}"
