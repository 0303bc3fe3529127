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


def test_a_segment_has_its_name_only_once_its_pages_are_reserved(monkeypatch):
    """Another rank finds an inbox by listing /dev/shm: while its pages are reserved
    the segment must not be there under its name (on a full /dev/shm a read of a page
    not yet given kills the reader with SIGBUS), and a failed reservation leaves no name
    at all."""
    name = f"minidist-testjob{os.getpid()}-1b0c000000000001-{os.getpid()}"
    path = os.path.join(segments.SHM_DIR, name)
    making = os.path.join(segments.SHM_DIR, segments.making_name(name))
    seen = []
    real = segments.reserve

    def reserve(fd, offset, length, what="shared memory"):
        seen.append((os.path.exists(path), os.path.exists(making)))
        return real(fd, offset, length, what)

    monkeypatch.setattr(segments, "reserve", reserve)
    try:
        seg, fd = segments.create_open(name, 1 << 16, reserved=4096)
        os.close(fd)
        seg.close()
        assert seen == [(False, True)]  # reserved under the making name only
        assert os.path.exists(path) and not os.path.exists(making)
        assert os.stat(path).st_blocks * 512 >= 4096  # its reserved page is there
        with pytest.raises(FileExistsError):
            segments.create(name, 4096)
        assert os.path.exists(path) and not os.path.exists(making)  # the taken name kept
    finally:
        segments.unlink(name)

    def no_room(fd, offset, length, what="shared memory"):
        raise segments.NoRoom(what, length, 0, 64 << 20, 28)

    monkeypatch.setattr(segments, "reserve", no_room)
    with pytest.raises(segments.NoRoom):
        segments.create(name, 1 << 16)
    assert not os.path.exists(path) and not os.path.exists(making)


def test_the_making_name_is_swept_with_the_job_and_with_its_dead_creator(dead_pid):
    name = f"minidist-testjob{os.getpid()}-1b0c000000000001-{dead_pid}"
    making = segments.making_name(name)
    assert making.startswith(f"minidist-testjob{os.getpid()}-")  # the job's own sweep
    assert making.rsplit("-", 1)[1] == str(dead_pid)  # sweep_orphans reads the pid
    assert not making.startswith(name.rsplit("-", 1)[0] + "-")  # not what a rank lists
    path = os.path.join(segments.SHM_DIR, making)
    with open(path, "wb") as f:
        f.write(b"x")
    try:
        assert making in segments.sweep_orphans(job=f"testjob{os.getpid()}")
    finally:
        segments.unlink(making)
