"""Small collectives on one node through shared memory, run by the caller's thread.

For an all_reduce, broadcast or barrier of at most :data:`SLOT_BYTES` on a group whose
ranks share a node, no socket and no event loop is involved: every rank writes its
contribution into its own slot of the group's small segment, publishes the slot's
number, and reads the others' slots once their numbers show they are complete. A
waiter spins briefly while the group's ranks fit the cores; while they are a few per
core it yields the core instead (``sched_yield``: a peer with work on the same core runs
at once, where a sleep and a wake-up cost a trip through the scheduler on both sides);
either gets shorter after each try that did not pay, so a crowded machine's cores go to
ranks with work. Then it sleeps on a futex (the slot number itself), which the writer
wakes; idle waiters cost nothing.

Layout: per rank, two slots (fast calls alternate between them), each a 64-byte
header then the payload. The header holds the slot number (int32, the futex word; the
count of fast calls of the group, plus one) and the call's signature.

Memory ordering. A writer stores the payload and the signature, then the slot number;
a reader loads the slot number, then the payload. On x86 (TSO) stores become visible
in program order and loads are not reordered with older loads, and each of these
stores and loads is a separate call into numpy's C code, which the compiler cannot
reorder across; so a reader that sees the new number sees the payload.

A writer calls ``FUTEX_WAKE`` only when a waiter said it sleeps (a flag word beside
the futex word: the wake is a system call, and with peers that spin it is wasted).
This is Dekker's pattern, and TSO lets a load pass an older store, so each side
fences between its store and its load: the waiter stores the flag, then the kernel's
futex wait takes a lock (a locked instruction: a full fence on x86) before it compares
the futex word with the value the waiter saw; the writer stores the number, fences (a
lock acquired: a locked instruction), then loads the flag. So either the waiter's
kernel sees the new number and does not sleep, or the writer sees the flag and wakes
it. (A wake that were lost anyway would cost one sleep slice, not a hang.) On other
architectures the fast path is off.

Reuse. Fast call ``f`` uses slot ``f % 2``. A rank writes slot ``p`` for call ``f + 2``
only after it finished call ``f + 1``, which needed every rank's slot for ``f + 1``,
which each rank writes only after it finished reading call ``f``. So a slot is never
overwritten while someone still reads it.

Late ranks. The reuse argument counts on every rank finishing each call. A rank that
gives up on one instead (its deadline passed while a peer was stopped, a peer died,
an interrupt) returns to its caller while a peer that was stopped mid-call may still
read its slot, its chunks or, for reads in place, its arrays; that peer may resume at
any moment, long after everyone else gave up on it. So a rank that gives up never
writes the segment again (:meth:`Slots.run` refuses every later call on the group on
that rank before it writes anything, whatever the rest of the process knows yet), and
what it left there stays as it was: a late reader of a call's slots or chunks reads
the bits that call wrote, never a later call's. Arrays read in place (below) belong to
the caller, who may change them as soon as the call returns; so a rank that gives up
also stores its group rank in the give-up word before it returns, and a rank that read
peers' arrays loads that word after its reads (behind a fence) and raises instead of
returning if anyone gave up: by the ordering argument above, a read that saw a changed
array is followed by a load that sees the word. Either way a late rank returns the
right bits or raises; it never returns another call's data.

Groups of more than :data:`CENTRAL_ABOVE` ranks gather, then release (and group rank 0
reduces an all_reduce once, into its own payload, which the others copy): each other rank,
once its slot is written, adds one to group rank 0's *arrived* count with the kernel's
atomic ``FUTEX_WAKE_OP``, which also wakes rank 0 when the count becomes complete;
rank 0 sleeps on that count, then sets it back to 0, stores the call's number into its
*release* word (in its slot's header) and wakes all its sleepers; the others wait on
that one word, then read whatever slots they need. Every rank then sleeps and wakes
once per call, where waiting on each peer in turn woke a waiter once per peer that
had not arrived yet: on a crowded machine (64 ranks on 2 cores) most of a call's time.
The count of call ``f``'s parity is reset before ``f`` is released, and the next adds
to it come from call ``f + 2``, after ``f + 1`` was released. The release of call ``f``
is stored only after every rank wrote its slot for ``f``, so the reuse argument above
holds unchanged, and rank 0 releases even when the signatures differ: every rank then
finds the mismatch itself.

An all_reduce above :data:`SLOT_BYTES` (up to :data:`MID_BYTES`, on groups of at most
:data:`MID_RANKS`) takes the same path through a larger area after the slots: two
banks, each with room (:func:`room_bytes`) for one chunk of the vector
(:func:`chunk_bytes`) per rank and one for the result.
Each chunk of the vector is cut into one share per rank; a rank copies into its chunk
the shares that the others reduce, reduces its own share across all ranks (its own
part read in place from its vector) into the result chunk, copies that share of the
result into its vector at once, :data:`MID_PIECE` bytes at a time (each piece while it
is still in this core's L2 cache), and the others' shares after the next barrier.
The steps are ordered by barriers, each a fast call's number without payload (a call
of ``m`` chunks uses ``m + 1`` numbers), pipelined as

    copy in 0 | B0 | reduce 0, copy in 1 | B1 | copy out 0, reduce 1, copy in 2 | B2 | ...

(where "reduce j" includes copying this rank's share of it out).

Chunk ``j`` of a call whose first number is ``f`` uses bank ``(f + j) % 2``. What a
rank writes after barrier ``k`` (its chunk of bank ``(k + 1) % 2``, the result of bank
``k % 2``) was last read before barrier ``k`` by everyone (reduce ``k - 1``, copy out
``k - 2``). The first barrier compares the signatures, so the vector is first written
(reduce 0, after B0) only once every rank is known to call the same thing; each
element is reduced once, by one rank, in rank order, so every rank gets the same bits.

A small mid-area all_reduce (:func:`gathers`: ``size * nbytes`` at most
:data:`GATHER_BYTES`) uses one number ``f`` and one barrier: every rank copies its
whole vector into its chunk of bank ``f % 2``, and after the barrier (which compares
the signatures) reduces all chunks in rank order into its result, so every rank
computes the same bits. A chunk of bank ``f % 2`` is next written for number ``f + 2``,
after barrier ``f + 1``, which every rank reaches only once it has read them.

A broadcast above :data:`SLOT_BYTES` (on a group of at most :data:`MID_RANKS`) goes
through the same banks, in steps of their ranks' chunks (:func:`bank_bytes`, ``size``
rooms; never the result chunk, which a late rank may still be copying a
chunked all_reduce's last result out of): step ``j`` of a call whose first number is
``f`` is copied in by the root into bank ``(f + j) % 2``, then barrier ``f + j`` (the
first compares the signatures), then copied out by the others while the root copies
in step ``j + 1``. A rank's chunks of bank ``b`` are written, by any call, only after
the barrier that follows every read of them: the root writes step ``j + 1`` after
barrier ``f + j``, which the others reach only after copying out step ``j - 1`` of the
same bank, and a call's first writes go to the bank its predecessor's last barrier did
not (a one-barrier all_reduce, a broadcast's step) or to the chunks that it read only
before that barrier (a chunked all_reduce's last chunk).

An all_reduce above :data:`DIRECT_MIN` (above :data:`DIRECT_MIN_WIDE` on groups of
more than :data:`MID_RANKS`) on a group whose ranks can read each other's memory
(:mod:`minidist.peer_memory`; the planner knows from every rank's key) takes
three fast-call numbers, whatever its size. B0 publishes each rank's pid and the
addresses of its vector and result (and compares the signatures); then each rank reads
the others' parts of its share (its 1/n of the vector), :data:`DIRECT_CHUNK` bytes
per peer at a time, and reduces them in rank order into its result; B1; each rank
reads every other share from the result of the rank that reduced it; B2, after which
nobody reads this rank's arrays, so it may return. Between B0 and B1 a rank writes only
its own share of its result, which nobody reads before B1 (the others read their own
shares of its vector, which is its result too when the call is in place); between B1
and B2 nobody writes. A peer's process that is gone makes the read fail (ESRCH):
PeerLostError.

Every wait is bounded: it sleeps in slices of at most 0.1 s and checks the call's
deadline, peers that died or left, an abort of the group and the rendezvous between
slices; after 1 s it reports the call to the rendezvous (the stall check that finds
ranks that called different things).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import threading
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from .. import ops, peer_memory
from ..errors import CollectiveMismatchError, DistError, PeerLostError, again
from ..group import Group
from ..ops import ReduceOp
from . import area_layout, core

FAST_COLLECTIVES = ("all_reduce", "broadcast", "barrier")
SLOT_BYTES = 4096  # the largest payload of a fast call
MID_BYTES = 16 << 20  # the largest all_reduce through the mid area
GATHER_BYTES = 512 << 10  # every rank reduces whole an all_reduce of at most this / ranks
MID_RANKS = 8  # ... on groups of at most this many ranks
MID_CHUNK = 1 << 20  # bytes of the vector per chunk of the mid area
MID_CHUNK_PAIR = 2 << 20  # ... on groups of two ranks, for vectors of two such chunks or more
MID_PIECE = 128 << 10  # bytes a rank reduces, then copies out, while they are in its L2
DIRECT_MIN = 16 << 20  # all_reduces above this read the peers' vectors (peer_memory)
DIRECT_MIN_WIDE = 4 << 20  # ... on groups of more than MID_RANKS (no mid area)
DIRECT_CHUNK = 512 << 10  # bytes per peer that a reducing rank reads at a time
MAX_RANKS = 64  # larger groups: the tree and dissemination schedules scale better
HEADER = 64
SLOT = HEADER + SLOT_BYTES
CENTRAL_ABOVE = 8  # larger groups gather at group rank 0, then are released
RELEASE = 48  # the release word's offset in a slot's header (bytes)
SLEEPING = 52  # flag: someone sleeps on this slot's number word (offset in the header)
SLEEPING_RELEASE = 56  # flag: someone sleeps on its release word
ARRIVED = 60  # group rank 0's count of the others that arrived (central groups)
DIFFERS = 44  # rank 0 stores the call's number here when the signatures differ
GAVE_UP = 40  # in group rank 0's first header: 1 + the group rank that gave up a call
SPIN_SECONDS = 50e-6  # how long a waiter spins when the group fits the cores
YIELD_SECONDS = 200e-6  # how long it yields its core when the group does not
YIELD_RANKS_PER_CORE = 4  # more than this many ranks per core: sleep at once
SLICE = 0.1  # seconds a waiter sleeps at most between checks
IDLE_SLICE = 1.0  # ... once it waited past the stall report (rooted calls, messages)
STALL_REPORT = 1.0
_SIG = struct.Struct("<iiiiqqI")  # kind, dtype, op, root, count, seq, shape
_WHERE = struct.Struct("<qqq")  # a rank that is read: its pid, its vector, its result
_NOTHING = np.empty(0, np.uint8)  # the payload of a barrier

_SYS_FUTEX = {"x86_64": 202, "AMD64": 202}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc() if _SYS_FUTEX is not None else None


def available() -> bool:
    """True where the fast path can run: Linux on x86-64 (futexes and TSO ordering)."""
    return _LIBC is not None and os.path.isdir("/dev/shm")


_SLEEPING: dict[int, int] = {}  # thread id -> the futex address it sleeps on


def _futex_wait(addr: int, seen: int, timeout: float) -> None:
    """Sleep while the int32 at ``addr`` still holds ``seen`` (at most ``timeout``, or
    until :func:`wake_sleepers`)."""
    ts = _Timespec(int(timeout), int((timeout % 1) * 1e9))
    tid = threading.get_ident()
    _SLEEPING[tid] = addr
    try:
        _LIBC.syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAIT, ctypes.c_int(seen),
                      ctypes.byref(ts), None, 0)
    finally:
        _SLEEPING.pop(tid, None)


def _wake_sleepers() -> None:
    """Wake every thread of this process that sleeps in :func:`futex_wait` (news of a
    peer: it looks again now, not at the end of its slice)."""
    for addr in list(_SLEEPING.values()):
        _futex_wake(addr)


def _futex_wake(addr: int) -> None:
    """Wake every process sleeping on the int32 at ``addr``."""
    _LIBC.syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


_FUTEX_WAKE_OP, _FUTEX_OP_ADD, _FUTEX_OP_CMP_EQ = 5, 1, 0


_SPARE = ctypes.c_int32(0)  # FUTEX_WAKE_OP's first word: nobody ever sleeps on it
_SPARE_P = ctypes.c_void_p(ctypes.addressof(_SPARE))
_ONE_P = ctypes.c_void_p(1)  # FUTEX_WAKE_OP's count of sleepers to wake on its second word


def _futex_add(addr: int, equals: int) -> None:
    """Atomically add 1 to the int32 at ``addr`` (a locked instruction in the kernel: a
    full fence) and wake one sleeper on it only if it held ``equals`` before (< 4096).
    The kernel's FUTEX_WAKE_OP wakes one sleeper on its *first* word whatever it is
    told (its loop wakes before it counts), so the first word is one nobody sleeps on:
    with the count there, every add woke the group's rank 0."""
    op = (_FUTEX_OP_ADD << 28) | (_FUTEX_OP_CMP_EQ << 24) | (1 << 12) | (equals & 0xFFF)
    _LIBC.syscall(_SYS_FUTEX, _SPARE_P, _FUTEX_WAKE_OP, 0, _ONE_P, ctypes.c_void_p(addr), op)


