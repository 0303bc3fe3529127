"""Point-to-point messages on one node through shared memory: a receiver's inbox.

Each rank that receives through shared memory owns one *inbox*: a segment in /dev/shm
with one ring per rank of its node (the senders, in rank order), each ring a single
writer (that sender) and a single reader (this rank). A message is a record: the 64
bytes of its frame header (:mod:`minidist.wire`, exactly what the socket would carry),
then its payload of at most :data:`MESSAGE_BYTES`.

Layout::

    inbox header (64 bytes): OPEN, BELL, SLEEPING (int32 each), MAGIC (int64), rings
    per ring: HEAD (int32, the reader's count of records taken) at 0,
              TAIL (int32, the writer's count of records written) at 32,
              then RING_SLOTS records of RECORD bytes, record k in slot k % RING_SLOTS

*OPEN* says whether the receiver reads its rings: a sender writes into a ring only
while it is 1 (and the ring has room); otherwise it uses the socket. *BELL* is the futex
word a waiting receiver sleeps on; *SLEEPING* says that one sleeps, so a sender makes
the wake-up system call only then.

Memory ordering (x86 TSO, as in :mod:`minidist.fastpath`): a writer stores the record,
then TAIL; a reader loads TAIL, then the record, then stores HEAD; stores become visible
in program order and a load is not reordered with an older load nor a store with an
older load, so a reader that sees TAIL sees the record, and a writer that sees HEAD
advanced finds its slot read. Two places need a full fence (Dekker's pattern, where TSO
lets a load pass an older store): the writer stores TAIL then loads OPEN and SLEEPING;
the reader stores OPEN = 0 (or SLEEPING = 1) then loads the TAILs. Each side fences
between its store and its load, so at least one side sees the other's store: either the
reader finds the record, or the writer sees the inbox closed (and rings the doorbell,
see :mod:`minidist.fast_p2p`) or sees the reader asleep (and wakes it).

A sender finds an inbox by name (its rank and the job's key, and the receiver's pid so
that a name left by a killed process can be swept) and maps it only if this user owns
it and nobody else may open it: a second local user can neither read nor fake one.
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import stat
import struct

import numpy as np

from . import segments
from .fastpath import fence, futex_wait, futex_wake

MESSAGE_BYTES = 64 << 10  # the largest payload a message through an inbox carries
RING_SLOTS = 4
HEADER = 64
RECORD = HEADER + MESSAGE_BYTES
RING = 64 + RING_SLOTS * RECORD
INBOX_KEY = 0x1B0C << 48  # the "group" part of an inbox's segment name, | the rank
MAGIC = 0x78_6F_62_6E_69_64_6D_31  # "1mdinbox"
_OPEN, _BELL, _SLEEPING, _MAGIC, _RINGS = 0, 4, 8, 16, 24
_HEAD, _TAIL = 0, 32
_WRAP = 0x7FFFFFFF


def inbox_bytes(rings: int) -> int:
    return HEADER + rings * RING


def inbox_name(job: str, rank: int, pid: int) -> str:
    return segments.segment_name(job, INBOX_KEY | rank, pid)


def _named(job: str, rank: int) -> list[tuple[str, int]]:
    """(path, creator's pid) of every inbox name of ``rank`` in the job."""
    out = []
    pattern = os.path.join(segments.SHM_DIR, inbox_name(job, rank, 0)[:-1] + "*")
    for path in glob.glob(pattern):
        with contextlib.suppress(ValueError):
            out.append((path, int(path.rsplit("-", 1)[1])))
    return out


class Inbox:
    """This rank's inbox (the reading side); ``rings`` senders, by ring index."""

    def __init__(self, job: str, rank: int, rings: int) -> None:
        self.name = inbox_name(job, rank, os.getpid())
        self.rings = rings
        for path, pid in _named(job, rank):  # left by a killed process of this rank (a
            if pid == os.getpid() or not segments.alive(pid):  # restart), or by an
                segments.unlink(os.path.basename(path))  # earlier init of this one
        self.seg = segments.create(self.name, inbox_bytes(rings))
        self.mem = np.frombuffer(self.seg, np.uint8)
        self.words = self.mem.view(np.int32)
        self.base = self.mem.ctypes.data
        struct.pack_into("<qq", self.mem, _MAGIC, MAGIC, rings)
        at = np.arange(rings) * RING + HEADER
        self._heads = (at + _HEAD) // 4
        self._tails = (at + _TAIL) // 4

    def close(self) -> None:
        """Close the inbox to senders, remove its name and unmap it."""
        self.words[_OPEN // 4] = 0
        segments.unlink(self.name)
        self.words = self.mem = None
        with contextlib.suppress(BufferError):
            self.seg.close()

    def set_open(self, value: bool) -> None:
        """Let senders write into the rings (True), or make them use the socket. After
        closing, the caller must read the rings once more (see the module)."""
        self.words[_OPEN // 4] = 1 if value else 0
        if not value:
            fence()

    @property
    def is_open(self) -> bool:
        return bool(self.words[_OPEN // 4])

    def bell(self) -> int:
        return int(self.words[_BELL // 4])

    def ring_bell(self) -> None:
        """Change BELL and wake its sleepers (from this process: a socket's message
        arrived, or a peer is gone)."""
        self.words[_BELL // 4] = (self.words[_BELL // 4] + 1) & _WRAP
        futex_wake(self.base + _BELL)

    def sleep(self, seen: int, timeout: float) -> None:
        """Sleep while BELL holds ``seen`` (at most ``timeout``); the caller has looked
        at its rings after :meth:`will_sleep`."""
        futex_wait(self.base + _BELL, seen, timeout)
        self.words[_SLEEPING // 4] = 0

    def will_sleep(self) -> None:
        """Say that a receiver is about to sleep (then look at the rings, then sleep)."""
        self.words[_SLEEPING // 4] = 1
        fence()

    def waiting(self, ring: int) -> bool:
        """Whether ring ``ring`` holds a record not taken yet."""
        return self.words[self._tails[ring]] != self.words[self._heads[ring]]

    def nonempty(self) -> np.ndarray:
        """The indices of the rings that hold records not taken yet."""
        w = self.words
        return np.flatnonzero(w[self._tails] != w[self._heads])

    def take(self, ring: int) -> tuple[bytes, np.ndarray] | None:
        """The oldest record of ring ``ring`` (its header bytes, a copy of its payload),
        removed from the ring; None if it is empty."""
        w = self.words
        head = int(w[self._heads[ring]])
        if w[self._tails[ring]] == head:
            return None
        at = HEADER + ring * RING + 64 + (head % RING_SLOTS) * RECORD
        header = self.mem[at:at + HEADER].tobytes()
        nbytes = struct.unpack_from("<Q", header, 48)[0]  # wire header: nbytes
        if nbytes > MESSAGE_BYTES:
            nbytes = 0  # not a record a sender wrote: the wire check rejects its header
        payload = self.mem[at + HEADER:at + HEADER + nbytes].copy()
        w[self._heads[ring]] = (head + 1) & _WRAP  # after the copy: the slot is free
        return header, payload


class Outbox:
    """Another rank's inbox, mapped by a sender (the writing side of one ring)."""

    def __init__(self, seg: mmap.mmap, ring: int) -> None:
        self.seg = seg
        self.mem = np.frombuffer(seg, np.uint8)
        self.words = self.mem.view(np.int32)
        self.base = self.mem.ctypes.data
        at = HEADER + ring * RING
        self._at = at + 64
        self._head = (at + _HEAD) // 4
        self._tail = (at + _TAIL) // 4

    @classmethod
    def attach(cls, job: str, rank: int, rings: int, ring: int) -> Outbox | None:
        """Map global rank ``rank``'s inbox to write ring ``ring``; None if it has none
        (yet) that this user owns alone and whose creator is alive."""
        size = inbox_bytes(rings)
        for path, pid in _named(job, rank):
            if not segments.alive(pid):  # a killed process's inbox: nobody reads it
                continue
            try:
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or \
                        st.st_mode & 0o077 or st.st_size != size:
                    continue
                seg = mmap.mmap(fd, size)
            except OSError:
                continue
            finally:
                os.close(fd)
            magic, count = struct.unpack_from("<qq", seg, _MAGIC)
            if magic == MAGIC and count == rings:
                return cls(seg, ring)
            seg.close()
        return None

    def close(self) -> None:
        self.words = self.mem = None
        with contextlib.suppress(BufferError):
            self.seg.close()

    def put(self, header: bytes, payload: memoryview | None) -> int:
        """Write one record: 0 if it was not written (the inbox is closed or the ring
        full), 1 if written, 2 if written but the inbox closed meanwhile (the reader may
        not look again: ring its doorbell)."""
        w = self.words
        if not w[_OPEN // 4]:
            return 0
        tail = int(w[self._tail])
        if (tail - int(w[self._head])) & _WRAP >= RING_SLOTS:
            return 0
        at = self._at + (tail % RING_SLOTS) * RECORD
        mem = self.mem
        mem[at:at + HEADER] = np.frombuffer(header, np.uint8)
        if payload is not None and payload.nbytes:
            mem[at + HEADER:at + HEADER + payload.nbytes] = np.frombuffer(payload, np.uint8)
        w[self._tail] = (tail + 1) & _WRAP  # after the record: a reader sees both
        fence()
        if w[_SLEEPING // 4]:
            w[_SLEEPING // 4] = 0
            w[_BELL // 4] = (w[_BELL // 4] + 1) & _WRAP
            futex_wake(self.base + _BELL)
        return 1 if w[_OPEN // 4] else 2
