"""Small scatter, gather and all_gather on one node through shared memory, run by the
caller's thread: the learner / env-worker step of an RL loop without socket or event loop.

These calls share their group's fast-call numbers and its turn with
:mod:`minidist.shm.fast_slots` (so every fast call of a group runs in one order on every
rank) and use an area of their own after the fast slots in the same segment. A call of
at most :func:`piece_bytes` per rank on a group of at most :data:`MAX_RANKS` ranks
takes this path.

Layout of the area: per rank and parity (fast call ``f`` uses parity ``f % 2``), a
64-byte header (the layout of :mod:`minidist.shm.fast_slots`'s: the rank's *number* word,
its call's signature, the *release*, *sleeping* and *arrived* words), then one *done*
word (int64) per rank: the number of fast calls of the group it has finished, counted
in this area; then per rank and parity one *piece* of :func:`piece_bytes` bytes: what
goes to that rank (scatter) or comes from it (gather, all_gather).

A call with root ``R`` (group rank 0 for all_gather):

* a gather or all_gather: every rank but ``R`` writes its input into its piece, its
  signature (a gather's sender then compares the root's, if the root arrived first, and
  stores its *done* word: its last load of the call is done, and the wake-up below may
  hand its core to the root before it runs again), then its number, then adds one to
  ``R``'s *arrived* count with the
  kernel's atomic ``FUTEX_WAKE_OP``, which wakes ``R`` when the count becomes complete
  (the last arriving rank wakes the root: one wake-up per call; a root woken by each
  arriving rank instead, while the workers of a 2-core machine arrive one by one, made
  a 32-worker step 4 times slower). ``R`` writes its signature and number, sleeps until
  its count is complete, sets it back to 0 (before its *done* word, which the next adds
  wait for) and compares every signature with its own in one vectorised comparison; a
  gather's root then copies the pieces out, an all_gather's stores its *release* word
  and wakes every sleeper on it with one ``FUTEX_WAKE``, and everyone copies every
  piece. A gather's sender does not wait: it compares its signature with the root's if
  the root arrived first and raises on a mismatch; else it hears of the root's
  mismatch through the group's abort (its array was only read);
* a scatter: ``R`` writes every rank's piece, its signature and number, copies its own
  block out, stores its *release* word and wakes the sleepers on it (one system call
  for all the workers of an RL step) and returns without waiting for anyone. Each
  receiver waits for the release, compares the root's signature with its own (on a
  mismatch it raises before writing its output), copies its piece out, then writes its
  signature and number. ``R`` checks those at the start of its next fast call on the
  group (a gather's root: once everyone arrived, when they all have), before its
  *done* word passes the scatter (see ``_settle``): a receiver that called something
  else makes the root raise there, naming it, and the others hear of it through the
  group's abort. Nobody's output array is written before its own signature check
  passed; a scatter's root and the receivers that agree with it may have returned from
  the call before the mismatch is found, with the blocks they were sent.

Memory ordering: as in :mod:`minidist.shm.fast_slots` (x86 TSO; each store and load is a
separate call into numpy's C code, which the compiler does not reorder across; the
kernel's futex calls are full fences, and the release's wake-up follows the same
flag-and-fence protocol, with the sleeper's call number as its flag: see
``Rooted._release``).

Reuse. Every rank runs the group's fast calls in the same order, so each knows, for
each parity, which call last used this area (its number, kind and root). Before call
``f`` touches parity ``p``, a rank waits until every rank that read what it is about to
overwrite has finished that last call ``f'`` (its *done* word is past ``f'``): always
the root of ``f'`` (which read every header and, in a gather, every piece, and reset its
count); every rank when ``f'`` was an all_gather (everyone read everyone's piece), when
this rank was the root of ``f'`` (everyone read its header: its signature, release and
differs words), or when this rank, as the root of a scatter, writes the others' pieces
after a scatter (each read its own). A scatter's receiver that follows a scatter of
the same root on this parity skips that wait: it writes its header only after the
root's release, which the root stores only after it settled the scatter before. A rank
stores its *done* word only after its last load of the call (an all_gather's root
before its release word, so a rank that saw the release sees it; a scatter's root once
it settled the call). So a piece, header or count is never overwritten while someone may
still read it. In the RL pattern (scatter, gather, scatter, ...) these words are
already past by the time anyone looks: the root's scatter follows its gather, which
needed every worker's arrival, and a worker's scatter waits for a release that its
root stores only after it settled the scatter before.

A call that ends early on a rank (an error, a timeout, an interrupt) leaves that rank
unable to write the area again: every later call of the group on this path refuses on
it (``gave_up``, also when the group's fast slots gave up, see
:mod:`minidist.shm.fast_slots`), so a rank that resumes after the others gave up on it never
overwrites what another still reads.

Every wait is bounded as in :mod:`minidist.shm.fast_slots`: a short spin or yield while the
group fits the cores, then futex sleeps of at most 0.1 s between which the call's
deadline, ranks that died or left, an abort of the group and the rendezvous are
checked; after 1 s the call is reported to the rendezvous (the stall check), and from
then on the sleeps grow to 1 s (a rank that dies wakes the sleepers at once). Idle
waiters sleep.
"""

