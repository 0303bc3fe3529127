"""minidist.scan's schedules in the simulator: MPI_Scan's and MPI_Exscan's results for
every op and dtype at N = 1..17, checked against numpy's own accumulate."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from minidist import ReduceOp, ops
from minidist.algorithms import ALGORITHMS, simulator, verify
from minidist.algorithms.cost import lower_bounds

pytestmark = pytest.mark.timeout(120)

UFUNC = {ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum,
         ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
         ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}
DTYPES = [np.dtype(d) for d in ops.DTYPES]


def inputs(n: int, count: int, dtype: np.dtype, op: ReduceOp, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return [rng.integers(0, 2, count).astype(bool) for _ in range(n)]
    # small integers: exact in every dtype and in any order of folding (a PRODUCT of
    # 17 factors stays exact only with factors of -1 and 1)
    if op == ReduceOp.PRODUCT:
        vals = rng.choice([-1, 1] if dtype.kind in "ifc" else [1], (n, count))
    else:
        vals = rng.integers(0 if dtype.kind == "u" else -3, 4, (n, count))
    return [v.astype(dtype) for v in vals]


def reference(xs: list[np.ndarray], op: ReduceOp, exclusive: bool) -> list[np.ndarray]:
    acc = UFUNC[op].accumulate(np.stack(xs), axis=0, dtype=xs[0].dtype)
    if not exclusive:
        return list(acc)
    first = np.full(xs[0].shape, ops.identity(op, xs[0].dtype), xs[0].dtype)
    return [first, *acc[:-1]]


def defined(op: ReduceOp, dt: np.dtype) -> bool:
    try:
        ops.check_op(op, dt)
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("collective", ["scan", "exscan"])
@pytest.mark.parametrize("algorithm", ["recursive_doubling", "linear"])
def test_every_op_and_dtype_at_1_to_17_ranks(collective, algorithm):
    exclusive = collective == "exscan"
    cases = 0
    for n in range(1, 18):
        for op in UFUNC:
            for dt in DTYPES:
                if not defined(op, dt):
                    continue
                xs = inputs(n, 5, dt, op, seed=n * 100 + int(op))
                got = simulator.simulate(collective, algorithm, xs, op)
                want = reference(xs, op, exclusive)
                for r in range(n):
                    assert np.array_equal(got[r], want[r]), (collective, algorithm, n, op,
                                                             dt, r, got[r], want[r])
                cases += 1
    assert cases > 17 * 40


@pytest.mark.parametrize("collective", ["scan", "exscan"])
def test_verify_holds_for_every_algorithm_and_count(collective):
    for algorithm in ALGORITHMS[collective]:
        report = verify(collective, algorithm, sizes=range(1, 18))
        assert report.failure is None, str(report)


def test_avg_is_refused():
    with pytest.raises(ValueError, match="AVG"):
        simulator.simulate("scan", "linear", [np.ones(2)] * 3, ReduceOp.AVG)


def test_identity_of_every_op_is_an_identity():
    for op in UFUNC:
        for dt in DTYPES:
            if not defined(op, dt):
                continue
            e = np.full(3, ops.identity(op, dt), dt)
            y = inputs(1, 3, dt, ReduceOp.SUM, 7)[0]
            assert np.array_equal(UFUNC[op](e, y).astype(dt), y), (op, dt)


def test_cost_model_and_algo_check_know_scan():
    assert lower_bounds("scan", 8, 1 << 20)["bandwidth"] > 0
    p = subprocess.run([sys.executable, "-m", "minidist", "algo", "check", "scan",
                        "recursive_doubling", "-n", "1-9"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "holds" in p.stdout
