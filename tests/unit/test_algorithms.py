"""Every algorithm of every collective against a numpy reference, in the simulator."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minidist import collectives, ops
from minidist.algorithms import ALGORITHMS, REDUCING, ROOTED, make_schedule
from minidist.algorithms.simulator import check_out_contract, first_out_writes, simulate
from minidist.ops import ReduceOp, finish

SIZES = range(1, 18)
CASES = [(c, a) for c, algos in ALGORITHMS.items() for a in algos]
BLOCKED = ("reduce_scatter", "all_to_all", "scatter")  # inputs of count * size elements


# --------------------------------------------------------------------------- reference
_UFUNC = {
    ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor,
}


def reference(collective: str, inputs: list[np.ndarray], op: ReduceOp, root: int
              ) -> list[np.ndarray]:
    """What each rank's out must hold, computed directly with numpy."""
    n = len(inputs)
    flat = [np.asarray(x).reshape(-1) for x in inputs]

    def fold() -> np.ndarray:
        total = functools.reduce(lambda a, b: _UFUNC[op](a, b), flat[1:], flat[0].copy())
        total = np.asarray(total, flat[0].dtype).copy()
        finish(op, total, n)
        return total

    if collective == "all_reduce":
        total = fold()
        return [total] * n
    if collective == "reduce":
        return [fold() if r == root else flat[r] for r in range(n)]
    if collective == "reduce_scatter":
        c = flat[0].size // n
        total = fold()
        return [total[r * c:(r + 1) * c] for r in range(n)]
    if collective == "broadcast":
        return [flat[root]] * n
    if collective == "all_gather":
        return [np.concatenate(flat)] * n
    if collective == "gather":
        empty = flat[0][:0]
        return [np.concatenate(flat) if r == root else empty for r in range(n)]
    if collective == "scatter":
        c = flat[root].size // n
        return [flat[root][r * c:(r + 1) * c] for r in range(n)]
    if collective == "all_to_all":
        c = flat[0].size // n
        return [np.concatenate([flat[j][r * c:(r + 1) * c] for j in range(n)])
                for r in range(n)]
    if collective == "barrier":
        return [flat[0][:0]] * n
    if collective in ("scan", "exscan"):  # prefix folds; exscan's rank 0: the identity
        acc = _UFUNC[op].accumulate(np.stack(flat), axis=0, dtype=flat[0].dtype)
        if collective == "scan":
            return list(acc)
        return [np.full(flat[0].size, ops.identity(op, flat[0].dtype)), *acc[:-1]]
    raise AssertionError(collective)


def make_inputs(collective: str, size: int, count: int, rng: np.random.Generator,
                dtype: object = np.int64) -> list[np.ndarray]:
    per_rank = count * size if collective in BLOCKED else count
    if collective == "barrier":
        per_rank = 0
    return [rng.integers(-1000, 1000, per_rank).astype(dtype) for _ in range(size)]


def counts_for(size: int) -> list[int]:
    return sorted({0, 1, size - 1, size, size + 1, 3 * size + 2, 2 * size + 11})


def roots_for(collective: str, size: int) -> list[int]:
    return sorted({0, size - 1, size // 2}) if collective in ROOTED else [0]


def assert_same(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), what
    for r, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what} rank {r}: {g!r} vs {w!r}"
        if g.dtype.kind in "fc":
            np.testing.assert_array_equal(g, w, err_msg=f"{what} rank {r}")
        else:
            assert np.array_equal(g, w), f"{what} rank {r}: {g} != {w}"


def assert_close_to_sum(got: np.ndarray, inputs: list[np.ndarray], mean: bool = False
                        ) -> None:
    """``got`` is within the worst-case rounding of summing ``inputs`` in any order."""
    stack = np.stack(inputs).astype(np.float64)
    want = stack.sum(axis=0)
    # Any summation order errs by at most (n-1) * eps * sum|x| (plus final rounding).
    bound = len(inputs) * float(np.finfo(got.dtype).eps) * (np.abs(stack).sum(axis=0) + 1)
    if mean:
        want, bound = want / len(inputs), bound / len(inputs) * 2
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= bound), f"error {err.max()} > bound"


