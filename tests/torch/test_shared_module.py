"""minidist.torch.share_module: the workers' models read the learner's published
weights in place."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from .jobs import SCRIPTS, run_minidist  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def test_workers_run_the_learners_latest_weights_in_place():
    r = run_minidist(3, SCRIPTS / "shared_module.py", "basic")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.count("SHARED MODULE OK") == 3


def test_different_models_raise_on_every_rank():
    r = run_minidist(3, SCRIPTS / "shared_module.py", "mismatch")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.count("MISMATCH OK") == 3
