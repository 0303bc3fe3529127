"""minidist run --verbose's look at /dev/shm: named and unlinked segments, once each."""

import mmap
import os
import secrets
import subprocess
import sys
import time

import pytest

from minidist import segments
from minidist.launch.shm_usage import job_shm

pytestmark = pytest.mark.skipif(not segments.available(), reason="needs /dev/shm")

HOLDER = """
import mmap, os, sys, time
path = sys.argv[1]
fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.ftruncate(fd, 4 << 20)
os.posix_fallocate(fd, 0, 2 << 20)
m = mmap.mmap(fd, 4 << 20)
os.unlink(path)  # mapped, its name gone
print("ready", flush=True)
sys.stdin.read()
"""


def test_named_and_unlinked_segments_are_counted_once_by_their_pages():
    job = secrets.token_hex(10)
    named = os.path.join(segments.SHM_DIR, f"minidist-{job}-named")
    other = os.path.join(segments.SHM_DIR, f"minidist-{secrets.token_hex(10)}-x")
    gone = os.path.join(segments.SHM_DIR, f"minidist-{job}-gone")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, gone],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        for path in (named, other):  # another job's segment is not this job's
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.posix_fallocate(fd, 0, 1 << 20)
            os.ftruncate(fd, 8 << 20)  # its size is not its pages
            os.close(fd)
        fd = os.open(named, os.O_RDWR)
        seg = mmap.mmap(fd, 8 << 20)  # mapped here too: counted once
        os.close(fd)
        use = job_shm(job, [holder.pid, os.getpid(), holder.pid])
        seg.close()
        assert use.named_bytes == 1 << 20
        assert use.unlinked_bytes == 2 << 20
        assert use.segments == 2 and use.total == 3 << 20
        holder.stdin.close()
        holder.wait(10)
        time.sleep(0.1)
        assert job_shm(job, [holder.pid]).total == 1 << 20  # the holder is gone
    finally:
        holder.kill()
        holder.wait(10)
        for path in (named, other, gone):  # (gone: if the holder failed before its unlink)
            if os.path.exists(path):
                os.unlink(path)