# --------------------------------------------------------------------------- sweeps
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(("collective", "algorithm"), CASES)
def test_sweep_against_reference(collective: str, algorithm: str, size: int) -> None:
    """All sizes 1..17, counts 0, 1, n-1, n, n+1 and uneven, several roots; exact ints.

    Runs under rendezvous semantics (a Send completes only when matched), which is
    stricter than eager buffering: passing it means no transport buffering can
    deadlock the schedule.
    """
    rng = np.random.default_rng([size, len(collective), len(algorithm)])
    counts = [0] if collective == "barrier" else counts_for(size)
    for count in counts:
        for root in roots_for(collective, size):
            inputs = make_inputs(collective, size, count, rng)
            saved = [x.copy() for x in inputs]
            what = f"{collective}/{algorithm} n={size} count={count} root={root}"
            got = simulate(collective, algorithm, inputs, ReduceOp.SUM, root, rendezvous=True)
            assert_same(got, reference(collective, inputs, ReduceOp.SUM, root), what)
            assert all(np.array_equal(a, b) for a, b in zip(inputs, saved, strict=True))


@pytest.mark.parametrize(("collective", "algorithm"), CASES)
def test_eager_mode_matches(collective: str, algorithm: str) -> None:
    """The default (eager) message passing gives the same results."""
    rng = np.random.default_rng(7)
    for size in (1, 2, 3, 6, 8, 13):
        count = 0 if collective == "barrier" else 2 * size + 3
        root = size // 2 if collective in ROOTED else 0
        inputs = make_inputs(collective, size, count, rng)
        got = simulate(collective, algorithm, inputs, ReduceOp.SUM, root)
        assert_same(got, reference(collective, inputs, ReduceOp.SUM, root),
                    f"{collective}/{algorithm} n={size}")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", ALGORITHMS["all_reduce"])
def test_all_reduce_float_bit_identical(algorithm: str, size: int) -> None:
    """Real-valued float sums are not associative: ranks must still agree bit for bit."""
    rng = np.random.default_rng(size)
    for dtype in (np.float16, np.float32, np.float64):
        for count in (1, size + 1, 5 * size + 3):
            inputs = [rng.standard_normal(count).astype(dtype) for _ in range(size)]
            got = simulate("all_reduce", algorithm, inputs, ReduceOp.SUM)
            first = got[0].tobytes()
            assert all(g.tobytes() == first for g in got), f"n={size} {dtype} count={count}"
            assert_close_to_sum(got[0], inputs)


@pytest.mark.parametrize("algorithm", ALGORITHMS["all_reduce"])
def test_all_reduce_operand_order_is_the_same_on_every_rank(algorithm: str) -> None:
    """a+b == b+a for numbers, but not for NaN payloads, and min/max of +0 and -0 depend
    on operand order: ranks must combine the same operands in the same order."""
    for size in SIZES:
        count = 2 * size + 1
        zeros = [np.where(np.arange(count) % size == r, -0.0, 0.0) for r in range(size)]
        nans = [np.full(count, 0x7FF8000000000000 + r + 1, np.uint64).view(np.float64)
                for r in range(size)]
        for inputs, op in ((zeros, ReduceOp.MIN), (zeros, ReduceOp.MAX),
                           ([z[::-1].copy() for z in zeros], ReduceOp.MIN),
                           (nans, ReduceOp.SUM)):
            got = simulate("all_reduce", algorithm, inputs, op)
            assert len({g.tobytes() for g in got}) == 1, f"n={size} {op.name}"


# --------------------------------------------------------------------------- contract
# the out contract holds where every rank's result depends on every rank (not for scan)
REDUCING_CASES = [(c, a) for c, a in CASES if c in REDUCING and collectives.get(c).contract]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(("collective", "algorithm"), REDUCING_CASES)
def test_out_untouched_until_all_inputs_arrived(collective: str, algorithm: str,
                                                size: int) -> None:
    """Trace data dependencies: the first write of out comes after the rank has received
    data depending on every rank's input (and non-roots of reduce never write out)."""
    for count in counts_for(size):
        for root in roots_for(collective, size):
            schedules = [make_schedule(collective, algorithm, r, size, count, root)
                         for r in range(size)]
            check_out_contract(schedules)
            writes = first_out_writes(schedules)
            for r, w in enumerate(writes):
                writes_out = count > 0 and (collective != "reduce" or r == root)
                if size > 1 and writes_out:
                    assert w is not None, f"rank {r} never writes its result"
                if collective == "reduce" and r != root:
                    assert w is None


def test_reduce_leaves_non_root_arrays_alone() -> None:
    rng = np.random.default_rng(3)
    for size in (2, 5, 8, 11):
        inputs = [rng.standard_normal(9) for _ in range(size)]
        got = simulate("reduce", "binomial", inputs, ReduceOp.SUM, root=size - 1)
        for r in range(size - 1):
            assert got[r].tobytes() == inputs[r].tobytes()


