"""Shared-memory segments for the ranks of a group on one node.

A segment is created by the group's first rank, opened by the others, and unlinked as
soon as every rank has it mapped: from then on it has no name, so nothing is left in
/dev/shm however the processes end. Its name carries the job's key, so a launcher can
sweep what a process killed in the short window before the unlink left behind.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import sys
import time

from . import fdlimits

SHM_DIR = "/dev/shm"
WARNED = "-warned"  # the name's end of a job's marker that it warned (warn_once)
HEADROOM_FRACTION = 16  # a segment is refused if less than 1/16 of /dev/shm stays free
_NO_ROOM = (errno.ENOSPC, errno.ENOMEM, errno.EFBIG, errno.EDQUOT)


class NoRoom(OSError):
    """A segment (or a range of one) could not be reserved in /dev/shm: ``size`` bytes
    were asked for, ``free`` and ``total`` are what /dev/shm had (bytes)."""

    def __init__(self, what: str, size: int, free: int, total: int, err: int) -> None:
        super().__init__(errno.ENOSPC, f"{what}: no room for {mib(size)} in {SHM_DIR} "
                         f"({mib(free)} free of {mib(total)}; {os.strerror(err)})")
        self.size, self.free, self.total = size, free, total


def mib(nbytes: int) -> str:
    """``nbytes`` in MiB, as a person reads it."""
    v = nbytes / (1 << 20)
    return f"{v:.2f} MiB" if v < 10 else f"{v:.0f} MiB"


def room() -> tuple[int, int]:
    """(bytes free, bytes in all) of /dev/shm; (0, 0) if it cannot be read."""
    try:
        fs = os.statvfs(SHM_DIR)
    except OSError:
        return 0, 0
    return fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize


def reserve(fd: int, offset: int, length: int, what: str = "shared memory") -> None:
    """Give the pages of ``[offset, offset + length)`` of the /dev/shm file ``fd`` their
    memory now (``posix_fallocate``), so that no later first touch of them can fail (a
    page that tmpfs cannot supply on first touch kills the process with SIGBUS). The
    pages of every node's ranks come out of one pool, /dev/shm itself, so its own count
    is the node's budget: NoRoom if the reservation would leave less than 1/16 of
    /dev/shm free (room for other programs and for this job's small segments), or if
    tmpfs refuses (ENOSPC, also when another process took the room just before)."""
    if length <= 0:
        return
    free, total = room()
    if total and free - length < total // HEADROOM_FRACTION:
        raise NoRoom(what, length, free, total, errno.ENOSPC)
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        if e.errno in _NO_ROOM:
            free, total = room()
            raise NoRoom(what, length, free, total, e.errno) from None
        if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        # a file system that cannot reserve: touch every page now, where a failure is
        # an error rather than a signal in the middle of a call
        _touch(fd, offset, length, what)


def _touch(fd: int, offset: int, length: int, what: str) -> None:
    page = mmap.PAGESIZE
    zero = bytes(page)
    pos = offset - offset % page
    while pos < offset + length:
        try:
            os.pwrite(fd, zero, pos)  # a write that finds no room says ENOSPC
        except OSError as e:
            free, total = room()
            raise NoRoom(what, length, free, total, e.errno) from None
        pos += page


def available() -> bool:
    """True where POSIX shared memory lives in /dev/shm (Linux)."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def segment_name(job: str, group: int, pid: int) -> str:
    return f"minidist-{job}-{group:016x}-{pid}"


def create(name: str, size: int, reserved: int | None = None) -> mmap.mmap:
    """Create and map a new segment of ``size`` bytes whose first ``reserved`` bytes
    (None: all) have their memory reserved (:func:`reserve`); the rest must be reserved
    before it is touched. FileExistsError if the name is taken; NoRoom (nothing is left
    behind) if /dev/shm has no room for it."""
    seg, fd = create_open(name, size, reserved)
    os.close(fd)
    return seg


def create_open(name: str, size: int, reserved: int | None = None) -> tuple[mmap.mmap, int]:
    """:func:`create`, and the segment's file descriptor (the caller closes it), for
    reserving the rest later.

    The segment is made under a name of its own (:func:`making_name`) and given ``name``
    only once its reserved part has its pages: a rank that finds segments by listing
    /dev/shm (another rank's inbox) never maps one whose first pages are still holes,
    which on a full /dev/shm would kill it with SIGBUS at its first read."""
    temp = making_name(name)
    making = os.path.join(SHM_DIR, temp)
    with _no_descriptors(f"creating the shared-memory segment {name}"):
        fd = os.open(making, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        reserve(fd, 0, size if reserved is None else min(reserved, size),
                f"shared-memory segment {name}")
        with _no_descriptors(f"mapping the shared-memory segment {name}"):
            seg = mmap.mmap(fd, size)
        try:
            os.link(making, os.path.join(SHM_DIR, name))  # FileExistsError: name taken
        except BaseException:
            seg.close()
            raise
        return seg, fd
    except BaseException:
        os.close(fd)
        raise
    finally:
        unlink(temp)


def making_name(name: str) -> str:
    """The name a segment has while it is made: ``name`` with a ``~`` before its last
    ``-`` (still the job's prefix, for :func:`sweep`, and still ending in the creator's
    pid, for :func:`sweep_orphans`; never the prefix another rank lists)."""
    head, sep, tail = name.rpartition("-")
    return f"{head}~{sep}{tail}" if sep else f"{name}~"


def attach(name: str, size: int) -> mmap.mmap:
    """Map an existing segment (FileLimitError when this process is out of file
    descriptors)."""
    with _no_descriptors(f"opening the shared-memory segment {name}"):
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        with _no_descriptors(f"mapping the shared-memory segment {name}"):
            return mmap.mmap(fd, size)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _no_descriptors(what: str):
    """EMFILE/ENFILE inside becomes :class:`minidist.fdlimits.FileLimitError` (an
    OSError with the same errno), naming the limit and ``ulimit -n``."""
    try:
        yield
    except OSError as e:
        err = fdlimits.exhausted(e, what)
        if err is None or err is e:
            raise
        raise err from None


def unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))


