"""Versions of one array in one node's shared segment: one writer, any number of readers.

The segment holds a control area, then ``buffers`` copies of the array (each rounded
up to whole pages). The writer fills a buffer that nobody reads, then makes it the
latest version; a reader takes a view of the latest buffer in place. Nothing is copied
on the reading side and no reader ever sees a buffer while it is being rewritten.

Control words (int32, byte offsets):

* ``LATEST`` (0): the latest complete version; readers that wait sleep on it (futex).
* ``WAITING`` (4): 1 when a reader sleeps on ``LATEST`` (the writer then wakes them).
* ``MOVED`` (8): bumped by a reader that moved its pin while the writer waits for one.
* ``WRITER_WAITING`` (12): 1 while the writer sleeps on ``MOVED``.
* ``FAILED`` (16): 1 when the node's writer can no longer bring versions (a relay that
  failed); waiting readers raise.
* ``VER[b]`` (64 + 4 b): the version buffer ``b`` holds, -1 while it is being written.
* ``PIN[i]`` (128 + 4 i): ``b + 1`` when member ``i`` of the node reads buffer ``b``
  (0: none).

Pins (the rule for how long a view stays valid). A view that :meth:`NodeBuffers.read`
returns stays valid until the same reader's next ``read`` (or ``release``/``close``):
the reader's pin word names its buffer, and the writer never claims a pinned buffer
(nor the latest one). A reader pins with: load ``LATEST`` = v; find ``b`` with
``VER[b] == v``; store ``PIN = b + 1``; fence; check ``VER[b] == v`` (else retry). The
writer claims with: store ``VER[b] = -1``; fence; load every ``PIN``; if one names
``b``, store the old ``VER[b]`` back and try another buffer. Each side fences between
its store and its load (Dekker), so either the reader sees -1 (and retries) or the
writer sees the pin (and leaves the buffer alone): a buffer is never rewritten while a
reader may still hold a view of it. Versions only grow, so a ``VER[b]`` that equals
``v`` again is the same version (no ABA). With every non-latest buffer pinned the
writer waits (a futex on ``MOVED``) until a reader moves on; pins of members that
died are cleared by whoever notices (the ``stale`` callback).

Memory ordering as in :mod:`minidist.shm.fast_slots`: x86 (TSO), stores and loads through
numpy's C code, a full fence where a store must precede a load; sleepers say so in a
flag word before they sleep, and the writer wakes them after a fence.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections.abc import Callable

import numpy as np

from . import segments
from .errors import DistError
from .shm import fast_slots

LATEST, WAITING, MOVED, WRITER_WAITING, FAILED = 0, 1, 2, 3, 4  # int32 indices
VER = 16  # int32 index of VER[0]
PIN = 32  # int32 index of PIN[0]
MAX_BUFFERS = 16
MAX_VERSION = (1 << 31) - 1
PAGE = mmap.PAGESIZE
SLICE = fast_slots.SLICE  # seconds a waiter sleeps at most between checks

Check = Callable[[], "DistError | None"]


def control_bytes(members: int) -> int:
    """The control area of a segment shared by ``members`` processes (whole pages)."""
    return -(-(4 * (PIN + members)) // PAGE) * PAGE


def stride(nbytes: int) -> int:
    """The bytes one buffer of an ``nbytes`` array takes (whole pages, at least one)."""
    return max(1, -(-nbytes // PAGE)) * PAGE


def segment_bytes(nbytes: int, buffers: int, members: int) -> int:
    return control_bytes(members) + buffers * stride(nbytes)


def create(name: str, size: int) -> int:
    """Create segment ``name`` of ``size`` bytes with every page reserved now
    (:func:`minidist.segments.reserve`: a full /dev/shm fails here with a clear error,
    never later with SIGBUS); its fd. DistError (nothing left behind) if there is no
    room."""
    fd = os.open(os.path.join(segments.SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR,
                 0o600)
    try:
        os.ftruncate(fd, size)
        segments.reserve(fd, 0, size, "a shared array")
    except BaseException as e:
        os.close(fd)
        segments.unlink(name)
        if isinstance(e, OSError):
            raise DistError(
                f"{e.strerror if isinstance(e, segments.NoRoom) else e}: give the container "
                "more shared memory (docker run --shm-size=...), or use fewer buffers or a "
                "smaller array") from None
        raise
    return fd


def attach(name: str) -> int:
    """The fd of an existing segment (FileNotFoundError if it is gone)."""
    return os.open(os.path.join(segments.SHM_DIR, name), os.O_RDWR)


class NodeBuffers:
    """One process's view of a node's versioned segment (fd ``fd``, then closed).

    ``member`` is this process's index among the node's members (its pin word);
    ``writer``: this process writes versions (it maps the buffers writable and faults
    them in now, so that a publish costs a copy, not page faults)."""

    def __init__(self, fd: int, nbytes: int, buffers: int, members: int, member: int,
                 writer: bool) -> None:
        if not 2 <= buffers <= MAX_BUFFERS:
            raise ValueError(f"buffers must be 2..{MAX_BUFFERS}, not {buffers}")
        self.nbytes, self.buffers, self.members, self.member = nbytes, buffers, members, member
        self.writer = writer
        ctl, self.stride = control_bytes(members), stride(nbytes)
        try:
            self._ctl = mmap.mmap(fd, ctl)
            if writer:
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                self._data = mmap.mmap(fd, buffers * self.stride, flags=flags,
                                       prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=ctl)
            else:  # readers cannot write into the versions, whatever they do
                self._data = mmap.mmap(fd, buffers * self.stride, flags=mmap.MAP_SHARED,
                                       prot=mmap.PROT_READ, offset=ctl)
        finally:
            os.close(fd)
        self.words = np.frombuffer(self._ctl, np.int32)
        # the same words as Python ints: a load or store costs 30 ns, not 500 (numpy)
        self.w = memoryview(self._ctl).cast("i")
        self._latest_addr = self.words.ctypes.data + 4 * LATEST
        self._moved_addr = self.words.ctypes.data + 4 * MOVED
        self.pins = self.words[PIN:PIN + members]
        self.ver = self.words[VER:VER + buffers]
        data = np.frombuffer(self._data, np.uint8)
        self.raw = [data[b * self.stride:b * self.stride + nbytes] for b in range(buffers)]
        self.latest_buffer = 0  # the writer's: the buffer of the latest version
        self.pinned = -1  # this reader's buffer (-1: none)
        self.version = -1  # the version of that buffer

    # ------------------------------------------------------------------ reading

    @property
    def latest(self) -> int:
        """The latest complete version on this node."""
        return self.w[LATEST]

    def pin_latest(self) -> tuple[int, int]:
        """Pin the latest version's buffer (releasing the one pinned before): (buffer,
        version). The buffer is not rewritten until the next call or :meth:`release`."""
        w = self.w
        v = w[LATEST]
        if v == self.version:
            return self.pinned, v
        me, first, last = PIN + self.member, VER, VER + self.buffers
        while True:
            for at in range(first, last):
                if w[at] == v:
                    b = at - first
                    w[me] = b + 1
                    fast_slots.fence()
                    if w[at] == v:
                        break
            else:  # rewritten meanwhile: a newer version is the latest
                v = w[LATEST]
                continue
            break
        if w[WRITER_WAITING]:
            w[MOVED] += 1
            fast_slots.futex_wake(self._moved_addr)
        self.pinned, self.version = b, v
        return b, v

    def release(self) -> None:
        """Drop this reader's pin: views it took may be rewritten from now on."""
        if self.pinned >= 0:
            self.words[PIN + self.member] = 0
            self.pinned, self.version = -1, -1
            fast_slots.fence()
            if self.words[WRITER_WAITING]:
                self.words[MOVED] += 1
                fast_slots.futex_wake(self._moved_addr)

    def wait(self, version: int, deadline: float, check: Check) -> int:
        """Until the latest version is at least ``version``; the latest then. Sleeps
        (no CPU) in slices of at most :data:`SLICE` s, between which ``check()`` may
        return an error to raise; TimeoutError past ``deadline`` (time.monotonic())."""
        words = self.w
        while True:
            seen = words[LATEST]
            if seen >= version:
                return seen
            err = check()
            if err is not None and words[LATEST] < version:
                raise err
            if words[FAILED]:
                raise DistError("the rank that brings versions to this node stopped (it "
                                "closed the array, or receiving failed: see its error)")
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(seen)
            words[WAITING] = 1  # then the kernel's lock, then its look at LATEST
            fast_slots.futex_wait(self._latest_addr, seen, min(SLICE, deadline - now))

    # ------------------------------------------------------------------ writing

    def try_claim(self) -> int:
        """A buffer nobody reads, marked as being written (-1 in VER), or -1 if every
        buffer but the latest is pinned."""
        ver, pins = self.ver, self.pins
        order = sorted(range(self.buffers), key=lambda b: int(ver[b]))  # oldest first
        for b in order:
            if b == self.latest_buffer:
                continue
            old = int(ver[b])
            ver[b] = -1
            fast_slots.fence()
            if not (pins == b + 1).any():
                return b
            ver[b] = old
        return -1

    def claim(self, deadline: float, stale: Callable[[list[int]], None],
              check: Check) -> int:
        """:meth:`try_claim`, waiting (futex on MOVED, slices of SLICE s) while every
        other buffer is pinned; ``stale(members)`` is told who pins them (it clears the
        pins of members that are gone); TimeoutError past ``deadline``."""
        words = self.words
        while True:
            words[WRITER_WAITING] = 1
            fast_slots.fence()
            seen = int(words[MOVED])
            b = self.try_claim()
            if b >= 0:
                words[WRITER_WAITING] = 0
                return b
            words[WRITER_WAITING] = 1
            err = check()
            if err is not None:
                words[WRITER_WAITING] = 0
                raise err
            stale(self.pinning())
            now = time.monotonic()
            if now >= deadline:
                words[WRITER_WAITING] = 0
                raise TimeoutError(self.pinning())
            fast_slots.futex_wait(self._moved_addr, seen, min(SLICE, deadline - now))

    def pinning(self) -> list[int]:
        """The members whose pins hold a buffer other than the latest one."""
        return [int(i) for i in np.flatnonzero((self.pins != 0)
                                               & (self.pins != self.latest_buffer + 1))]

    def clear_pin(self, member: int) -> None:
        """Drop the pin of ``member`` (one that is gone)."""
        self.words[PIN + member] = 0

    def commit(self, b: int, version: int) -> None:
        """Make claimed buffer ``b`` (now holding ``version``) the latest, and wake the
        readers that sleep on it."""
        words = self.w
        words[VER + b] = version
        words[LATEST] = version
        self.latest_buffer = b
        fast_slots.fence()
        if words[WAITING]:
            words[WAITING] = 0
            fast_slots.futex_wake(self._latest_addr)

    def fail(self) -> None:
        """Tell this node's readers that no more versions will come."""
        self.words[FAILED] = 1
        fast_slots.fence()
        fast_slots.futex_wake(self._latest_addr)

    def close(self) -> None:
        """Release the pin and unmap (views still held keep their pages mapped)."""
        with contextlib.suppress(ValueError):
            self.release()
        self.raw = []
        self.w.release()
        self.words = self.ver = self.pins = self.w = None  # type: ignore[assignment]
        for m in (self._data, self._ctl):
            with contextlib.suppress(BufferError):
                m.close()
