"""Reading another process's memory directly (Linux ``process_vm_readv``).

Ranks of one node that run as the same user in the same PID namespace may copy from
each other's arrays with one system call and one copy, where a copy through a shared
segment costs two (Open MPI's "CMA" single-copy transport is the same mechanism). The
kernel allows it when the reader could ptrace the target: same user IDs, a dumpable
target, and the Yama module's ``ptrace_scope`` at 0, or at 1 with the target's consent
(``PR_SET_PTRACER_ANY``, which :func:`key` gives when it is asked for a key).

:func:`key` says what a process must share with another to read it; processes whose
keys are equal (and not None) can read each other, which every rank can check from the
keys alone, so ranks agree on it without trying.
"""

from __future__ import annotations

import ctypes
import os
import platform

_SYS = {"x86_64": 310, "AMD64": 310, "aarch64": 270}.get(platform.machine())
_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, _PR_GET_DUMPABLE = 0x59616D61, -1, 3


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc():
    if _SYS is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.prctl.restype = ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def read(pid: int, local: int, remote: int, nbytes: int) -> None:
    """Copy ``nbytes`` from address ``remote`` of process ``pid`` to ``local`` in this
    process. OSError (with the errno: ESRCH, the process is gone; EFAULT, the range is
    not mapped there; EPERM, not allowed) unless every byte was copied."""
    if nbytes <= 0:
        return
    mine = _Iovec(local, nbytes)
    theirs = _Iovec(remote, nbytes)
    got = _LIBC.syscall(_SYS, ctypes.c_long(pid), ctypes.byref(mine), ctypes.c_ulong(1),
                        ctypes.byref(theirs), ctypes.c_ulong(1), ctypes.c_ulong(0))
    if got != nbytes:
        err = ctypes.get_errno() if got < 0 else 0
        if err:
            raise OSError(err, f"reading {nbytes} bytes of process {pid}: "
                          f"{os.strerror(err)}")
        raise OSError(0, f"reading {nbytes} bytes of process {pid}: only {got} copied")


def _ptrace_scope() -> int:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0  # no Yama: the user IDs decide


def key() -> str | None:
    """What another process must share with this one to read it (and be read by it):
    the PID namespace and every user and group ID; None where this process cannot take
    part (no such system call, forbidden here, a non-dumpable process, Yama's
    ``ptrace_scope`` of 2 or more). At ``ptrace_scope`` 1, this process lets any
    process of its user read it (``PR_SET_PTRACER_ANY``), as Open MPI's does."""
    if _LIBC is None:
        return None
    try:
        if _LIBC.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 1:
            return None
        scope = _ptrace_scope()
        if scope >= 2:
            return None
        if scope == 1 and _LIBC.prctl(_PR_SET_PTRACER, ctypes.c_ulong(_PR_SET_PTRACER_ANY
                                                                       & 0xFFFFFFFFFFFFFFFF),
                                      0, 0, 0) != 0:
            return None
        probe = ctypes.create_string_buffer(b"minidist", 8)
        back = ctypes.create_string_buffer(8)
        read(os.getpid(), ctypes.addressof(back), ctypes.addressof(probe), 8)
        if back.raw != probe.raw:
            return None
        ns = os.stat("/proc/self/ns/pid").st_ino
        return f"{ns}:{os.getresuid()}:{os.getresgid()}"
    except (OSError, AttributeError):
        return None


_PROBE = ctypes.create_string_buffer(b"minidist", 8)  # what a peer reads to try


def spot() -> str:
    """Where a peer can try reading this process (:func:`readable`): its pid and the
    address of 8 known bytes."""
    return f"{os.getpid()}:{ctypes.addressof(_PROBE)}"


def readable(where: str) -> bool:
    """Whether this process can read the process at ``where`` (a peer's :func:`spot`):
    one read of its 8 known bytes. False where the system call is refused (EPERM: a
    container's seccomp profile without CAP_SYS_PTRACE, Yama), or fails any other way."""
    if _LIBC is None:
        return False
    try:
        pid, at = (int(x) for x in where.split(":"))
        back = ctypes.create_string_buffer(8)
        read(pid, ctypes.addressof(back), at, 8)
    except (OSError, ValueError):
        return False
    return back.raw == _PROBE.raw
