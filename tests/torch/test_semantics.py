"""What gloo cannot serve as a reference for: uneven all_to_all, member-only groups,
calls in flight, Future callbacks, mismatch errors, monitored_barrier (3 ranks)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from .jobs import SCRIPTS, free_port, run_minidist, run_spawned  # noqa: E402

CHECKS = ("uneven_all_to_all", "groups_of_members_only", "any_source", "async_out_of_order",
          "future_callbacks", "mismatch_detected", "monitored_barrier", "destroyed")


@pytest.mark.timeout(150)
def test_semantics_three_ranks():
    job = run_minidist(3, SCRIPTS / "semantics.py")
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-5000:]
    for check in CHECKS:
        assert f"OK {check}" in job.stdout, (check, job.stdout[-3000:])


@pytest.mark.timeout(150)
def test_init_methods_and_every_dtype(tmp_path):
    results = run_spawned(3, SCRIPTS / "init_methods.py", str(free_port()), str(free_port()),
                          str(tmp_path))
    for r, p in enumerate(results):
        assert p.returncode == 0, (r, p.stdout[-2000:], p.stderr[-4000:])
        assert "init methods ok" in p.stdout