_FENCE = threading.Lock()


def _fence() -> None:
    """A full memory fence: acquiring a free lock is a locked instruction on x86."""
    _FENCE.acquire()
    _FENCE.release()


if core.compiled is not None:  # the same calls, compiled (the GIL released while asleep)
    futex_wait = core.compiled.futex_wait
    futex_wake = core.compiled.futex_wake
    futex_add = core.compiled.futex_add
    fence = core.compiled.fence
    wake_sleepers = core.compiled.wake_sleepers
else:
    futex_wait, futex_wake, futex_add = _futex_wait, _futex_wake, _futex_add
    fence, wake_sleepers = _fence, _wake_sleepers


def _mid_at(size: int) -> int:
    return -(-size * 2 * SLOT // 4096) * 4096 + area_layout.area_bytes(size)


def room_bytes(size: int) -> int:
    """The room of each chunk of the mid area of a group of ``size`` ranks: the largest
    :func:`chunk_bytes` there."""
    return MID_CHUNK_PAIR if size == 2 else MID_CHUNK


def chunk_bytes(size: int, nbytes: int) -> int:
    """The bytes of the vector per chunk of a chunked all_reduce of ``nbytes`` on a group
    of ``size`` ranks: MID_CHUNK_PAIR for two ranks and a vector of at least two such
    chunks, else MID_CHUNK (measured: the larger chunk pays only there)."""
    return MID_CHUNK_PAIR if size == 2 and nbytes >= 2 * MID_CHUNK_PAIR else MID_CHUNK


def segment_bytes(size: int) -> int:
    """The shared segment of a group of ``size`` ranks: its slots, then (for groups of at
    most MID_RANKS) the mid area. Its pages are reserved when it is made
    (:mod:`minidist.shm.shared_setup`): whole, or the slots alone when /dev/shm is short."""
    if size > MID_RANKS:
        return _mid_at(size)  # the slots and the rooted calls' area (minidist.shm.rooted_area)
    return _mid_at(size) + 2 * (size + 1) * room_bytes(size)


def bank_bytes(size: int) -> int:
    """The bytes of the ranks' chunks of one bank of the mid area of a group of ``size``
    ranks (not its result chunk, which a late rank may still be copying out of): what
    one step of a broadcast through it carries."""
    return size * room_bytes(size)


def takes(collective: str, size: int, nbytes: int, direct: bool = False) -> bool:
    """Whether a call of ``collective`` (a lower-case name) of ``nbytes`` on a group of
    ``size`` ranks fits the fast path (when its group is on one node and the fast path
    is allowed): all_reduce, broadcast and barrier up to SLOT_BYTES on up to MAX_RANKS
    ranks; all_reduce up to MID_BYTES and every broadcast on up to MID_RANKS ranks; with
    ``direct`` (the ranks can read each other's memory), every all_reduce above
    DIRECT_MIN (above DIRECT_MIN_WIDE on more than MID_RANKS ranks) on up to MAX_RANKS
    ranks."""
    if collective == "all_reduce" and (
            (reads_peers(collective, nbytes, direct, size) and size <= MAX_RANKS)
            or (nbytes <= MID_BYTES and size <= MID_RANKS)):
        return True
    if collective == "broadcast" and size <= MID_RANKS:
        return True
    return collective in FAST_COLLECTIVES and nbytes <= SLOT_BYTES and size <= MAX_RANKS


def reads_peers(collective: str, nbytes: int, direct: bool, size: int = 2) -> bool:
    """Whether a fast call (see :func:`takes`) on ``size`` ranks reads its peers'
    vectors in place: an all_reduce above DIRECT_MIN, or above DIRECT_MIN_WIDE on a
    group too large for the mid area."""
    least = DIRECT_MIN if size <= MID_RANKS else DIRECT_MIN_WIDE
    return direct and collective == "all_reduce" and nbytes > least


def gathers(nbytes: int, size: int) -> bool:
    """Whether a mid-area all_reduce of ``nbytes`` on ``size`` ranks is small enough
    (``size * nbytes`` at most GATHER_BYTES) that every rank copies in its whole vector
    and reduces all of them (one barrier) rather than its share (two barriers and a
    copy out): each rank reads all ``size`` vectors, which pays while they stay in the
    caches."""
    return SLOT_BYTES < nbytes and size * nbytes <= GATHER_BYTES and size <= MID_RANKS


def numbers(nbytes: int, itemsize: int, reads: bool = False, size: int = 2,
            collective: str = "all_reduce") -> int:
    """How many of its group's fast-call numbers a fast call of ``collective`` of
    ``nbytes`` on a group of ``size`` ranks uses (``reads``: one that reads its peers'
    vectors, see :func:`reads_peers`)."""
    if reads:
        return 3
    if nbytes <= SLOT_BYTES or gathers(nbytes, size):
        return 1
    if collective == "broadcast":
        return -(-nbytes // bank_bytes(size))
    chunk = chunk_bytes(size, nbytes) // itemsize
    return -(-(nbytes // itemsize) // chunk) + 1


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Patience:
    """How long a waiter spins, then yields its core, before it sleeps: it spins (up to
    ``spin`` seconds) while the ranks that wait fit the cores, else yields (up to
    YIELD_SECONDS) while they are at most YIELD_RANKS_PER_CORE per core, else sleeps at
    once. A spin or yield that did not pay is halved for the next wait, down to nothing
    (a crowded machine's cores go to the ranks that have work); one that paid returns to
    its full length."""

    def __init__(self, spin: float | None = None) -> None:
        self.cores = cores()
        self._spin = SPIN_SECONDS if spin is None else spin
        self.full = (0.0, 0.0)  # (spin, yield) after :meth:`fit`
        self.waits = 0  # waits begun (:meth:`first`)
        self.spin = self.yielding = 0.0

    def fit(self, ranks: int, quiet: bool = True) -> None:
        """Set the full lengths for ``ranks`` ranks on these cores (``quiet``: the
        machine has cores to spare), and start from them."""
        spin = self._spin if ranks <= self.cores and quiet else 0.0
        few = ranks <= YIELD_RANKS_PER_CORE * self.cores
        self.full = (spin, YIELD_SECONDS if few and not spin else 0.0)
        self.reset()

    def reset(self) -> None:
        """Back to the full lengths."""
        self.spin, self.yielding = self.full

    def first(self, ready: Callable[[], bool], now: float, ranks: int) -> bool:
        """A wait of a group of ``ranks`` ranks begins: counted (every 1024th probes
        the machine again: it may be quiet now), then :meth:`wait` if this waiter spins
        or yields at all."""
        self.waits += 1
        if self.waits % 1024 == 0:
            self.fit(ranks, quiet=os.getloadavg()[0] < self.cores)
        return bool(self.spin or self.yielding) and self.wait(ready, now)

    def wait(self, ready: Callable[[], bool], now: float) -> bool:
        """Spin or yield until ``ready()`` (True), or for as long as this waiter's
        patience lasts (False); ``now``: ``time.monotonic()`` at the start."""
        if self.spin:
            end = now + self.spin
            while time.monotonic() < end:
                if ready():
                    self.spin = self.full[0]
                    return True
            self.spin = self.spin / 2 if self.spin > 2e-6 else 0.0
        elif self.yielding:
            end = now + self.yielding
            while True:
                os.sched_yield()
                if ready():
                    self.yielding = self.full[1]
                    return True
                if time.monotonic() >= end:
                    break
            self.yielding = self.yielding / 2 if self.yielding > 5e-6 else 0.0
        return False


class Hooks(Protocol):
    """What a fast call asks its session while it waits (from the caller's thread)."""

    def gone(self, group: Group, rank: int) -> DistError | None:
        """The error for global ``rank`` of ``group``, which died or left (or None)."""

    def broken(self, call) -> DistError | None:
        """The error that made ``call``'s group unusable (an abort; or None)."""

    def anyone_gone(self) -> bool:
        """Cheaply: whether ``gone`` could answer for any rank at all."""

    def stalled(self, call) -> None:
        """``call`` has waited :data:`STALL_REPORT` seconds (called once)."""

    def timed_out(self, call, waiting: list[int]) -> DistError:
        """The error of ``call`` past its deadline while ranks ``waiting`` had not
        arrived."""


class Slots:
    """One group's fast slots in a shared mapping, seen from group rank ``me``."""

    def __init__(self, buf, group: Group, me: int) -> None:
        self.group = group
        self.me = me
        self.size = group.size
        self.mem = np.frombuffer(buf, np.uint8, segment_bytes(self.size))
        self.mid_at = _mid_at(self.size)
        self.room = room_bytes(self.size)
        self.base = self.mem.ctypes.data
        self.words = self.mem.view(np.int32)  # the slot numbers, by int32 index
        self.patience = Patience()
        self.patience.fit(self.size)
        self.central = self.size > CENTRAL_ABOVE
        self._scratch = np.empty(0, np.uint8)
        self._views: dict[tuple, list[np.ndarray]] = {}  # see _typed
        self.gave_up: BaseException | None = None  # what ended a call early on this rank

    def _word(self, rank: int, parity: int) -> int:
        return ((rank * 2 + parity) * SLOT) // 4

    def _payload(self, rank: int, parity: int, nbytes: int) -> np.ndarray:
        at = (rank * 2 + parity) * SLOT + HEADER
        return self.mem[at:at + nbytes]

    def _sig(self, rank: int, parity: int) -> tuple:
        at = (rank * 2 + parity) * SLOT + 4
        return _SIG.unpack_from(self.mem, at)

    def run(self, f: int, call, out: np.ndarray, src: np.ndarray, op: ReduceOp,
            deadline: float, hooks: Hooks, reads: bool = False) -> None:
        """Run fast call number ``f`` of the group (calls run in that order): ``src`` is
        this rank's contribution (the root's data for a broadcast, nothing for a
        barrier), ``out`` where the result goes; a wait past ``deadline``, a peer gone
        or an abort raises (``hooks`` say which). ``reads``: an all_reduce that reads the
        peers' vectors (:func:`reads_peers`; every rank of the call says the same)."""
        if self.gave_up is not None:
            raise self._refused(call)
        try:
            waits = (deadline, hooks, call)
            if reads:
                self._run_reads(f, call, out, src, op, waits)
                return
            if out.nbytes > SLOT_BYTES:
                if call.kind == _BROADCAST:
                    self._run_bcast(f, call, out, src, waits)
                elif gathers(out.nbytes, self.size):
                    self._run_gather(f, call, out, src, op, waits)
                else:
                    self._run_mid(f, call, out, src, op, waits)
                return
            parity, number = f % 2, (f + 1) & 0x7FFFFFFF
            me = self.me
            views = self._views.get((parity, out.dtype, out.size))
            if views is None:
                views = self._typed(parity, out.dtype, out.size)
            mine = self._publish(parity, number, call, src, views[me] if src.size else None)
            waiting = (parity, number, *waits)
            if self.central:
                head = self._word(0, parity)
                if me == 0:
                    self._wait(head + ARRIVED // 4, self.size - 1, None, None, *waiting)
                    self.words[head + ARRIVED // 4] = 0
                    differs = self._differing(mine, parity)
                    if differs is not None:
                        self.words[head + DIFFERS // 4] = number
                    elif call.kind == _ALL_REDUCE:  # once, for all: they copy the result
                        ops.reduce_all_into(op, out, views)
                        views[0][:] = out
                    self.words[head + RELEASE // 4] = number  # after those stores
                    self._wake(head + RELEASE // 4, SLEEPING_RELEASE - RELEASE)
                else:
                    futex_add(self.base + (head + ARRIVED // 4) * 4, self.size - 2)
                    self._wait(head + RELEASE // 4, number, head + SLEEPING_RELEASE // 4, 0,
                               *waiting)
                    # rank 0 compared every signature with its own: compare with it alone,
                    # unless it said that some differ (then find which, to say so)
                    differs = (self._differing(mine, parity)
                               if self.words[head + DIFFERS // 4] == number
                               else self._differing(mine, parity, only=0))
            else:
                self._meet(parity, number, waiting)
                differs = self._differing(mine, parity)
            if differs is not None:
                raise self._mismatch(call, differs, self._sig(differs, parity))
            if call.kind == _BROADCAST:
                root = self.group.rank_of(call.root)
                if root != me:
                    out[:] = views[root]
            elif call.kind == _ALL_REDUCE:
                if not self.central:
                    ops.reduce_all_into(op, out, views)  # in rank order: the same bits
                elif me != 0:  # group rank 0 left the result in its payload
                    out[:] = views[0]
        except BaseException as e:  # whatever ends a call early: this rank is done here
            self._give_up(e)
            raise

    def _give_up(self, exc: BaseException) -> None:
        """A call ended early on this rank (an error, a timeout, an interrupt): from now
        on this rank never writes the segment again (see "Late ranks" in the module),
        and it says so in the group's give-up word, which a rank reading its peers'
        vectors checks after its reads."""
        if self.gave_up is None:
            self.gave_up = exc
            self.words[GAVE_UP // 4] = self.me + 1

    def _refused(self, call) -> DistError:
        return again(self.gave_up, f"{call.describe()} on {self.group!r} (call "
                     f"#{call.seq}) refused on rank {self.group.ranks[self.me]}: an earlier "
                     "call on the group ended early on this rank")

    def _peers_stayed(self, call) -> None:
        """After reading peers' vectors in place: DistError if any rank gave up a call on
        the group, since it may have changed its vector while this rank read it (it
        stores the give-up word before it returns to its caller, and x86 makes those
        stores visible in order; the fence orders this load after the reads)."""
        fence()
        who = int(self.words[GAVE_UP // 4])
        if who:
            rank = self.group.ranks[who - 1]
            raise DistError(
                f"{call.describe()} on {self.group!r} (call #{call.seq}): rank {rank} gave "
                "up on the call while rank "
                f"{self.group.ranks[self.me]} was reading its vector (this rank was "
                "probably stopped or too slow); the data read cannot be trusted")

    def _typed(self, parity: int, dtype: np.dtype, count: int) -> list[np.ndarray]:
        """Every rank's payload of slot ``parity`` as ``count`` elements of ``dtype``
        (kept for the next call of that shape: making them costs more than a small
        call's copies)."""
        if len(self._views) >= 256:
            self._views.clear()
        nbytes = count * dtype.itemsize
        views = self._views[(parity, dtype, count)] = [
            self._payload(r, parity, nbytes).view(dtype) for r in range(self.size)]
        return views

    def _publish(self, parity: int, number: int, call, data: np.ndarray,
                 into: np.ndarray | None = None) -> tuple:
        """Write this rank's payload (``data``, bytes; or into ``into``, this rank's
        payload as ``data``'s type) and signature, then its slot number; its signature."""
        me = self.me
        if into is not None:
            into[:] = data
        elif data.size:
            self._payload(me, parity, data.size)[:] = data
        _SIG.pack_into(self.mem, (me * 2 + parity) * SLOT + 4, call.kind, call.dtype,
                       call.op, call.root, call.count, call.seq, call.shape)
        self.words[self._word(me, parity)] = number  # after the payload: readers see both
        return self._sig(me, parity)

    def _meet(self, parity: int, number: int, waiting: tuple) -> None:
        """Wake the sleepers on this rank's slot (just published), then wait for every
        other rank's."""
        self._wake(self._word(self.me, parity), SLEEPING)
        for r in range(self.size):
            if r != self.me:
                at = self._word(r, parity)
                self._wait(at, number, at + SLEEPING // 4, None, *waiting)

    def _mid(self, bank: int, slot: int, dtype: np.dtype) -> np.ndarray:
        """Chunk ``slot`` (a group rank, or ``size`` for the result) of a mid-area bank."""
        at = self.mid_at + (bank * (self.size + 1) + slot) * self.room
        return self.mem[at:at + self.room].view(dtype)

    def _run_bcast(self, f: int, call, out: np.ndarray, src: np.ndarray,
                   waits: tuple) -> None:
        """A broadcast of more than a slot through the mid area (see the module): the
        root copies step ``j`` into the ranks' chunks of bank ``(f + j) % 2``; after
        barrier ``f + j`` the others copy it out while the root copies in step ``j + 1``."""
        root = self.group.rank_of(call.root)
        data = (src if self.me == root else out).view(np.uint8).reshape(-1)
        span, total = bank_bytes(self.size), out.nbytes
        for j in range(-(-total // span)):
            lo, hi = j * span, min(total, (j + 1) * span)
            at = self.mid_at + ((f + j) % 2) * span
            bank = self.mem[at:at + hi - lo]
            if self.me == root:
                bank[:] = data[lo:hi]
            self._barrier(f + j, call, _NOTHING, waits, check=j == 0)
            if self.me != root:
                data[lo:hi] = bank

    def _run_gather(self, f: int, call, out: np.ndarray, src: np.ndarray, op: ReduceOp,
                    waits: tuple) -> None:
        """A small mid-area all_reduce (see :func:`gathers`): every rank copies its vector
        into its chunk of bank ``f % 2``; after one barrier each reduces all chunks, in
        rank order, into its result (reading its own from the chunk, so that ``out`` may
        be ``src``)."""
        bank, count, dt = f % 2, out.size, out.dtype
        self._mid(bank, self.me, dt)[:count] = src
        self._barrier(f, call, _NOTHING, waits, check=True)
        ops.reduce_all_into(op, out, [self._mid(bank, r, dt)[:count] for r in range(self.size)])

    def _run_mid(self, f: int, call, out: np.ndarray, src: np.ndarray, op: ReduceOp,
                 waits: tuple) -> None:
        """An all_reduce of more than a slot through the mid area (see the module)."""
        n, me, dt = self.size, self.me, out.dtype
        chunk = chunk_bytes(n, out.nbytes) // out.itemsize
        step = MID_PIECE // out.itemsize
        count = out.size
        m = -(-count // chunk)

        def bounds(j: int, r: int) -> tuple[int, int, int, int]:
            lo, hi = j * chunk, min(count, (j + 1) * chunk)
            return lo, hi, lo + (hi - lo) * r // n, lo + (hi - lo) * (r + 1) // n

        def copy_in(j: int) -> None:  # the shares the others reduce
            lo, hi, a, b = bounds(j, me)
            mine = self._mid((f + j) % 2, me, dt)
            mine[:a - lo] = src[lo:a]
            mine[b - lo:hi - lo] = src[b:hi]

        def reduce(j: int) -> None:  # this rank's share, across all, in rank order
            lo, hi, a, b = bounds(j, me)
            if a == b:
                return
            bank = (f + j) % 2
            parts = [src[a:b] if r == me else self._mid(bank, r, dt)[a - lo:b - lo]
                     for r in range(n)]
            res = self._mid(bank, n, dt)[a - lo:b - lo]
            for p in range(0, b - a, step):
                q = min(b - a, p + step)
                ops.reduce_all_into(op, res[p:q], [x[p:q] for x in parts])
                out[a + p:a + q] = res[p:q]  # while it is in this core's cache

        copy_in(0)
        for j in range(m + 1):
            self._barrier(f + j, call, _NOTHING, waits, check=j == 0)
            if j:
                lo, hi, a, b = bounds(j - 1, me)
                res = self._mid((f + j - 1) % 2, n, dt)
                out[lo:a] = res[:a - lo]  # the others' shares
                out[b:hi] = res[b - lo:hi - lo]
            if j < m:
                reduce(j)
            if j + 1 < m:
                copy_in(j + 1)

    def _barrier(self, f: int, call, data: np.ndarray, waits: tuple,
                 check: bool = False) -> None:
        """Fast call number ``f`` as a barrier that publishes ``data``; with ``check``,
        CollectiveMismatchError unless every rank's signature is this rank's."""
        parity, number = f % 2, (f + 1) & 0x7FFFFFFF
        mine = self._publish(parity, number, call, data)
        self._meet(parity, number, (parity, number, *waits))
        if check:
            differs = self._differing(mine, parity)
            if differs is not None:
                raise self._mismatch(call, differs, self._sig(differs, parity))

    def _run_reads(self, f: int, call, out: np.ndarray, src: np.ndarray, op: ReduceOp,
                   waits: tuple) -> None:
        """An all_reduce that reads the peers' vectors in place (see the module)."""
        n, me, item = self.size, self.me, out.itemsize
        count = out.size
        vec = np.ascontiguousarray(src)  # what the others read
        res = out if out.flags.c_contiguous else np.empty_like(out)
        where = _WHERE.pack(os.getpid(), vec.ctypes.data, res.ctypes.data)
        self._barrier(f, call, np.frombuffer(where, np.uint8), waits, check=True)
        peers = [_WHERE.unpack(self._payload(r, f % 2, _WHERE.size).tobytes())
                 for r in range(n)]
        hooks = waits[1]

        def read(r: int, into: np.ndarray, at: int) -> None:
            pid = peers[r][0]
            try:
                peer_memory.read(pid, into.ctypes.data, at, into.nbytes)
            except OSError as e:
                rank = self.group.ranks[r]
                err = hooks.gone(self.group, rank)
                if err is not None:
                    raise err from None
                if e.errno == errno.ESRCH:
                    raise PeerLostError(f"rank {rank} (process {pid}) exited during "
                                        f"{call.describe()} on {self.group!r}",
                                        ranks=[rank]) from None
                raise DistError(f"{call.describe()} on {self.group!r}: rank "
                                f"{self.group.ranks[me]} could not read rank {rank}'s "
                                f"vector ({e}); MINIDIST_SINGLE_COPY=0 turns these reads "
                                "off") from None

        # this rank's share, each element across all ranks in rank order, a piece at a
        # time (the pieces the others read land in one scratch row each)
        a, b = count * me // n, count * (me + 1) // n
        piece = max(1, DIRECT_CHUNK // item)
        width = min(piece, b - a)
        if self._scratch.nbytes < (n - 1) * width * item:
            self._scratch = np.empty((n - 1) * width * item, np.uint8)
        rows = self._scratch[:(n - 1) * width * item].view(out.dtype).reshape(n - 1, width)
        for lo in range(a, b, piece):
            hi = min(b, lo + piece)
            parts = []
            for r in range(n):
                if r == me:
                    parts.append(vec[lo:hi])
                else:
                    row = rows[r - (r > me), :hi - lo]
                    read(r, row, peers[r][1] + lo * item)
                    parts.append(row)
            if n == 2:
                ops.reduce_into(op, res[lo:hi], parts[0], parts[1])
                continue
            acc = parts[1] if me == 0 else parts[0]  # a scratch row
            ops.reduce_into(op, acc, parts[0], parts[1])
            for part in parts[2:-1]:
                ops.reduce_into(op, acc, acc, part)
            ops.reduce_into(op, res[lo:hi], acc, parts[-1])  # the one write of the share
        self._peers_stayed(call)
        self._barrier(f + 1, call, _NOTHING, waits)
        for r in range(n):  # every other share, from the rank that reduced it
            if r != me:
                lo, hi = count * r // n, count * (r + 1) // n
                read(r, res[lo:hi], peers[r][2] + lo * item)
        self._peers_stayed(call)
        self._barrier(f + 2, call, _NOTHING, waits)  # nobody reads us now
        if res is not out:
            np.copyto(out, res)

    def _differing(self, mine: tuple, parity: int, only: int | None = None) -> int | None:
        """The first group rank (or ``only``) whose signature differs from ``mine``."""
        for r in (range(self.size) if only is None else (only,)):
            if r != self.me:
                theirs = self._sig(r, parity)
                if theirs[:5] != mine[:5] or theirs[6] != mine[6]:
                    return r
        return None

    def _wake(self, word: int, flag_offset: int) -> None:
        """Wake the sleepers on ``word`` (just stored), if any said they sleep; the
        flag is ``flag_offset`` bytes after the word."""
        flag = word + flag_offset // 4
        fence()
        if self.words[flag]:
            self.words[flag] = 0
            futex_wake(self.base + word * 4)

    def _wait(self, word: int, want: int, flag: int | None, releaser: int | None,
              parity: int, number: int, deadline: float, hooks: Hooks, call) -> None:
        """Until the int32 ``word`` holds ``want``, for fast call ``number`` (on
        ``parity``). ``flag``: the word where a sleeper says so (None: the writer wakes
        without being told); ``releaser``: the group rank that must store the word (also
        checked for being gone)."""
        words = self.words
        if words[word] == want:
            return
        now = time.monotonic()
        if self.patience.first(lambda: words[word] == want, now, self.size):
            return
        start, reported = now, False
        addr = self.base + word * 4
        while True:
            seen = int(words[word])
            if seen == want:
                return
            err = hooks.broken(call)
            if err is None and hooks.anyone_gone():
                # any member that has not written and never will
                for other in range(self.size):
                    if other != self.me and words[self._word(other, parity)] != number:
                        err = hooks.gone(self.group, self.group.ranks[other])
                        if err is not None:
                            break
            if err is None and releaser is not None:
                err = hooks.gone(self.group, self.group.ranks[releaser])
            if err is not None and words[word] != want:  # not written just now
                raise err
            now = time.monotonic()
            if now >= deadline:
                missing = self._missing(parity, number)
                if not missing and releaser is not None:  # arrived, did not release
                    missing = [self.group.ranks[releaser]]
                raise hooks.timed_out(call, missing)
            if not reported and now - start >= STALL_REPORT:
                reported = True
                hooks.stalled(call)
            if flag is not None:
                words[flag] = 1  # then the kernel's lock, then its look at the word
            futex_wait(addr, seen, min(SLICE, deadline - now))

    def _missing(self, parity: int, number: int) -> list[int]:
        return [self.group.ranks[r] for r in range(self.size)
                if r != self.me and self.words[self._word(r, parity)] != number]

    def _mismatch(self, call, r: int, theirs: tuple) -> CollectiveMismatchError:
        kind, dtype, op, root, count, _seq, shape = theirs
        return mismatch_error(self.group, self.me, call, r, _KIND_NAMES.get(kind, f"kind {kind}"),
                              dtype, count, ReduceOp(op).name if kind == _ALL_REDUCE else None,
                              root if root >= 0 else None)


def mismatch_error(group: Group, me: int, call, r: int, name: str, dtype: int, count: int,
                   op: str | None = None, root: int | None = None,
                   tail: str = "") -> CollectiveMismatchError:
    """The error of a fast call whose group rank ``r`` called something else (``name``
    with a dtype code, a count and maybe an op and a global root) than this rank
    (group rank ``me``) did (``call``)."""
    try:
        dt = str(ops.dtype_from_code(dtype))
    except ValueError:
        dt = f"code {dtype}"
    parts = [f"count={count}", f"dtype={dt}"]
    if op is not None:
        parts.append(f"op={op}")
    if root is not None:
        parts.append(f"root={root}")
    return CollectiveMismatchError(
        f"collective mismatch on {group!r} (call #{call.seq}): rank {group.ranks[r]} called "
        f"{name}({', '.join(parts)}) where rank {group.ranks[me]} called "
        f"{call.describe()}{tail}")


# wire.Kind values, without importing the wire layer into this module's hot path
_ALL_REDUCE, _BROADCAST, _BARRIER = 2, 3, 1
_KIND_NAMES = {1: "barrier", 2: "all_reduce", 3: "broadcast"}