from __future__ import annotations

import struct

import numpy as np

from ..errors import CollectiveMismatchError, again
from ..group import Group
from . import core, fast_slots
from .area_layout import HEADER, area_bytes, piece_bytes, pieces_at
from .fast_slots import (
    ARRIVED,
    DIFFERS,
    RELEASE,
    SLEEPING_RELEASE,
    Hooks,
    Patience,
    fence,
    futex_add,
    futex_wake,
    mismatch_error,
)
from .rooted_core import SETTLED_TAIL, CompiledRoles
from .waits import Waits

MAX_RANKS = 1024  # FUTEX_WAKE_OP compares with a 12-bit number: at most 4097
_SIG = struct.Struct("<iiiiqIq")  # kind, dtype, op, root (group rank), count, shape, seq
_KEY = 28  # the bytes of a signature compared: kind .. shape (not seq)
_KEY_OF = struct.Struct("<iiiiqI")  # those bytes
_KEY_SEQ = struct.Struct(f"<{_KEY}sq")  # the compared bytes and the call's number at once
SCATTER, GATHER, ALL_GATHER = 8, 7, 5  # wire.Kind values
_ALL = np.logical_and.reduce  # (ndarray.all and .min go through Python functions)
_MIN = np.minimum.reduce
KINDS = (SCATTER, GATHER, ALL_GATHER)
NAMES = {SCATTER: "scatter", GATHER: "gather", ALL_GATHER: "all_gather"}


def signature(call, root: int) -> bytes:
    """The bytes of ``call``'s signature that ranks compare (``root``: its group rank)."""
    return _KEY_OF.pack(call.kind, call.dtype, call.op, root, call.count, call.shape)


