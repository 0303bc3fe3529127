"""minidist.torch, torch.distributed with the "minidist" backend, and torch's own gloo
give the same outputs for every collective and point-to-point call, in world sizes 2 to
5 and in float32, float64, int64, bfloat16 and float16.

One job per world size runs every call and dtype through the three paths in a row
(``scripts/differential.py``); the test compares what the ranks saved. Integers,
min/max and every call that only moves data must be bit-identical; float sums and
products agree within rounding (gloo adds bfloat16 and float16 step by step in their own
precision, minidist adds bfloat16 in float32 and rounds once).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from .jobs import SCRIPTS, run_minidist  # noqa: E402

# (rtol, atol) for sums and products of values in [-1, 1] (products: [0.5, 1.5])
TOLERANCE = {"float32": (1e-5, 1e-6), "float64": (1e-12, 1e-12), "float16": (5e-3, 5e-3),
             "bfloat16": (3e-2, 3e-2)}
ROUNDED = ("SUM", "PRODUCT", "/reduce_scatter", "/reduce")  # float results that may round


def rounded(key: str) -> bool:
    dtype = key.split("/")[0]
    if dtype not in TOLERANCE or key.endswith("max") or "MAX" in key or "MIN" in key:
        return False
    return any(part in key for part in ROUNDED)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_same_outputs_as_gloo(tmp_path, n):
    job = run_minidist(n, SCRIPTS / "differential.py", str(tmp_path))
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-5000:]
    compared = 0
    for rank in range(n):
        ref = dict(np.load(tmp_path / f"gloo_rank{rank}.npz"))
        assert len(ref) > 90
        for path in ("minidist", "backend"):
            got = dict(np.load(tmp_path / f"{path}_rank{rank}.npz"))
            assert sorted(got) == sorted(ref), (path, rank)
            for key, want in ref.items():
                have = got[key]
                where = f"{path} rank {rank} {key}"
                assert have.dtype == want.dtype and have.shape == want.shape, where
                if rounded(key):
                    rtol, atol = TOLERANCE[key.split("/")[0]]
                    np.testing.assert_allclose(have, want, rtol=rtol, atol=atol,
                                               err_msg=where)
                else:
                    assert np.array_equal(have, want), (where, have, want)
                compared += 1
    assert compared >= 2 * n * 90
