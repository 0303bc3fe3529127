"""Shared-memory segments for the ranks of a group on one node.

A segment is created by the group's first rank, opened by the others, and unlinked as
soon as every rank has it mapped: from then on it has no name, so nothing is left in
/dev/shm however the processes end. Its name carries the job's key, so a launcher can
sweep what a process killed in the short window before the unlink left behind.
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os

SHM_DIR = "/dev/shm"


def available() -> bool:
    """True where POSIX shared memory lives in /dev/shm (Linux)."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def segment_name(job: str, group: int, pid: int) -> str:
    return f"minidist-{job}-{group:016x}-{pid}"


def create(name: str, size: int) -> mmap.mmap:
    """Create and map a new segment (FileExistsError if the name is taken)."""
    fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def attach(name: str, size: int) -> mmap.mmap:
    """Map an existing segment."""
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))


def sweep(job: str) -> list[str]:
    """Remove every segment name of a job left in /dev/shm; return what was removed."""
    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, f"minidist-{job}-*")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(os.path.basename(path))
    return removed


def sweep_orphans(job: str | None = None) -> list[str]:
    """Remove segment names (of one job, or of any job) whose creator has died: a name
    lives only while its creator sets the segment up, so such a name is garbage. Names
    of other users' segments that cannot be removed are left alone."""
    removed = []
    pattern = f"minidist-{job}-*" if job else "minidist-*"
    for path in glob.glob(os.path.join(SHM_DIR, pattern)):
        try:
            pid = int(path.rsplit("-", 1)[1])
        except ValueError:
            continue
        if alive(pid):
            continue
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.unlink(path)
            removed.append(os.path.basename(path))
    return removed


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (also one of another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
