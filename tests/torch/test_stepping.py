"""RL stepping with torch tensors (scatter + gather, recv_many) and recv_many in
minidist.aio."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from .jobs import run_minidist  # noqa: E402

SCRIPT = __import__("pathlib").Path(__file__).parent / "scripts" / "stepping.py"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("front", ["torch", "aio"])
def test_stepping_through_the_front_ends_is_exact(front):
    done = run_minidist(4, SCRIPT, front, timeout=150)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "STEPPING OK" in done.stdout