def warn_once(job: str, text: str) -> bool:
    """Print ``text`` (one line, to stderr) unless a process of this job on this node
    already did: the first to create the job's marker name in /dev/shm prints (the
    marker goes with the job's other names, :func:`sweep`). True if this one printed."""
    try:
        os.close(os.open(os.path.join(SHM_DIR, f"minidist-{job}{WARNED}"),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:
        pass  # no marker can be made: better a line per rank than none
    print(text, file=sys.stderr, flush=True)
    return True


def warn_no_room(job: str, err: NoRoom, what: str) -> bool:
    """Say once per job and node (:func:`warn_once`) that ``what`` could not have the
    shared memory it needed (``err``) and goes over sockets, with the fixes."""
    want = max(1 << 30, 1 << max(0, (err.total + err.size - 1).bit_length()))
    return warn_once(job, (
        f"minidist: warning: {SHM_DIR} is too small: {what} needed {mib(err.size)} of "
        f"shared memory and {mib(err.free)} of {mib(err.total)} were free, so it runs over "
        f"sockets (correct, slower) and so may others in this job; give the container "
        f"more (docker run --shm-size={want >> 30}g, or a Kubernetes emptyDir with "
        f"medium: Memory on /dev/shm) or set MINIDIST_SHM=0 to use no shared memory "
        f"(and no warning)"))


def named(prefix: str) -> list[str]:
    """The paths of the names in /dev/shm that begin with ``prefix`` (a plain prefix, not
    a pattern: no regular expression is compiled in a rank for it)."""
    try:
        with os.scandir(SHM_DIR) as entries:
            return [e.path for e in entries if e.name.startswith(prefix)]
    except OSError:
        return []


def sweep(job: str) -> list[str]:
    """Remove every segment name of a job left in /dev/shm; return what was removed."""
    removed = []
    for path in named(f"minidist-{job}-"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            if not path.endswith(WARNED):  # the marker of warn_once: no segment
                removed.append(os.path.basename(path))
    return removed


def sweep_orphans(job: str | None = None, older_than: float = 0.0) -> list[str]:
    """Remove segment names (of one job, or of any job) whose creator has died and that
    were last changed at least ``older_than`` seconds ago. Most names live only while
    their creator sets the segment up; a stash of large messages keeps its name while its
    sender lives and a little longer, so that a receiver can still take what a killed
    sender left (which is why a sweep of every job's names, that a new launcher makes,
    spares the recent ones). Names of other users' segments that cannot be removed are
    left alone."""
    removed = []
    now = time.time()
    for path in named(f"minidist-{job}-" if job else "minidist-"):
        try:
            pid = int(path.rsplit("-", 1)[1])
        except ValueError:
            continue
        if alive(pid):
            continue
        with contextlib.suppress(FileNotFoundError, PermissionError):
            if older_than and now - os.stat(path).st_mtime < older_than:
                continue
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
