"""File-descriptor limits: use what the system allows, and say so plainly when it is not
enough.

Many systems start processes with a soft ``RLIMIT_NOFILE`` of 1024 and a much higher
hard limit; any process may raise its soft limit up to the hard one. The launcher, the
node agent and every rank do that first (:func:`raise_soft_limit`). The launcher then
knows how many ranks it starts and checks the limit against what it will hold
(:func:`launcher_needs`): when even the hard limit is too low, the job fails at once with
:class:`FileLimitError`, which names the limit, the number needed and ``ulimit -n``.

A descriptor that cannot be had later (``EMFILE``: this process's limit; ``ENFILE``: the
system's) becomes the same error (:func:`exhausted`), never a timeout whose message
points elsewhere.
"""

from __future__ import annotations

import errno
import logging
import os
import time

from .errors import DistError

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX
    resource = None  # type: ignore[assignment]

log = logging.getLogger("minidist.limits")

# what the launcher holds besides its ranks' (its loop, the listening sockets, the
# standard streams, numpy's and uvloop's own), with room to spare
LAUNCHER_BASE = 64
# per local rank: its stderr pipe and its connection to the rendezvous (or to this
# node's agent); the ranks' stdout is one socket for all
LAUNCHER_PER_RANK = 2
EXHAUSTION = (errno.EMFILE, errno.ENFILE)


class FileLimitError(DistError, OSError):
    """A process ran out of file descriptors, or would: the message names the limit, the
    number needed (when known) and how to raise it. ``errno`` is EMFILE or ENFILE."""

    def __init__(self, errnum: int, text: str) -> None:
        super().__init__(text)
        self.errno = errnum
        self.text = text

    def __str__(self) -> str:
        return self.text


def limits() -> tuple[int, int]:
    """This process's (soft, hard) RLIMIT_NOFILE; -1 stands for unlimited."""
    if resource is None:
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    return (-1 if soft == inf else soft), (-1 if hard == inf else hard)


def raise_soft_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (which any process may
    do); return the (soft, hard) limits in force afterwards. Never raises."""
    if resource is None:
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        target = hard
        if hard == resource.RLIM_INFINITY:  # Linux caps the soft limit at fs.nr_open
            target = _nr_open()
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as e:
            log.debug("could not raise the soft file limit %s to %s: %s", soft, target, e)
    return limits()


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def launcher_needs(nproc: int, log_dir: bool = False) -> int:
    """File descriptors the launcher of ``nproc`` local ranks holds at most (with
    ``log_dir``: a log file per rank more)."""
    return LAUNCHER_BASE + nproc * (LAUNCHER_PER_RANK + (1 if log_dir else 0))


def rank_needs(local_world_size: int, hosts: bool) -> int:
    """File descriptors a rank of a node of ``local_world_size`` ranks may hold at most:
    a connection to each rank of its node (a group's first rank sets up the group's
    shared memory with every member), and with ``hosts`` (it runs the rendezvous or its
    node's agent) one more per rank of the node."""
    return LAUNCHER_BASE + local_world_size * (2 if hosts else 1)


def open_count() -> int:
    """How many file descriptors this process holds now (-1 if unknown)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir opened
    except OSError:
        return -1


def too_low(needed: int, what: str) -> FileLimitError | None:
    """The error to raise when this process's limit, already raised as far as it goes,
    is below ``needed`` descriptors for ``what``; None when it is enough."""
    soft, hard = raise_soft_limit()
    if soft < 0 or soft >= needed:
        return None
    fix = (f"raise it before starting the job (`ulimit -n {needed}`)" if hard < 0 or
           hard >= needed else
           f"raise the hard limit (`ulimit -Hn {needed}` as root, LimitNOFILE= in a systemd "
           f"unit, nofile in /etc/security/limits.conf, or docker run --ulimit "
           f"nofile={needed}:{needed}), then `ulimit -n {needed}`")
    return FileLimitError(
        errno.EMFILE,
        f"too few file descriptors: {what} needs about {needed}, and this process may "
        f"open at most {soft} (RLIMIT_NOFILE soft {soft}, hard "
        f"{'unlimited' if hard < 0 else hard}; `ulimit -n` shows it); {fix}")


def exhausted(err: BaseException, what: str) -> FileLimitError | None:
    """``err`` as the error that says why, when it is EMFILE or ENFILE (``what``: what
    was being opened); None for any other error."""
    if isinstance(err, FileLimitError):
        return err
    if not isinstance(err, OSError) or err.errno not in EXHAUSTION:
        return None
    soft, hard = limits()
    held = open_count()
    if err.errno == errno.ENFILE:
        text = (f"the system ran out of file descriptors (ENFILE) while {what}: raise "
                "fs.file-max (sysctl), or run fewer processes")
    else:
        holds = f"holds {held}" if held >= 0 else "holds all it may"
        text = (f"too many open files (EMFILE) while {what}: this process {holds} "
                f"and may hold at most {soft} (RLIMIT_NOFILE soft {soft}, hard "
                f"{'unlimited' if hard < 0 else hard}); raise the limit before starting "
                f"the job (`ulimit -n {max(2 * max(soft, 1024), held + 1024)}`)")
    return FileLimitError(err.errno, text)


class Reserve:
    """One descriptor kept in reserve by a listener: when ``accept`` fails for want of
    descriptors, the reserve is given up for a moment so that the waiting connection is
    accepted and closed at once (its connector sees it refused instead of waiting out
    its timeout), and the error is reported once a minute at most."""

    EVERY = 60.0

    def __init__(self) -> None:
        self._fd = self._take()
        self._last = -float("inf")

    @staticmethod
    def _take() -> int:
        try:
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1

    def shed(self, listener, err: OSError, where: str) -> FileLimitError:
        """``listener``'s accept failed with EMFILE/ENFILE: refuse one waiting
        connection, log why (rate-limited); return the error."""
        e = exhausted(err, f"{where} accepted a connection") or FileLimitError(
            err.errno, str(err))
        now = time.monotonic()
        if now - self._last >= self.EVERY:
            self._last = now
            log.error("%s", e)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            try:
                sock, _ = listener.accept()
                sock.close()
            except OSError:
                pass
            self._fd = self._take()
        return e

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