# --------------------------------------------------------------------------- properties
INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOAT_DTYPES = ["float16", "float32", "float64"]
ALL_DTYPES = [*INT_DTYPES, *FLOAT_DTYPES, "bool"]


def ops_for(dtype: np.dtype) -> list[ReduceOp]:
    ops = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
    if dtype.kind in "biu":
        ops += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    if dtype.kind == "f":
        ops.append(ReduceOp.AVG)
    return ops


def exact_values(rng: np.random.Generator, dtype: np.dtype, op: ReduceOp,
                 shape: tuple[int, ...]) -> np.ndarray:
    """Values whose reduction is exact in any order, so results compare with ==."""
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if op in (ReduceOp.SUM, ReduceOp.AVG):  # small integers: every partial sum exact
        return rng.integers(-8, 9, shape).astype(dtype)
    if op == ReduceOp.PRODUCT:  # powers of two: every partial product exact
        return rng.choice(np.array([-2, -1, -0.5, 0.5, 1, 2]), shape).astype(dtype)
    # MIN / MAX: anything, with signed zeros and NaNs mixed in.
    vals = rng.standard_normal(shape).astype(dtype)
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf], dtype)
    mask = rng.random(shape) < 0.2
    vals[mask] = rng.choice(specials, int(mask.sum()))
    return vals


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_reducing_collectives_over_dtypes_ops_shapes(data: st.DataObject) -> None:
    collective = data.draw(st.sampled_from(sorted(REDUCING)), label="collective")
    algorithm = data.draw(st.sampled_from(ALGORITHMS[collective]), label="algorithm")
    size = data.draw(st.integers(1, 9), label="size")
    dtype = np.dtype(data.draw(st.sampled_from(ALL_DTYPES), label="dtype"))
    op = data.draw(st.sampled_from([o for o in ops_for(dtype)
                                    if o.name not in collectives.get(collective).refused_ops]),
                   label="op")
    root = data.draw(st.integers(0, size - 1), label="root") if collective in ROOTED else 0
    if collective == "reduce_scatter":
        shape: tuple[int, ...] = (size, *data.draw(
            st.lists(st.integers(0, 4), max_size=2), label="block shape"))
    else:
        shape = tuple(data.draw(st.lists(st.integers(0, 6), max_size=3), label="shape"))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    inputs = [exact_values(rng, dtype, op, shape) for _ in range(size)]

    got = simulate(collective, algorithm, inputs, op, root)
    want = reference(collective, inputs, op, root)
    assert_same(got, want, f"{collective}/{algorithm} {dtype} {op.name} n={size}")
    if collective == "all_reduce":
        assert len({g.tobytes() for g in got}) == 1, "ranks disagree bit for bit"


MOVING = [(c, a) for c, a in CASES if c not in REDUCING and c != "barrier"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_data_movement_is_bit_exact(data: st.DataObject) -> None:
    """broadcast, all_gather, gather, scatter, all_to_all copy bytes verbatim (NaN
    payloads, signed zeros and all)."""
    collective, algorithm = data.draw(st.sampled_from(MOVING), label="case")
    size = data.draw(st.integers(1, 10), label="size")
    dtype = np.dtype(data.draw(st.sampled_from(ALL_DTYPES), label="dtype"))
    root = data.draw(st.integers(0, size - 1), label="root") if collective in ROOTED else 0
    count = data.draw(st.integers(0, 3 * size + 2), label="count")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    n = count * size if collective in BLOCKED else count
    if dtype.kind == "b":
        inputs = [rng.integers(0, 2, n).astype(bool) for _ in range(size)]
    else:
        inputs = [rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype)
                  for _ in range(size)]
    got = simulate(collective, algorithm, inputs, ReduceOp.SUM, root)
    want = reference(collective, inputs, ReduceOp.SUM, root)
    for r, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.tobytes() == w.tobytes(), f"rank {r}"


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 12), count=st.integers(0, 40),
       dtype=st.sampled_from(FLOAT_DTYPES), seed=st.integers(0, 2**32 - 1),
       algorithm=st.sampled_from(ALGORITHMS["all_reduce"]))
def test_all_reduce_avg_of_real_floats(size: int, count: int, dtype: str, seed: int,
                                       algorithm: str) -> None:
    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(-1, 1, count).astype(dtype) for _ in range(size)]
    got = simulate("all_reduce", algorithm, inputs, ReduceOp.AVG)
    assert len({g.tobytes() for g in got}) == 1
    assert_close_to_sum(got[0], inputs, mean=True)
