"""Point-to-point messages on one node through shared memory: a receiver's inbox.

Each rank that receives through shared memory owns one *inbox*: a segment in /dev/shm
with one ring per rank of its node (the senders, in rank order), each ring a single
writer (that sender) and a single reader (this rank). A message is a record: the 64
bytes of its frame header (:mod:`minidist.wire`, exactly what the socket would carry),
then its payload of at most :data:`MESSAGE_BYTES`.

Layout::

    inbox header (64 bytes): OPEN, BELL, SLEEPING (int32 each), MAGIC (int64), rings
    per ring, CTRL (64) bytes: HEAD (int32, the reader's count of records taken) at 0,
              TAIL (int32, the writer's count of records written) at 32
    from data_at(rings) (a page boundary), per ring: RING_SLOTS records of RECORD
              bytes, record k in slot k % RING_SLOTS

The pages of /dev/shm an inbox uses grow with what is sent, not with the node: its
reader reserves the header and the rings' HEAD/TAIL words (64 bytes a ring), and a
sender reserves only its own ring's records, and of those only the pages its messages
reach (:meth:`Outbox.put`).

*OPEN* says whether the receiver reads its rings: a sender writes into a ring only
while it is 1 (and the ring has room); otherwise it uses the socket. *BELL* is the futex
word a waiting receiver sleeps on; *SLEEPING* says that one sleeps, so a sender makes
the wake-up system call only then.

Memory ordering (x86 TSO, as in :mod:`minidist.shm.fast_slots`): a writer stores the record,
then TAIL; a reader loads TAIL, then the record, then stores HEAD; stores become visible
in program order and a load is not reordered with an older load nor a store with an
older load, so a reader that sees TAIL sees the record, and a writer that sees HEAD
advanced finds its slot read. Two places need a full fence (Dekker's pattern, where TSO
lets a load pass an older store): the writer stores TAIL then loads OPEN and SLEEPING;
the reader stores OPEN = 0 (or SLEEPING = 1) then loads the TAILs. Each side fences
between its store and its load, so at least one side sees the other's store: either the
reader finds the record, or the writer sees the inbox closed (and rings the doorbell,
see :mod:`minidist.shm.p2p`) or sees the reader asleep (and wakes it).

A sender finds an inbox by name (its rank and the job's key, and the receiver's pid so
that a name left by a killed process can be swept) and maps it only if this user owns
it and nobody else may open it: a second local user can neither read nor fake one.

A larger message (up to what fits in :data:`STASH_BYTES`) waits in its sender's
*stash*: a segment that the sender alone writes, in blocks allocated in turn around it.
The sender copies the payload into a block, then writes a record whose header is the
message's own and whose payload is a descriptor (its pid, the block's offset, the size);
the receiver maps the stash (with the same checks as an inbox), copies the payload out
and then stores 1 into the block's DONE word, after which the sender may reuse the
block. The block is written before the record's TAIL and DONE is stored after the copy's
loads, so under TSO neither side sees the other's half-done work. The sender frees
blocks in the order it allocated them, and starts again from the beginning whenever all
are free, so a stash whose messages are taken promptly touches few pages.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import stat
import struct
from collections.abc import Sequence

import numpy as np

from .. import segments
from . import core
from .fast_slots import fence, futex_wait, futex_wake

MESSAGE_BYTES = 64 << 10  # the largest payload a message through an inbox carries
RING_SLOTS = 4
HEADER = 64
RECORD = HEADER + MESSAGE_BYTES
CTRL = 64  # a ring's HEAD and TAIL
RING = RING_SLOTS * RECORD  # a ring's records
PAGE = mmap.PAGESIZE
INBOX_KEY = 0x1B0C << 48  # the "group" part of an inbox's segment name, | the rank
MAGIC = 0x78_6F_62_6E_69_64_6D_31  # "1mdinbox"
BLOCK = 64  # a stash block's header (its DONE word) and alignment
STASH_BYTES = (16 << 20) + HEADER + BLOCK  # a sender's stash: a message of 16 MiB fits
STASH_KEY = 0x57A5 << 48  # the "group" part of a stash's segment name, | the rank
STASH_MAGIC = 0x68_73_61_74_73_64_6D_31  # "1mdstash"
STASH_STEP = 1 << 20  # a stash's pages are reserved this many bytes at a time
_DESC = struct.Struct("<qqq")  # a stash record's payload: pid, offset, nbytes
_OPEN, _BELL, _SLEEPING, _MAGIC, _RINGS = 0, 4, 8, 16, 24
_HEAD, _TAIL = 0, 32
_WRAP = 0x7FFFFFFF


def _box(seg: mmap.mmap, rings: int):
    """The inbox ``seg`` of ``rings`` rings as the compiled core's Box (None: the pure
    core runs it); the layout it follows is this module's."""
    if core.compiled is None:
        return None
    return core.compiled.Box(seg, rings, HEADER, CTRL, data_at(rings), RECORD, RING_SLOTS,
                             _OPEN, _BELL, _SLEEPING, _HEAD, _TAIL)


