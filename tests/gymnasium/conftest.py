"""What the vector-env tests share: the check that a test left nothing behind."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest


def shm_names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("minidist")}


@pytest.fixture
def no_leftovers(monkeypatch):
    """The test leaves no child process behind, and no name in /dev/shm of the jobs of
    the vector envs it made."""
    from minidist.gymnasium import _job

    jobs = []
    start = _job.Job.__init__

    def recorded(self, *args, **kwargs):
        start(self, *args, **kwargs)
        jobs.append(self.door.job)

    monkeypatch.setattr(_job.Job, "__init__", recorded)
    before = {p.pid for p in multiprocessing.active_children()}

    def ours() -> list:
        return [p for p in multiprocessing.active_children() if p.pid not in before]

    yield
    deadline = time.monotonic() + 10
    while ours() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not ours()
    left = {n for n in shm_names() for j in jobs if n.startswith(f"minidist-{j}-")}
    assert not left
