"""segments.sweep_orphans: what a new launcher's sweep of every job's names removes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from minidist import segments

pytestmark = pytest.mark.skipif(not segments.available(), reason="no /dev/shm")


@pytest.fixture
def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_recent_name_of_a_dead_process_survives_another_jobs_sweep(dead_pid):
    name = f"minidist-testjob{os.getpid()}-57a5000000000001-{dead_pid}"
    path = os.path.join(segments.SHM_DIR, name)
    with open(path, "wb") as f:
        f.write(b"x" * 64)
    try:
        # a running job's stash, its sender killed a moment ago: a new launcher keeps it
        assert name not in segments.sweep_orphans(older_than=600)
        assert os.path.exists(path)
        old = time.time() - 601
        os.utime(path, (old, old))
        assert name in segments.sweep_orphans(older_than=600)  # a dead job's, long gone
        assert not os.path.exists(path)
    finally:
        segments.unlink(name)


def test_the_jobs_own_sweep_takes_every_dead_name(dead_pid):
    job = f"testjob{os.getpid()}b"
    name = f"minidist-{job}-0000000000000001-{dead_pid}"
    path = os.path.join(segments.SHM_DIR, name)
    open(path, "wb").close()
    alive = f"minidist-{job}-0000000000000002-{os.getpid()}"
    open(os.path.join(segments.SHM_DIR, alive), "wb").close()
    try:
        assert segments.sweep_orphans(job) == [name]
        assert os.path.exists(os.path.join(segments.SHM_DIR, alive))
    finally:
        segments.unlink(name)
        segments.unlink(alive)


def test_named_lists_the_names_that_begin_with_a_prefix_taken_literally(tmp_path, monkeypatch):
    for name in ("minidist-a[1]-x-1", "minidist-a1-x-2", "minidist-a[1]-y-3", "other"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setattr(segments, "SHM_DIR", str(tmp_path))
    assert sorted(os.path.basename(p) for p in segments.named("minidist-a[1]-")) == [
        "minidist-a[1]-x-1", "minidist-a[1]-y-3"]
    assert all(p.startswith(str(tmp_path) + os.sep) for p in segments.named("minidist-"))
    assert segments.named("minidist-zz") == []
    monkeypatch.setattr(segments, "SHM_DIR", str(tmp_path / "missing"))
    assert segments.named("minidist-") == []
