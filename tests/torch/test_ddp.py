"""DistributedDataParallel on minidist ends where it ends on gloo."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from .jobs import SCRIPTS, run_spawned  # noqa: E402

N = 3


@pytest.mark.timeout(200)
def test_ddp_same_parameters_as_gloo(tmp_path):
    for mode in ("gloo", "minidist", "dropin"):
        for r, p in enumerate(run_spawned(N, SCRIPTS / "ddp.py", mode, str(tmp_path))):
            assert p.returncode == 0, (mode, r, p.stdout[-2000:], p.stderr[-4000:])
    ref = np.load(tmp_path / "gloo_rank0.npy")
    for mode in ("gloo", "minidist", "dropin"):
        for r in range(N):
            got = np.load(tmp_path / f"{mode}_rank{r}.npy")
            # the ranks agree with each other exactly, and with gloo within rounding
            assert np.array_equal(got, np.load(tmp_path / f"{mode}_rank0.npy")), (mode, r)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=f"{mode} {r}")