def data_at(rings: int) -> int:
    """Where the records of an inbox of ``rings`` rings begin (a page boundary)."""
    return -(-(HEADER + rings * CTRL) // PAGE) * PAGE


def ring_records(rings: int, ring: int) -> int:
    """Where ring ``ring``'s first record begins."""
    return data_at(rings) + ring * RING


def inbox_bytes(rings: int) -> int:
    return data_at(rings) + rings * RING


def inbox_name(job: str, rank: int, pid: int) -> str:
    return segments.segment_name(job, INBOX_KEY | rank, pid)


def stash_name(job: str, rank: int, pid: int) -> str:
    return segments.segment_name(job, STASH_KEY | rank, pid)


def _named(job: str, rank: int, name=inbox_name) -> list[tuple[str, int]]:
    """(path, creator's pid) of every inbox (or stash) name of ``rank`` in the job."""
    out = []
    for path in segments.named(name(job, rank, 0)[:-1]):
        with contextlib.suppress(ValueError):
            out.append((path, int(path.rsplit("-", 1)[1])))
    return out


def _sweep(job: str, rank: int, name) -> None:
    """Remove the names of ``rank``'s segments left by a killed process of this rank (a
    restart), or by an earlier init of this one."""
    for path, pid in _named(job, rank, name):
        if pid == os.getpid() or not segments.alive(pid):
            segments.unlink(os.path.basename(path))


def _made(job: str, name: str, size: int, reserved: int,
          what: str) -> tuple[mmap.mmap, int]:
    """A new segment with its first ``reserved`` bytes reserved, and its fd; NoRoom
    (said once per job, :func:`segments.warn_no_room`) if /dev/shm has no room."""
    try:
        return segments.create_open(name, size, reserved)
    except segments.NoRoom as e:
        segments.warn_no_room(job, e, what)
        raise


def _map_own(path: str, size: int | None) -> mmap.mmap | None:
    """Map ``path`` if it is a regular file of this user alone (of ``size`` bytes, if
    given); None otherwise."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or \
                st.st_mode & 0o077 or (size is not None and st.st_size != size) or \
                st.st_size < HEADER:
            return None
        return mmap.mmap(fd, st.st_size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _copy_out(src: np.ndarray, into: np.ndarray | None) -> np.ndarray:
    """``src`` copied into ``into`` if it has ``src``'s size (then ``into``), else a copy."""
    if into is not None and into.nbytes == src.nbytes:
        into[:] = src
        return into
    return src.copy()


class Inbox:
    """This rank's inbox (the reading side); ``rings`` senders, by ring index
    (``senders``: their global ranks, whose stashes hold the large messages)."""

    def __init__(self, job: str, rank: int, rings: int,
                 senders: Sequence[int] | None = None) -> None:
        self.name = inbox_name(job, rank, os.getpid())
        self.job = job
        self.rings = rings
        self.senders = range(rings) if senders is None else senders
        self._stashes: dict[tuple[int, int], np.ndarray] = {}  # (ring, pid) -> mapping
        _sweep(job, rank, inbox_name)
        # this rank reserves the header and the rings' HEAD and TAIL words; a ring's
        # records are reserved by its sender as its messages reach them (Outbox.put)
        self.seg, fd = _made(job, self.name, inbox_bytes(rings), HEADER + rings * CTRL,
                             f"the inbox of a rank with {rings} local peers")
        os.close(fd)
        self.mem = np.frombuffer(self.seg, np.uint8)
        self.words = self.mem.view(np.int32)
        self.base = self.mem.ctypes.data
        struct.pack_into("<qq", self.mem, _MAGIC, MAGIC, rings)
        self._find_rings(rings)
        self.mv = memoryview(self.mem)  # the segment's bytes and int32 words, read as
        self.ints = self.mv.cast("i")  # plain ints (cheaper than numpy's scalars)
        self.core = _box(self.seg, rings)

    def _find_rings(self, rings: int) -> None:
        """Ring r's HEAD and TAIL words and its records, found by arithmetic from
        ``self.words`` (no list with an entry per sender)."""
        end = (HEADER + rings * CTRL) // 4
        self._heads = self.words[(HEADER + _HEAD) // 4:end:CTRL // 4]
        self._tails = self.words[(HEADER + _TAIL) // 4:end:CTRL // 4]
        self._head0, self._tail0 = (HEADER + _HEAD) // 4, (HEADER + _TAIL) // 4
        self._stride = CTRL // 4
        self._data = data_at(rings)

    def take_if(self, ring: int, header: bytes, into: memoryview) -> bool:
        """Take the oldest record of ring ``ring`` if its header bytes are ``header``,
        which says that its payload is ``into.nbytes`` bytes (at most
        :data:`MESSAGE_BYTES`) in the record itself: copy the payload into ``into`` (a
        byte view) and remove the record (True); else change nothing (False)."""
        if self.core is not None:
            return self.core.take_if(ring, header, into)
        at = self._record(ring)
        mv = self.mv
        if at is None or mv[at:at + HEADER] != header:
            return False
        into[:] = mv[at + HEADER:at + HEADER + into.nbytes]
        self._advance(ring)  # after the copy
        return True

    def _advance(self, ring: int) -> None:
        """Remove ring ``ring``'s oldest record (after its last load)."""
        ints, h = self.ints, self._head0 + ring * self._stride
        ints[h] = (ints[h] + 1) & _WRAP

    def close(self) -> None:
        """Close the inbox to senders, remove its name and unmap it (and the stashes)."""
        self.words[_OPEN // 4] = 0
        if self.core is not None:
            self.core.release()
            self.core = None
        segments.unlink(self.name)
        self.ints.release()
        self.mv.release()
        self.words = self.mem = self.ints = self.mv = None
        self._stashes.clear()
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
        return self.ints[_BELL // 4]

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
        ints, at = self.ints, ring * self._stride
        return ints[self._tail0 + at] != ints[self._head0 + at]

    def nonempty(self) -> np.ndarray:
        """The indices of the rings that hold records not taken yet."""
        return np.flatnonzero(self._tails != self._heads)

    def _record(self, ring: int) -> int | None:
        """Where the oldest record of ring ``ring`` starts; None if it is empty."""
        ints, at = self.ints, ring * self._stride
        head = ints[self._head0 + at]
        if ints[self._tail0 + at] == head:
            return None
        return self._data + ring * RING + (head % RING_SLOTS) * RECORD

    def peek(self, ring: int) -> bytes | None:
        """The header bytes of the oldest record of ring ``ring``; None if it is empty."""
        at = self._record(ring)
        return None if at is None else self.mem[at:at + HEADER].tobytes()

    def take(self, ring: int, into: np.ndarray | None = None
             ) -> tuple[bytes, np.ndarray | None] | None:
        """The oldest record of ring ``ring``, removed from the ring: its header bytes
        and its payload, copied into ``into`` (bytes, used if the size is the
        payload's) or a new array; None if the ring is empty. The payload is None if the
        message waited in a stash that is gone (its sender left before it was taken)."""
        at = self._record(ring)
        if at is None:
            return None
        header = self.mem[at:at + HEADER].tobytes()
        nbytes = struct.unpack_from("<Q", header, 48)[0]  # wire header: nbytes
        if nbytes > MESSAGE_BYTES:
            payload = self._unstash(ring, self.mem[at + HEADER:at + HEADER + _DESC.size],
                                    nbytes, into)
        else:
            payload = _copy_out(self.mem[at + HEADER:at + HEADER + nbytes], into)
        self._advance(ring)  # after the copy
        return header, payload

    def _unstash(self, ring: int, desc: np.ndarray, nbytes: int,
                 into: np.ndarray | None) -> np.ndarray | None:
        """Copy a message out of its sender's stash and free its block."""
        pid, offset, size = _DESC.unpack(desc.tobytes())
        stash = self._stash(ring, pid)
        if stash is None:
            return None
        if size != nbytes or offset % BLOCK or offset < HEADER or \
                offset + BLOCK + nbytes > stash.size:
            return np.empty(0, np.uint8)  # not a record a sender wrote: refused as too small
        payload = _copy_out(stash[offset + BLOCK:offset + BLOCK + nbytes], into)
        stash.view(np.int32)[offset // 4] = 1  # DONE, after the copy's loads
        return payload

    def _stash(self, ring: int, pid: int) -> np.ndarray | None:
        """Ring ``ring``'s sender's stash (made by process ``pid``), mapped once."""
        got = self._stashes.get((ring, pid))
        if got is None:
            path = os.path.join(segments.SHM_DIR,
                                stash_name(self.job, self.senders[ring], pid))
            seg = _map_own(path, None)
            if seg is None:
                return None
            got = np.frombuffer(seg, np.uint8)
            if struct.unpack_from("<qq", got, 0) != (STASH_MAGIC, len(got)):
                return None
            self._stashes[(ring, pid)] = got
        return got


class Outbox:
    """Another rank's inbox of ``rings`` rings, mapped by a sender (the writing side of
    ring ``ring``). ``path``:
    the inbox's file, through which :meth:`put` reserves the ring's pages as its records
    reach them (None: a mapping whose pages need no reservation, the whole ring usable)."""

    def __init__(self, seg: mmap.mmap, rings: int, ring: int, path: str | None = None) -> None:
        self.seg = seg
        self.mem = np.frombuffer(seg, np.uint8)
        self.words = self.mem.view(np.int32)
        self.mv = memoryview(self.mem)  # bytes and int32 words as plain ints (see Inbox)
        self.ints = self.mv.cast("i")
        self.base = self.mem.ctypes.data
        at = HEADER + ring * CTRL
        self.ring = ring
        self.path = path
        self.core = _box(seg, rings)
        self._at = ring_records(rings, ring)
        self._head = (at + _HEAD) // 4
        self._tail = (at + _TAIL) // 4
        self.room = RECORD if path is None else 0  # bytes of each record reserved
        if self.core is not None:
            self.core.room(max(self.room, HEADER))

    @classmethod
    def attach(cls, job: str, rank: int, rings: int, ring: int) -> Outbox | None:
        """Map global rank ``rank``'s inbox to write ring ``ring``; None if it has none
        (yet) that this user owns alone and whose creator is alive."""
        size = inbox_bytes(rings)
        for path, pid in _named(job, rank):
            if not segments.alive(pid):  # a killed process's inbox: nobody reads it
                continue
            seg = _map_own(path, size)
            if seg is None:
                continue
            magic, count = struct.unpack_from("<qq", seg, _MAGIC)
            if magic == MAGIC and count == rings:
                out = cls(seg, rings, ring, path)
                try:  # the ring's first page of each record, before it writes one
                    if out.reserve(HEADER):
                        return out
                except segments.NoRoom as e:
                    segments.warn_no_room(job, e, "a message through a rank's inbox")
                out.close()
                return None
            seg.close()
        return None

    def reserve(self, nbytes: int) -> bool:
        """Reserve the first ``nbytes`` (rounded up to pages, at least double the room
        so far) of each of the ring's records; False if the inbox is gone. NoRoom if
        /dev/shm has no room."""
        want = min(RECORD, max(-(-nbytes // PAGE) * PAGE, 2 * self.room))
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if st.st_size != len(self.seg) or st.st_uid != os.geteuid():
                return False
            for slot in range(RING_SLOTS):
                segments.reserve(fd, self._at + slot * RECORD, want, "an inbox's ring")
        finally:
            os.close(fd)
        self.room = want
        if self.core is not None:
            self.core.room(want)
        return True

    def _grow(self, nbytes: int) -> bool:
        """More room for a record of ``nbytes`` bytes; False if there is none."""
        try:
            return self.reserve(nbytes)
        except segments.NoRoom:
            return False

    def close(self) -> None:
        if self.core is not None:
            self.core.release()
            self.core = None
        self.ints.release()
        self.mv.release()
        self.words = self.mem = self.ints = self.mv = None
        with contextlib.suppress(BufferError):
            self.seg.close()

    def has_room(self) -> bool:
        """Whether the inbox is open and this ring has a free slot (a slot stays free
        until this writer fills it)."""
        w = self.words
        return bool(w[_OPEN // 4]) and \
            (int(w[self._tail]) - int(w[self._head])) & _WRAP < RING_SLOTS

    def put(self, header: bytes, payload: memoryview | None) -> int:
        """Write one record: 0 if it was not written (the inbox is closed or the ring
        full, or /dev/shm has no room for it), 1 if written, 2 if written but the inbox
        closed meanwhile (the reader may not look again: ring its doorbell)."""
        if self.core is not None:
            done = self.core.put(self.ring, header, payload)
            if done != 3:
                return done
            nbytes = HEADER + memoryview(payload).nbytes
            return self.core.put(self.ring, header, payload) if self._grow(nbytes) else 0
        data = None if payload is None else memoryview(payload).cast("B")
        if data is not None and HEADER + data.nbytes > self.room and \
                not self._grow(HEADER + data.nbytes):
            return 0
        w = self.ints
        if not w[_OPEN // 4]:
            return 0
        tail = w[self._tail]
        if (tail - w[self._head]) & _WRAP >= RING_SLOTS:
            return 0
        at = self._at + (tail % RING_SLOTS) * RECORD
        mv = self.mv
        mv[at:at + HEADER] = header
        if data is not None and data.nbytes:  # (a C-contiguous array or bytes)
            mv[at + HEADER:at + HEADER + data.nbytes] = data
        w[self._tail] = (tail + 1) & _WRAP  # after the record: a reader sees both
        fence()
        if w[_SLEEPING // 4]:
            w[_SLEEPING // 4] = 0
            w[_BELL // 4] = (w[_BELL // 4] + 1) & _WRAP
            futex_wake(self.base + _BELL)
        return 1 if w[_OPEN // 4] else 2


class Stash:
    """This rank's stash of large messages (the writing side): blocks allocated in
    turn around the segment, freed in that order once their receivers took them."""

    def __init__(self, job: str, rank: int, size: int = STASH_BYTES) -> None:
        self.name = stash_name(job, rank, os.getpid())
        self.job = job
        _sweep(job, rank, stash_name)
        # its blocks' pages are reserved as they are first needed (see _reserve)
        self.seg, self._fd = _made(job, self.name, size, STASH_STEP,
                                   "a rank's stash of large messages")
        self.reserved = min(size, STASH_STEP)
        self.mem = np.frombuffer(self.seg, np.uint8)
        self.words = self.mem.view(np.int32)
        self.size = size
        struct.pack_into("<qq", self.mem, 0, STASH_MAGIC, size)
        self.blocks: collections.deque[tuple[int, int, int]] = collections.deque()

    def close(self) -> None:
        """Remove the stash's name and unmap it (a receiver that mapped it keeps it)."""
        segments.unlink(self.name)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.words = self.mem = None
        self.blocks.clear()
        with contextlib.suppress(BufferError):
            self.seg.close()

    def outstanding(self) -> list[int]:
        """The receivers (global ranks) of the blocks not taken yet, oldest first."""
        self._free()
        return [dst for _, _, dst in self.blocks]

    def _free(self) -> None:
        blocks, words = self.blocks, self.words
        while blocks and words[blocks[0][0] // 4]:
            blocks.popleft()

    def _place(self, need: int) -> int | None:
        self._free()
        if not self.blocks:
            return HEADER if HEADER + need <= self.size else None
        first, end = self.blocks[0][0], self.blocks[-1][1]
        if end > first:  # not wrapped: after the last block, or from the start
            if end + need <= self.size:
                return end
            return HEADER if HEADER + need <= first else None
        return end if end + need <= first else None

    def put(self, payload: np.ndarray, dst: int) -> bytes | None:
        """Copy ``payload`` (bytes) into a new block for global rank ``dst``: the
        record's descriptor, or None if there is no room (nothing was changed)."""
        need = BLOCK + -(-payload.nbytes // BLOCK) * BLOCK
        at = self._place(need)
        if at is None or not self._reserve(at + need):
            return None
        self.words[at // 4] = 0  # DONE: not yet (a receiver stores 1)
        self.mem[at + BLOCK:at + BLOCK + payload.nbytes] = payload
        self.blocks.append((at, at + need, dst))
        return _DESC.pack(os.getpid(), at, payload.nbytes)

    def _reserve(self, end: int) -> bool:
        """Whether the stash's first ``end`` bytes have their pages (reserving more, in
        steps of STASH_STEP, if not); False (said once per job) if /dev/shm has no room."""
        if end <= self.reserved:
            return True
        upto = min(self.size, -(-end // STASH_STEP) * STASH_STEP)
        try:
            segments.reserve(self._fd, self.reserved, upto - self.reserved, "a stash")
        except segments.NoRoom as e:
            segments.warn_no_room(self.job, e, "a large message through a rank's stash")
            return False
        self.reserved = upto
        return True

    def unput(self) -> None:
        """Free the newest block (its record was not written)."""
        self.blocks.pop()