def area_at(size: int) -> int:
    """Where the area starts in the group's fast segment: after the fast slots, before
    the mid area (:func:`minidist.shm.fast_slots.segment_bytes` counts it)."""
    return -(-size * 2 * fast_slots.SLOT // 4096) * 4096


def takes(collective: str, size: int, nbytes: int) -> bool:
    """Whether a ``collective`` with ``nbytes`` per rank (a scatter's output, a gather's
    or all_gather's input) on ``size`` ranks of one node takes this path."""
    return collective in ("scatter", "gather", "all_gather") and 2 <= size <= MAX_RANKS \
        and nbytes <= piece_bytes(size)


class Rooted(Waits, CompiledRoles):
    """One group's rooted calls in its fast segment ``buf``, seen from group rank ``me``;
    ``slots``: the group's :class:`fast_slots.Slots` (whose give-up this honours)."""

    def __init__(self, buf, group: Group, me: int, slots=None) -> None:
        n = self.size = group.size
        self.group, self.me, self.slots = group, me, slots
        at = area_at(n)
        self.mem = np.frombuffer(buf, np.uint8, area_bytes(n), at)
        self.base = self.mem.ctypes.data
        self.words = self.mem.view(np.int32)
        self.heads = self.words[:2 * n * HEADER // 4].reshape(n, 2, HEADER // 4)
        self.done = self.mem[2 * n * HEADER:2 * n * HEADER + 8 * n].view(np.int64)
        self.piece = piece_bytes(n)
        self.pieces = self.mem[pieces_at(n):].reshape(2, n, self.piece)
        self.mv = memoryview(self.mem)
        self.w = self.mv.cast("i")  # the area's int32 words (plain ints: cheaper than numpy's)
        self.dq = self.mv[2 * n * HEADER:2 * n * HEADER + 8 * n].cast("q")  # the done words
        self.sigs = [self.heads[:, p, 1:1 + _KEY // 4] for p in (0, 1)]
        self.numbers = [self.heads[:, p, 0] for p in (0, 1)]
        self.last: list[tuple[int, int, int] | None] = [None, None]  # (f, kind, root)
        self.gave_up: BaseException | None = None
        self.behind: tuple[int, int] | None = None  # (call, its root): see catch_up
        self.pending: tuple[int, bytes, object] | None = None  # see _settle
        self.patience = Patience()
        self.patience.fit(n)
        self._layouts: dict[tuple[int, int, int], tuple] = {}  # see layout
        self._keys: dict[bytes, np.ndarray] = {}  # signatures as words (see _differing)
        # the compiled core runs the roles below when it is active (the same steps, in
        # the same order: the layout it is handed here is this module's)
        self.core = None if core.compiled is None else core.compiled.Area(
            buf, at, area_bytes(n), n, me, HEADER, 2 * n * HEADER, pieces_at(n), self.piece)
        if self.core is not None:
            self.core.fit(*self.patience.full)

    # ------------------------------------------------------------------ a call

    def run(self, f: int, call, out: np.ndarray, src: np.ndarray, deadline: float,
            hooks: Hooks, key: bytes | None = None) -> None:
        """Run fast call number ``f`` of the group (a scatter, gather or all_gather):
        ``src`` this rank's input (a scatter's: the whole input on the root, nothing
        elsewhere), ``out`` where its result goes (a gather's: the whole output on the
        root, nothing elsewhere); ``key``: the call's :func:`signature` if known."""
        gave_up = self.gave_up or getattr(self.slots, "gave_up", None)
        if gave_up is not None:
            raise again(gave_up, f"{call.describe()} on {self.group!r} (call #{call.seq}) "
                        f"refused on rank {self.group.ranks[self.me]}: an earlier call on "
                        "the group ended early on this rank")
        try:
            self.behind = None
            self._run(f, call, out, src, deadline, hooks, key)
        except BaseException as e:  # whatever ends a call early: this rank is done here
            self.gave_up = e
            raise

    def layout(self, kind: int, root: int, nb: int) -> tuple:
        """Per parity, where a call of ``kind`` with root ``root`` and ``nb`` bytes per
        rank reads and writes: (root's header, this rank's header, every rank's piece,
        this rank's piece); the last few kept (a loop repeats its calls)."""
        got = self._layouts.get((kind, root, nb))
        if got is None:
            if len(self._layouts) >= 16:
                self._layouts.clear()
            me = self.me
            got = self._layouts[(kind, root, nb)] = tuple(
                ((root * 2 + p) * HEADER, (me * 2 + p) * HEADER, self.pieces[p][:, :nb],
                 self.pieces[p][me, :nb]) for p in (0, 1))
        return got

    def _run(self, f: int, call, out: np.ndarray, src: np.ndarray, deadline: float,
             hooks: Hooks, key: bytes | None = None) -> None:
        n, me, kind = self.size, self.me, call.kind
        parity = f & 1
        root = 0 if kind == ALL_GATHER else self.group.rank_of(call.root)
        if self.pending is not None and (kind == SCATTER or me != root):
            self._settle(deadline, hooks, call)  # (a gather's root: once all arrived)
        last = self.last[parity]
        if last is not None and not self.reused(last, kind, root):
            self.wait_reused(last, kind, root, (deadline, hooks, call))
        self.last[parity] = (f, kind, root)
        nb = out.nbytes if kind == SCATTER else src.nbytes
        head, at, rows, mine = self.layout(kind, root, nb)[parity]
        if key is None:
            key = signature(call, root)
        u8 = np.uint8
        if kind == SCATTER:
            if me == root:
                self.scatter_root(f, head, key, call, rows, src.view(u8).reshape(n, nb),
                                  out.view(u8), mine)
            else:
                self.scatter_recv(f, head, at, root, key, deadline, hooks, call,
                                  out.view(u8), mine)
        elif kind == GATHER:
            if me == root:
                self.gather_root(f, head, key, deadline, hooks, call, mine, src.view(u8),
                                 out.view(u8).reshape(n, nb), rows)
            else:
                self.gather_send(f, head, at, root, key, call, mine, src.view(u8))
        else:
            self._all_gather(f, head, at, root, key, deadline, hooks, call, out, src, rows,
                             mine)

    # ------------------------------------------------------------------ one call's roles
    # (after its area's reuse: see reused; a call planned once runs these directly,
    # :mod:`minidist.shm.repeat`, with typed views of its pieces and arrays)

    def scatter_root(self, f: int, head: int, key: bytes, call, rows: np.ndarray,
                     src: np.ndarray, out: np.ndarray, mine: np.ndarray) -> None:
        """A scatter's root: ``src`` (every rank's block, by rows) into the ``rows``
        pieces, its own ``mine`` into ``out``; then the release (nobody to wait for:
        checked at its next call, see :meth:`_settle`)."""
        if self.core is not None:
            self.core.scatter_root(f, key, call.seq, src, out, mine.nbytes)
            self.pending = (f, key, call)
            return
        rows[...] = src
        hw = head >> 2
        _KEY_SEQ.pack_into(self.mv, head + 4, key, call.seq)
        number = (f + 1) & 0x7FFFFFFF
        self.w[hw] = number  # after the pieces and the signature
        out[...] = mine
        self.pending = (f, key, call)
        self._release(hw, number)

    def scatter_recv(self, f: int, head: int, at: int, root: int, key: bytes,
                     deadline: float, hooks: Hooks, call, out: np.ndarray,
                     mine: np.ndarray) -> None:
        """A scatter's receiver: the root's release, its signature compared, then its
        piece ``mine`` into ``out`` and this rank's signature (for the root's check)."""
        w, mv, number = self.w, self.mv, (f + 1) & 0x7FFFFFFF
        hw = head >> 2
        if self.core is not None:
            differs = self.core_scatter_recv(f, hw, root, key, deadline, hooks, call, out,
                                              mine.nbytes)
        else:
            if w[hw + RELEASE // 4] != number:
                self._wait(hw + RELEASE // 4, number, hw + SLEEPING_RELEASE // 4, root,
                           f & 1, number, deadline, hooks, call)
            differs = mv[head + 4:head + 4 + _KEY] != key
            if not differs:
                out[...] = mine
            _KEY_SEQ.pack_into(mv, at + 4, key, call.seq)
            w[at >> 2] = number  # after its reads and its signature: for the root's check
            self.dq[self.me] = f + 1
        self.behind = (f, root)
        if differs:
            raise self.mismatch(call, root, f & 1)

    def gather_root(self, f: int, head: int, key: bytes, deadline: float, hooks: Hooks,
                    call, mine: np.ndarray, src: np.ndarray, out: np.ndarray,
                    rows: np.ndarray) -> None:
        """A gather's root: its own ``src`` into its piece, its signature, then (once
        the last sender woke it) every signature compared and the ``rows`` into
        ``out`` (by rows)."""
        if self.core is not None:
            self.core_gather_root(f, head, key, deadline, hooks, call, src, out, mine.nbytes)
            return
        mine[...] = src
        bad = self._collect(f, head, key, deadline, hooks, call)
        if bad >= 0:
            self._finish(f)
            raise self.mismatch(call, bad, f & 1)
        out[...] = rows
        self.dq[self.me] = f + 1  # after the last load of the pieces

    def _collect(self, f: int, head: int, key: bytes, deadline: float, hooks: Hooks,
                 call) -> int:
        """The root of a gather or all_gather, its piece written: its signature and
        number, then (once the last arriving rank woke it) its count set back, a
        scatter of its own settled, and every signature compared: the first group rank
        that differs (its number then stored as the header's *differs* word), or -1."""
        w, number, parity = self.w, (f + 1) & 0x7FFFFFFF, f & 1
        hw = head >> 2
        _KEY_SEQ.pack_into(self.mv, head + 4, key, call.seq)
        w[hw] = number
        # the others count themselves in: the last one wakes this rank
        self._wait(hw + ARRIVED // 4, self.size - 1, None, None, parity, number, deadline,
                   hooks, call)
        w[hw + ARRIVED // 4] = 0
        if self.pending is not None:  # everyone finished it: they arrived here
            self._settle(deadline, hooks, call)
        bad = self._differing(parity, key)
        if bad >= 0:
            w[hw + DIFFERS // 4] = number
        return bad

    def gather_send(self, f: int, head: int, at: int, root: int, key: bytes, call,
                    mine: np.ndarray, src: np.ndarray) -> None:
        """A gather's sender: ``src`` into its piece, its signature and number, one
        count added to the root's (the last one wakes it); no wait."""
        if self.core is not None:
            differs = self.core.gather_send(f, root, key, call.seq, src, mine.nbytes)
        else:
            w, mv, number = self.w, self.mv, (f + 1) & 0x7FFFFFFF
            mine[...] = src
            _KEY_SEQ.pack_into(mv, at + 4, key, call.seq)
            hw = head >> 2
            differs = w[hw] == number and mv[head + 4:head + 4 + _KEY] != key
            # its last load of the call is done: so says its done word, before the count
            # wakes the root (which, on a crowded node, then runs before it stores more)
            self.dq[self.me] = f + 1
            w[at >> 2] = number  # after the piece and the signature
            futex_add(self.base + head + ARRIVED, self.size - 2)  # the last one wakes root
        self.behind = (f, root)  # the others may still be in the call before
        if differs:
            raise self.mismatch(call, root, f & 1)

    def _all_gather(self, f: int, head: int, at: int, root: int, key: bytes,
                    deadline: float, hooks: Hooks, call, out: np.ndarray, src: np.ndarray,
                    rows: np.ndarray, mine: np.ndarray) -> None:
        """An all_gather (group rank 0 collects the arrivals and releases everyone)."""
        n, w, mv = self.size, self.w, self.mv
        parity, number = f & 1, (f + 1) & 0x7FFFFFFF
        hw = head >> 2
        nb = src.nbytes
        mine[:] = src.view(np.uint8)
        if self.me == root:
            bad = self._collect(f, head, key, deadline, hooks, call)
            self._release(hw, number)  # everyone copies (or raises), this rank too
            if bad >= 0:
                self._finish(f)
                raise self.mismatch(call, bad, parity)
            out.view(np.uint8).reshape(n, nb)[:] = rows
            self.dq[self.me] = f + 1  # after the last load of the pieces
            return
        _KEY_SEQ.pack_into(mv, at + 4, key, call.seq)
        w[at >> 2] = number  # after the piece and the signature
        futex_add(self.base + head + ARRIVED, n - 2)  # the last one wakes the root
        if w[hw + RELEASE // 4] != number:
            self._wait(hw + RELEASE // 4, number, hw + SLEEPING_RELEASE // 4, root, parity,
                       number, deadline, hooks, call)
        if w[hw + DIFFERS // 4] == number or mv[head + 4:head + 4 + _KEY] != key:
            bad = self._differing(parity, key)
            self._finish(f)
            raise self.mismatch(call, bad if bad >= 0 else root, parity)
        out.view(np.uint8).reshape(n, nb)[:] = rows
        self.dq[self.me] = f + 1

    def _differing(self, parity: int, key: bytes) -> int:
        """The first group rank whose signature of ``parity`` is not ``key`` (-1: none),
        compared for all ranks at once."""
        keys = self._keys
        k = keys.get(key)
        if k is None:
            if len(keys) >= 16:
                keys.clear()
            k = keys[key] = np.frombuffer(key, np.int32)
        same = self.sigs[parity] == k
        if _ALL(same, axis=None):
            return -1
        return int(same.all(axis=1).argmin())

    def _finish(self, f: int) -> None:
        """This rank is done with call ``f``: after its last load of the call."""
        self.dq[self.me] = f + 1

    def _release(self, hw: int, number: int) -> None:
        """Store the call's number into the release word of the header whose first word
        is ``hw`` and wake its sleepers (one system call for all), if any said they
        sleep: a sleeper stores the number of the call it waits for into the header's
        *sleeping* word, which nobody resets (a reset could erase the word of a
        receiver already waiting for this header's next call, while this rank was
        preempted between its load and its store: its wake-up would be lost). A number
        from a later call wakes too; those sleepers look again and sleep on."""
        w = self.w
        w[hw + RELEASE // 4] = number
        fence()
        said = w[hw + SLEEPING_RELEASE // 4]
        if said and (said - number) & 0x7FFFFFFF < 1 << 30:
            futex_wake(self.base + (hw + RELEASE // 4) * 4)

    # ------------------------------------------------------------------ reuse

    def reused(self, last: tuple[int, int, int], kind: int, root: int) -> bool:
        """Whether whoever read what a call of ``kind`` with root ``root`` overwrites
        finished reading it in the ``last`` call (number, kind, root) of its parity (see
        the module); False: :meth:`wait_reused` first."""
        lf, lkind, lroot = last
        me = self.me
        if lkind == SCATTER and kind == SCATTER:
            if lroot == root != me:
                return True  # it writes only after the root's release, after its settle
            if lroot != me and root != me:
                return self.dq[lroot] > lf
        elif lkind != ALL_GATHER and lroot != me:
            return self.dq[lroot] > lf
        done = self.dq  # everyone read what it overwrites (see _everyone)
        return (min(done) if self.size <= 64 else int(_MIN(self.done))) > lf

    def _everyone(self, last: tuple[int, int, int], kind: int, root: int) -> bool:
        """Whether every rank read what the call overwrites in ``last``: everyone's
        piece (an all_gather), this rank's header (it was the root), or the pieces that
        this rank, the root of a scatter, overwrites after a scatter."""
        _lf, lkind, lroot = last
        return lkind == ALL_GATHER or lroot == self.me or (
            kind == SCATTER and self.me == root and lkind == SCATTER)

    def wait_reused(self, last: tuple[int, int, int], kind: int, root: int,
                     waits: tuple) -> None:
        """Until :meth:`reused` holds."""
        lf, _lkind, lroot = last
        everyone = self._everyone(last, kind, root)
        self._wait_done(lf, range(self.size) if everyone else (lroot,), waits)

    def catch_up(self, deadline: float, hooks: Hooks, call) -> None:
        """Before a call of the fast slots: if this rank's last fast call did not wait
        for every rank, wait until they got far enough: a gather it sent to, until that
        gather's root finished it, which it did only once every rank had finished the
        call before; a scatter it received, until its root settled it (see
        :meth:`_settle`), which it did only once every rank had read it; a scatter it
        was the root of, until it settled it. The slots' reuse argument
        (:mod:`minidist.shm.fast_slots`) counts on every rank that finished call ``f + 1``
        knowing that all finished ``f``."""
        if self.pending is not None:
            self._settle(deadline, hooks, call)
        if self.behind is not None:
            f, root = self.behind
            if self.dq[root] <= f:
                self._wait_done(f, (root,), (deadline, hooks, call))
            self.behind = None

    def _settle(self, deadline: float, hooks: Hooks, call) -> None:
        """Check the signatures of this rank's last scatter as its root (``pending``),
        which returned without waiting for anyone, once every rank stored its number
        of that call into its header (a receiver does after its reads). Until then this
        rank's *done* word stays before that call, so nobody overwrites a header it is
        still to check: it is settled at the start of this rank's next fast call (a
        gather's or all_gather's root: once everyone arrived, when they all did). A
        mismatch raises here, naming the scatter and the rank that called something
        else."""
        f, key, scattered = self.pending
        parity, number = f & 1, (f + 1) & 0x7FFFFFFF
        if not _ALL(self.numbers[parity] == number, axis=None):
            self._wait_numbers(parity, number, deadline, hooks, call)
        self.pending = None
        bad = self._differing(parity, key)
        self.dq[self.me] = f + 1
        if bad >= 0:
            raise self.mismatch(scattered, bad, parity, tail=SETTLED_TAIL.format(call.seq))

    def mismatch(self, call, r: int, parity: int,
                  tail: str = "; its output is unchanged") -> CollectiveMismatchError:
        kind, dtype, _op, root, count, _shape, _seq = _SIG.unpack_from(
            self.mem, (r * 2 + parity) * HEADER + 4)
        return mismatch_error(
            self.group, self.me, call, r, NAMES.get(kind, f"kind {kind}"), dtype, count,
            root=self.group.ranks[root] if kind != ALL_GATHER and 0 <= root < self.size
            else None, tail=tail)


class Fast:
    """A group's fast segment as one: its :class:`fast_slots.Slots` and its
    :class:`Rooted` area; :meth:`run` takes either kind of fast call. A call that ended
    early on either makes both refuse from then on."""

    def __init__(self, buf, group: Group, me: int) -> None:
        self.slots = fast_slots.Slots(buf, group, me)
        self.rooted = Rooted(buf, group, me, self.slots)

    @property
    def gave_up(self) -> BaseException | None:
        return getattr(self.slots, "gave_up", None) or self.rooted.gave_up

    def run(self, f: int, call, out: np.ndarray, src: np.ndarray, op, deadline: float,
            hooks: Hooks, reads: bool = False) -> None:
        """Fast call number ``f`` (see :meth:`fast_slots.Slots.run`)."""
        if call.kind in KINDS:
            self.rooted.run(f, call, out, src, deadline, hooks)
            return
        if self.rooted.gave_up is not None:
            raise again(self.rooted.gave_up, f"{call.describe()} on {self.rooted.group!r} "
                        f"(call #{call.seq}) refused: an earlier call on the group ended "
                        "early on this rank")
        self.rooted.catch_up(deadline, hooks, call)
        self.slots.run(f, call, out, src, op, deadline, hooks, reads)
