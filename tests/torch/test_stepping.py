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


LISTS = SCRIPT.parent / "learner_lists.py"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["kill", "stop"])
def test_a_learners_kept_lists_under_a_killed_or_stopped_worker(mode):
    """learner_lists.py: a killed worker is named by the learner's gather and by every
    other worker; a stopped one, resumed, leaves every value right."""
    t0 = __import__("time").monotonic()
    done = run_minidist(5, LISTS, mode, timeout=120)
    took = __import__("time").monotonic() - t0
    if mode == "stop":
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert "LISTS OK" in done.stdout
        return
    lost = [line for line in done.stdout.splitlines() if "LOST " in line]
    assert any("LOST 0 [4] at step 60" in line for line in lost), \
        done.stdout[-2000:] + done.stderr[-3000:]
    assert len(lost) == 4, done.stdout[-2000:] + done.stderr[-3000:]  # every survivor
    assert took < 60, took  # named within seconds, not after the 60 s timeout
