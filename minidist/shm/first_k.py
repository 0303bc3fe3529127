"""First-k receives (``recv_many``): the first k messages to arrive from a set of ranks.

A learner that steps many env workers asynchronously takes whichever k workers are
ready (EnvPool's ``batch_size < num_envs``). :func:`prepare` checks the call (on the
caller's thread); the door then runs it on the caller's thread when this rank receives
through its shared-memory inbox (:mod:`minidist.shm.p2p`, :func:`blocking`), else on
the loop (:func:`on_loop`: messages through sockets, async calls, minidist.aio).

Both ways take the same messages in the same way: a message of ``tag`` on ``group``
from one of the ranks is the next one its sender numbered for this rank (as
``recv(src=None)`` takes them, so each sender's messages are taken in their order),
whether it waits in the mailbox (it came through a socket, or was set aside) or in the
sender's ring of the inbox. Messages already here are taken first, in the order they
arrived (the mailbox's order, then the rings, one per ring per pass, starting one ring
further each call so that no sender is always first). A message is taken whole or not
at all: its header is checked before its bytes land in ``output[i]``.

A message that does not fit (size, dtype or shape) raises CollectiveMismatchError naming
its sender; that message is dropped (as ``recv`` drops it), and the messages this call
had already taken are given back: they wait for the next receive, as the ones not
taken do. Nothing waits for ever: a rank of the set that died or left (and has nothing
waiting here) raises PeerLostError naming it, within a sleep slice (0.1 s) of this rank
hearing of it; the group's timeout raises DistTimeoutError.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .. import ops, wire
from ..errors import CollectiveMismatchError, DistError, DistTimeoutError, PeerLostError
from ..group import Group
from ..plan import P2P, Planner
from .fast_slots import SLICE, Patience
from .inbox import MESSAGE_BYTES

SPIN_MANY = 100e-6  # how long a receiver spins while the node's ranks fit its cores


@dataclass(eq=False)
class Many:
    """A checked recv_many: ``k`` receives into ``items`` (one per row of ``output``)."""

    group: Group
    tag: int
    ranks: tuple[int, ...]  # the global ranks it takes messages from
    items: list[P2P]
    senders: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    taken: list[tuple[wire.Header | bytes, np.ndarray | None]] = field(default_factory=list)
    start: int = 0  # the ring a pass starts at
    dropped: tuple[int, int] | None = None  # (sender, number) of a message that did not fit
    # (dtype code, shape digest, count, bytes) of a row, when its message fits a record:
    # a record with exactly the header its sender writes for it is taken without decoding
    whole: tuple[int, int, int, int] | None = None
    # the call as given (output, its shape, strides and dtype, src, tag, group), when it
    # may be run again (see :func:`again`); else empty
    args: tuple = ()
    # made once per call: the ranks as a set, each sender's key in the engine's table of
    # expected numbers, and (for the whole-record takes of :func:`_take_rings`) each row's
    # bytes
    rank_set: frozenset[int] = frozenset()
    seq_keys: dict[int, tuple] = field(default_factory=dict)
    row_bytes: list[memoryview] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rank_set = frozenset(self.ranks)
        self.seq_keys = {r: (self.group.id, r, self.tag, False) for r in self.ranks}
        if self.whole is not None:
            self.row_bytes = [memoryview(item.flat).cast("B") for item in self.items]


_local = threading.local()  # this thread's last blocking recv_many (see :func:`again`)


def prepare(plan: Planner, output: np.ndarray, src: int | object, tag: int,
            group: object) -> Many:
    """Check a recv_many of ``output.shape[0]`` messages of ``output.shape[1:]`` from
    ``src`` (None: any other rank of the group; an int; or a sequence of global ranks);
    ValueError / TypeError / NotInGroupError before anything is changed."""
    if not isinstance(output, np.ndarray):
        raise TypeError(f"recv_many: output must be a numpy array, not "
                        f"{type(output).__name__}")
    if output.ndim < 1 or output.shape[0] < 1:
        raise ValueError("recv_many: output's first axis must hold at least one message "
                         f"(shape {output.shape})")
    g = plan.group(group, "recv_many")
    me = plan.rank
    if src is None:
        ranks = tuple(r for r in g.ranks if r != me)
        if not ranks:
            raise ValueError(f"recv_many: src=None on {g!r}, which has no other rank")
    else:
        seq = [src] if isinstance(src, (int, np.integer)) else list(src)
        if not seq:
            raise ValueError("recv_many: src is an empty sequence")
        ranks = tuple(int(r) for r in seq)
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"recv_many: src names a rank twice ({list(ranks)})")
        for r in ranks:
            if r not in g:
                raise ValueError(f"recv_many: src {r} is not a member of {g!r}")
            if r == me:
                raise ValueError(f"recv_many: src={r} is this rank itself")
    first = plan.prepare_recv(output[0], None, tag, g)  # checks the row and the tag
    items = [first]
    for i in range(1, output.shape[0]):
        row = output[i]
        flat = row.reshape(-1) if row.flags.c_contiguous else np.empty(row.size, row.dtype)
        items.append(P2P(g, -1, first.tag, -1, flat, first.shape, False,
                         None if row.flags.c_contiguous else row))
    flat = first.flat
    whole = (ops.dtype_code(flat.dtype), first.shape, flat.size, flat.nbytes) \
        if flat.nbytes <= MESSAGE_BYTES else None
    m = Many(g, first.tag, ranks, items, np.full(len(items), -1, np.int64), whole=whole)
    if (src is None or type(src) is int) and type(tag) is int:
        m.args = (output, output.shape, output.strides, output.dtype, src, tag, group)
    return m


def again(plan: Planner, output: object, src: object, tag: object,
          group: object) -> Many | None:
    """This thread's last blocking recv_many (see :func:`remember`), ready to run again,
    if this call is it again: the same output array (its shape, strides and dtype
    unchanged, still writable), the same ``src`` (None or a rank), tag and group (the
    default group still the one it was). Else None (the call is prepared as any)."""
    m = getattr(_local, "many", None)
    if m is None:
        return None
    out, shape, strides, dtype, src0, tag0, group0 = m.args
    if output is not out or group is not group0 or type(tag) is not int or tag != tag0 or (
            src is not src0 and (type(src) is not int or src != src0)):
        return None
    if output.shape != shape or output.strides != strides or output.dtype is not dtype or \
            not output.flags.writeable or (group is None and plan.default is not m.group):
        return None
    if m.taken:
        return None
    m.senders = np.full(len(m.items), -1, np.int64)  # (the last call's went to its caller)
    m.dropped = None
    return m


def remember(m: Many) -> None:
    """After blocking recv_many ``m`` returned: remember it for :func:`again`."""
    if m.args:
        _local.many = m


# ----------------------------------------------------------------------------- taking


def _expected(engine, m: Many, src: int) -> int:
    """The number of the next message from ``src`` (a rank of ``m``) for this call."""
    return engine.p2p_seqs.get(m.seq_keys[src], 0)


def _took(engine, m: Many, src: int, seq: int) -> None:
    engine.p2p_seqs[m.seq_keys[src]] = seq + 1


def _took_whole(engine, m: Many, header: wire.Header | bytes, src: int, seq: int) -> None:
    """Message ``seq`` from ``src`` (its header, or its header's bytes; its payload
    already in the next row) becomes the next one taken."""
    i = len(m.taken)
    item = m.items[i]
    _took(engine, m, src, seq)
    if item.user is not None:
        np.copyto(item.user, item.flat.reshape(item.user.shape))
    m.senders[i] = src
    m.taken.append((header, None))


def _fill(engine, m: Many, h: wire.Header, payload, into_done: bool) -> None:
    """Message ``h`` becomes the next one taken (its payload already in place if
    ``into_done``); CollectiveMismatchError (after giving back the others) if it does
    not fit."""
    if not into_done:
        item = m.items[len(m.taken)]
        err = engine.p2p_check(item, h)
        if err is None and len(payload) != item.flat.nbytes:
            err = CollectiveMismatchError(
                f"recv_many on rank {engine.rank} from rank {h.src}: a message of "
                f"{len(payload)} bytes for a {item.flat.nbytes}-byte row")
        if err is not None:
            _took(engine, m, h.src, h.seq)  # (its number is used up)
            m.dropped = (h.src, h.seq)
            raise err
        item.flat.view(np.uint8)[:] = np.frombuffer(payload, np.uint8)
    _took_whole(engine, m, h, h.src, h.seq)


def take_early(engine, mailbox, m: Many) -> None:
    """Take what waits in the mailbox, in order of arrival (any thread: each pop is
    atomic under the GIL)."""
    early = mailbox.early
    if not early:
        return
    gid, tag, k = m.group.id, m.tag, len(m.items)
    for key in list(early):
        if len(m.taken) >= k:
            return
        if key[4] and key[1] == gid and key[3] == tag and key[0] in m.rank_set and \
                key[2] == _expected(engine, m, key[0]):
            got = early.pop(key, None)
            if got is not None:
                _fill(engine, m, got[0], got[1], False)


def _take_rings(p2p, m: Many) -> None:
    """Take what waits in the rings of the inbox (caller's thread, in the inbox)."""
    inbox, engine = p2p.inbox, p2p.engine
    rings = inbox.nonempty()
    if not rings.size:
        return
    k, gid, tag = len(m.items), m.group.id, m.tag
    order = rings.tolist()
    first = m.start % len(order)
    order = order[first:] + order[:first]
    m.start += 1
    whole, local, ranks, rows, taken = m.whole, p2p.local, m.rank_set, m.row_bytes, m.taken
    take_if = inbox.take_if if inbox.core is None else inbox.core.take_if
    with p2p.drain_lock:
        progress = True
        while progress and len(taken) < k:
            progress = False
            for ring in order:
                i = len(taken)
                if i >= k:
                    return
                src = local[ring]
                if whole is not None and src in ranks:
                    seq = _expected(engine, m, src)
                    header = wire.encode_p2p(whole[0], 0, gid, seq, src, tag, whole[1],
                                             whole[2], whole[3])
                    if take_if(ring, header, rows[i]):
                        p2p.received += 1
                        _took_whole(engine, m, header, src, seq)
                        progress = True
                        continue
                while True:
                    raw = inbox.peek(ring)
                    if raw is None:
                        break
                    h = p2p.ring_header(raw, ring)
                    if h is None:
                        inbox.take(ring)  # not what this ring's sender writes: dropped
                        continue
                    if not (h.group == gid and h.tag == tag and h.src in ranks
                            and h.seq == _expected(engine, m, h.src)):
                        rec = inbox.take(ring)  # another receive's: to the mailbox
                        p2p.set_aside(h, rec[1], p2p.loop)
                        continue
                    item = m.items[len(m.taken)]
                    fits = engine.p2p_check(item, h) is None
                    into = item.flat.view(np.uint8) if fits else None
                    payload = inbox.take(ring, into)[1]
                    if payload is None:
                        _took(engine, m, h.src, h.seq)
                        raise p2p.lost_with_stash(item, h.src, h.nbytes)
                    p2p.received += 1
                    _fill(engine, m, h, payload, fits and payload is into)
                    progress = True
                    break


def give_back(mailbox, m: Many, loop: asyncio.AbstractEventLoop | None, engine) -> None:
    """The messages this call took wait for the next receive (after an error)."""
    back: dict[int, int] = {}
    for i, (h, _) in enumerate(m.taken):
        if isinstance(h, bytes):  # taken whole by its header bytes
            h = wire.decode_header(h)
        item = m.items[i]
        payload = bytearray(item.flat.view(np.uint8).tobytes())
        if m.dropped is not None and h.src == m.dropped[0]:
            # the dropped message's number is used up: its sender's earlier messages
            # that go back take the numbers up to it, so the next one still follows
            h = h._replace(seq=h.seq + 1)
        back[h.src] = min(h.seq, back.get(h.src, h.seq))
        engine.p2p_seqs[(m.group.id, h.src, m.tag, False)] = back[h.src]
        if loop is None:  # (the payload row was taken whole; the header says its size)
            mailbox.deposit(h, payload)
        else:
            loop.call_soon_threadsafe(mailbox.deposit, h, payload)
    m.taken.clear()
    m.dropped = None


def _refusal(engine, mailbox, m: Many) -> DistError | None:
    """Why the call cannot finish: the rendezvous is lost, or a rank of the set died or
    left with nothing of it waiting here."""
    if engine.rendezvous_lost is not None:
        return engine.no_rendezvous("recv_many")
    for r in m.ranks:
        dead = mailbox.is_dead(r)
        if isinstance(dead, DistError):
            return PeerLostError(f"recv_many on rank {engine.rank} from ranks "
                                 f"{list(m.ranks)}: rank {r} is gone ({dead})", ranks=[r],
                                 left=getattr(dead, "left", False), collective="recv_many",
                                 group=m.group)
    return None


def _timeout(engine, m: Many, timeout: float) -> DistTimeoutError:
    return DistTimeoutError(
        f"recv_many on rank {engine.rank}: {len(m.items)} messages from ranks "
        f"{list(m.ranks)} ({m.tag=}) not all arrived within {timeout:g} s "
        f"({len(m.taken)} did)", collective="recv_many", group=m.group)


# ----------------------------------------------------------------------------- waiting


def blocking(session, m: Many, loop: asyncio.AbstractEventLoop, not_taken: object):
    """On the caller's thread, in this rank's inbox: the senders (an int64 array), or
    ``not_taken`` if the loop must receive instead (nothing was changed)."""
    p2p = session.p2p
    if p2p is None:
        return not_taken
    return p2p.in_inbox(loop, lambda inbox: _in_inbox(session, p2p, inbox, m, loop))


def _in_inbox(session, p2p, inbox, m: Many, loop) -> np.ndarray:
    engine, mailbox = session.engine, session.mailbox
    timeout = session.timeout_of(m.group)
    deadline = time.monotonic() + timeout
    k = len(m.items)
    inbox.set_open(True)
    patience = p2p.many_patience
    if patience is None:
        patience = p2p.many_patience = Patience(SPIN_MANY)
        patience.fit(len(p2p.local))
    spun = False
    try:
        while True:
            seen = inbox.bell()
            take_early(engine, mailbox, m)
            if len(m.taken) < k:
                _take_rings(p2p, m)
            if len(m.taken) >= k:
                m.taken.clear()
                return m.senders
            err = _refusal(engine, mailbox, m)
            if err is not None:
                take_early(engine, mailbox, m)  # sent just before
                _take_rings(p2p, m)
                if len(m.taken) >= k:
                    m.taken.clear()
                    return m.senders
                raise err
            now = time.monotonic()
            if now >= deadline:
                raise _timeout(engine, m, timeout)
            if not spun:
                spun = True
                if patience.wait(lambda s=seen: inbox.nonempty().size > 0 or
                                 inbox.bell() != s, now):
                    continue
            inbox.will_sleep()
            if inbox.bell() == seen and not inbox.nonempty().size:
                inbox.sleep(seen, min(SLICE, deadline - now))
    except BaseException:
        give_back(mailbox, m, loop, engine)
        raise


async def on_loop(session, m: Many) -> np.ndarray:
    """On the loop: the senders (an int64 array) once ``len(m.items)`` messages are
    taken from the mailbox (the inbox is closed and its rings moved there first)."""
    engine, mailbox = session.engine, session.mailbox
    loop = asyncio.get_running_loop()
    timeout = session.timeout_of(m.group)
    deadline = loop.time() + timeout
    k = len(m.items)
    engine.before_receive()
    try:
        while True:
            take_early(engine, mailbox, m)
            if len(m.taken) >= k:
                m.taken.clear()
                return m.senders
            err = _refusal(engine, mailbox, m)
            if err is not None:
                raise err
            left = deadline - loop.time()
            if left <= 0:
                raise _timeout(engine, m, timeout)
            await asyncio.wait([mailbox.next_arrival()], timeout=min(SLICE, left))
    except BaseException:
        give_back(mailbox, m, None, engine)
        raise
