"""Point-to-point messages on one node through shared memory, on the caller's thread:
no socket and no event loop on either side.

A blocking receive from a known rank of this node (into a buffer of any size, or of an
object) opens this rank's inbox (:mod:`minidist.shm.inbox`, created at the first such
receive) and waits there: it spins briefly while the node's ranks fit its cores, yields
while they are a few per core, then sleeps on the inbox's bell (rung by a message, and
by the loop when a peer is gone), looking at its deadline and the rendezvous after 0.1 s
and then less often, up to every second, while nothing rings. A send to a rank of
this node whose inbox is open writes the message into its ring of that inbox (one of
more than :data:`~minidist.shm.inbox.MESSAGE_BYTES` into this rank's stash, and a record of
it into the ring) and wakes the receiver only if it sleeps. Everything else, and a
message that finds the inbox closed, its ring full or the stash without room, goes
through the socket as before.

Both ways carry the same frame header and the same numbers (per group, peer and tag), so
which way a message went never changes what a receive takes: a receive looks in the
socket's mailbox (early messages) and in the rings, and a record it does not want (its
tag or number is another receive's) goes to the mailbox, as if it had come through the
socket. The loop, which delivers the socket's messages, rings the inbox's bell when one
arrives or a peer is gone while a receiver waits there.

The inbox stays open after a receive (the next one is likely soon), so the rings may
hold messages while nobody waits on them. Whatever receives on the loop instead (a
receive with ``async_op``, from any rank, a probe, minidist.aio) first closes the inbox
and moves what the rings hold to the mailbox; a sender that wrote a record while the
inbox closed then sees it closed, and sends a doorbell frame (an empty message with
:data:`DOORBELL_TAG`) through the socket: the receiver's loop moves the rings' records
to the mailbox (the fence argument is in :mod:`minidist.shm.inbox`). A sender that leaves
rings the doorbell of every receiver whose message is still in its stash, and waits
(:meth:`FastP2P.linger`) until their loops took them.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from .. import wire
from ..engine import tag_name
from ..errors import CollectiveMismatchError, DistError, DistTimeoutError, PeerLostError
from ..group import Group
from ..plan import P2P, P2P_TAG_LIMIT
from .fast_slots import IDLE_SLICE, SLICE, Patience
from .inbox import MESSAGE_BYTES, Inbox, Outbox, Stash
from .ring_index import RingIndex, node_ranks
from .routes import Routes
from .takes import Takes

DOORBELL_TAG = P2P_TAG_LIMIT + 3  # "look at your rings": an empty frame, never a message
RETRY_ATTACH = 0.05  # seconds at most before a sender looks again for an inbox it did not find
FIRST_RETRY = 0.001  # ... the first time, doubled each time after (a receiver makes its
# inbox at its first receive from this node, often just after its peers' first sends)
SPIN_P2P = 100e-6  # a receiver's spin (a sleeping sender takes ~60 us to wake up here)
RESET_EVERY = 256  # receives after which a spin or yield cut to nothing is tried again
LINGER = 5.0  # seconds a leaving sender waits at most for its stash's messages to be taken
BELL_GRACE = 0.5  # seconds a leaving rank waits at most for its doorbells on their way
NOT_TAKEN = object()  # what :meth:`FastP2P.recv` returns when the loop must receive
_TAKEN_INTO = np.empty(0, np.uint8)  # a payload already copied into the receive's buffer


class Doorbells:
    """Doorbells sent on the loop (best effort: a receiver gone meanwhile says so
    itself), each kept until done; :meth:`end` leaves none running."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.pending: set[asyncio.Task] = set()

    def send_on_loop(self, bell: P2P, timeout: float) -> None:
        """On the loop: send ``bell`` (a task of its own)."""
        task = asyncio.ensure_future(self.engine.send_p2p(bell, timeout))
        self.pending.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.pending.discard(task)
        if not task.cancelled():
            task.exception()  # (retrieved: a failed doorbell is no news)

    async def end(self, limit: float) -> None:
        """On the loop, before the rank leaves: wait up to ``limit`` seconds for the
        doorbells still on their way, then cancel the rest and wait for them."""
        bells = set(self.pending)
        if not bells:
            return
        if limit > 0:
            await asyncio.wait(bells, timeout=limit)
        for task in bells:
            task.cancel()
        await asyncio.gather(*bells, return_exceptions=True)


class FastP2P:
    """One rank's shared-memory messages: its inbox and the inboxes it writes to.
    ``session`` gives the engine (errors, numbering, the socket path), the mailbox and
    the node's layout; nothing here runs on the loop except :meth:`drain_on_loop`."""

    def __init__(self, session) -> None:
        self.session = session
        self.engine = session.engine
        self.mailbox = session.mailbox
        self.rank = session.rank
        self.local = node_ranks(session.plan.nodes, self.rank)
        self.ring_of = RingIndex(self.local)
        self.inbox: Inbox | None = None
        self._no_inbox = False
        self._outboxes: dict[int, Outbox] = {}
        self._retry: dict[int, tuple[float, float]] = {}  # dst -> (look again at, then wait)
        self.stash: Stash | None = None
        self._no_stash = False
        self._send_lock = threading.Lock()
        self.drain_lock = threading.Lock()  # who takes records: a receiver or the loop
        self.many_patience: Patience | None = None  # recv_many's spin (minidist.shm.first_k's)
        self.receiver = threading.Lock()  # one waiting receiver at a time
        self.waiting = False  # a receiver waits in the inbox (read by the loop)
        self._patience = Patience(SPIN_P2P)
        self._patience.fit(len(self.local))
        self.loop: asyncio.AbstractEventLoop | None = None
        self.routes = Routes(session, self._send_lock, self._outboxes, self._ring_doorbell)
        self.send_again = self.routes.send_again
        self.takes = Takes(self)
        self.recv_again = self.takes.recv_again
        self._sent = self.received = 0  # messages that went through shared memory
        self.stashed = 0  # ... of them sent through this rank's stash
        self.dropped: dict[tuple, int] = {}  # messages lost with their sender's stash
        self._waits = 0
        self.bells = Doorbells(self.engine)  # those sent on the loop
        mb = self.mailbox
        mb.signal_tag, mb.on_signal = DOORBELL_TAG, self._doorbell
        mb.on_p2p_news = self._news
        self.engine.before_receive = self.close_and_drain

    @property
    def sent(self) -> int:
        """Messages this rank sent through shared memory."""
        return self._sent + self.routes.sent

    def close(self) -> None:
        """Forget every mapping and remove this rank's inbox (its name included)."""
        with self._send_lock:
            for out in self._outboxes.values():
                out.close()
            self._outboxes.clear()
            self.routes.clear()
            self.takes.clear()
            if self.stash is not None:
                self.stash.close()
                self.stash = None
            self._no_stash = True
        with self.drain_lock:
            if self.inbox is not None:
                self.inbox.close()
                self.inbox = None
            self._no_inbox = True

    # ------------------------------------------------------------------ sending

    async def linger(self, limit: float = LINGER) -> None:
        """On the loop, before :meth:`close`: ask the receivers of the messages still in
        the stash to take them (a doorbell; their loops move them to their mailboxes),
        and wait until they did, they are gone, or ``limit`` seconds passed. A message
        left after that is lost with the stash: its receive raises PeerLostError."""
        stash, loop = self.stash, asyncio.get_running_loop()
        if stash is None:
            return
        with self._send_lock:
            waiting = set(stash.outstanding())
        for dst in waiting:
            self._ring_doorbell(self.session.world, dst, loop)
        end = time.monotonic() + limit
        while waiting and time.monotonic() < end:
            await asyncio.sleep(0.002)
            with self._send_lock:
                waiting = {d for d in stash.outstanding() if not self._unreachable(d)}

    def _unreachable(self, dst: int) -> bool:
        """Whether global rank ``dst`` died or left (or the rendezvous is lost)."""
        e = self.engine
        return dst in e.lost or dst in e.left or e.rendezvous_lost is not None

    def send(self, p: P2P, loop: asyncio.AbstractEventLoop) -> bool:
        """From the caller's thread: write ``p`` into its receiver's inbox (a large one
        into this rank's stash, and a record of it into the inbox); False (nothing
        written) if it must go through the socket."""
        dst = p.peer
        if dst not in self.ring_of:
            return False
        if self._unreachable(dst):
            return False  # the socket path says why
        e = self.engine
        with self._send_lock:
            out = self._outboxes.get(dst)
            if out is None:
                when, wait = self._retry.get(dst, (0.0, FIRST_RETRY))
                if time.monotonic() < when:
                    return False
                out = Outbox.attach(self.session.job, dst, len(self.local),
                                    self.ring_of[self.rank])
                if out is None:
                    self._retry[dst] = (time.monotonic() + wait, min(2 * wait, RETRY_ATTACH))
                    return False
                self._outboxes[dst] = out
            header, payload = e.p2p_frame(p)
            if p.flat.nbytes <= MESSAGE_BYTES:
                done = out.put(header, payload)
            else:
                done = self._put_large(out, header, p.flat, dst)
        if done == 0:
            return False
        self._sent += 1
        if done == 2:
            self._ring_doorbell(p.group, p.peer, loop)
        if not p.is_object and p.flat.nbytes <= MESSAGE_BYTES:
            self.routes.went(p)
        return True

    def _put_large(self, out: Outbox, header: bytes, flat: np.ndarray, dst: int) -> int:
        """Under the send lock: a message too large for a record, through the stash
        (:meth:`Outbox.put`'s answer; 0 if there is no room)."""
        if not out.has_room():
            return 0
        stash = self.stash
        if stash is None:
            if self._no_stash:
                return 0
            try:
                stash = self.stash = Stash(self.session.job, self.rank)
            except OSError:
                self._no_stash = True
                return 0
        desc = stash.put(flat.view(np.uint8), dst)
        if desc is None:
            return 0
        done = out.put(header, memoryview(desc))
        if done == 0:
            stash.unput()
        else:
            self.stashed += 1
        return done

    def _ring_doorbell(self, group: Group, dst: int, loop: asyncio.AbstractEventLoop) -> None:
        bell = P2P(group, dst, DOORBELL_TAG, 0, np.empty(0, np.uint8), 0, False,
                   sending=True)
        if not self.engine.send_p2p_now(bell, loop):
            timeout = self.session.timeout_of(group)
            loop.call_soon_threadsafe(self.bells.send_on_loop, bell, timeout)


    # ------------------------------------------------------------------ receiving

    def recv(self, p: P2P, loop: asyncio.AbstractEventLoop):
        """From the caller's thread: receive ``p`` (a blocking receive from a known rank)
        waiting in the inbox: None, or an object's bytes; :data:`NOT_TAKEN` if the loop
        must receive it instead (nothing was changed)."""
        src = p.peer
        if src not in self.ring_of:
            return NOT_TAKEN
        return self.in_inbox(loop, lambda inbox: self._recv(p, inbox, src))

    def in_inbox(self, loop: asyncio.AbstractEventLoop, receive):
        """From the caller's thread: ``receive(inbox)`` (what it returns) while this
        thread waits in this rank's inbox, opened first; :data:`NOT_TAKEN` if there is
        none or another thread waits there (the loop must receive instead)."""
        if self._no_inbox:
            return NOT_TAKEN
        if not self.receiver.acquire(blocking=False):
            return NOT_TAKEN  # another thread waits in the inbox: this one on the loop
        try:
            if self.inbox is None:
                try:
                    self.inbox = Inbox(self.session.job, self.rank, len(self.local),
                                       self.local)
                except OSError:
                    self._no_inbox = True
                    return NOT_TAKEN
                if self.inbox.core is not None:  # the compiled receive spins as this one
                    self.inbox.core.fit(*self._patience.full)
            self.loop = loop
            self.waiting = True
            try:
                return receive(self.inbox)
            finally:
                self.waiting = False
                if self.mailbox.p2p_waiting():  # receives on the loop: the rings are theirs
                    loop.call_soon_threadsafe(self.close_and_drain)
        finally:
            self.receiver.release()

    def _recv(self, p: P2P, inbox: Inbox, src: int):
        key = (src, p.group.id, p.seq, p.tag, True)
        expected = self.engine.expected_header(p)
        ring = self.ring_of[src]
        timeout = self.session.timeout_of(p.group)
        deadline = time.monotonic() + timeout
        inbox.set_open(True)
        early = self.mailbox.early
        spun = False
        nap = SLICE
        while True:
            seen = inbox.bell()
            got = early.pop(key, None) if early else None
            if got is None:
                got = self._take(p, key, ring, expected)
            if got is not None:
                return self._deliver(p, *got)
            err = self._refusal(p, src)
            if err is not None:
                got = early.pop(key, None) or self._take(p, key, ring, expected)  # just sent
                if got is not None:
                    return self._deliver(p, *got)
                if key in self.dropped:  # sent, but its stash went before the loop took it
                    raise self.lost_with_stash(p, src, self.dropped.pop(key))
                raise err
            now = time.monotonic()
            if now >= deadline:
                self.engine.give_back_p2p_seq(p)
                raise DistTimeoutError(
                    f"recv on rank {self.rank} from rank {src} ({tag_name(p.tag)}) timed "
                    f"out after {timeout:g} s: no matching send", collective="recv",
                    group=p.group, missing=[src])
            if not spun:  # first spin or yield, looking at the sender's ring
                spun = True
                if self._wait_briefly(inbox, ring, seen, now):
                    continue
            inbox.will_sleep()
            if inbox.bell() == seen and not inbox.waiting(ring) and key not in early:
                inbox.sleep(seen, min(nap, deadline - now))
                # nothing rang (news of a message or a peer rings the bell): sleep longer
                nap = min(nap * 2, IDLE_SLICE) if inbox.bell() == seen else SLICE

    def receive_numbered(self, p: P2P, inbox: Inbox, src: int):
        """In the inbox: receive ``p``, already numbered, from ``src`` (as :meth:`recv`
        does once in the inbox)."""
        return self._recv(p, inbox, src)

    def sleeps_at_once(self) -> bool:
        """Whether a receiver here sleeps without spinning or yielding first (the
        node's ranks crowd its cores)."""
        return self._patience.full == (0.0, 0.0)

    def _wait_briefly(self, inbox: Inbox, ring: int, seen: int, now: float) -> bool:
        """Spin or yield until ring ``ring`` or the bell changes (True), with the patience
        of the fast path's waits (:class:`minidist.shm.fast_slots.Patience`)."""
        self._waits += 1
        if self._waits % RESET_EVERY == 0:  # the peers may be quicker now: try again
            self._patience.reset()
        return self._patience.wait(lambda: inbox.waiting(ring) or inbox.bell() != seen, now)

    def _take(self, p: P2P, key: tuple, ring: int, expected: bytes | None = None
              ) -> tuple[wire.Header | None, np.ndarray] | None:
        """The record ``key`` from the sender's ring, if it is there (its payload copied
        straight into ``p``'s buffer when it fits); every record before it (another
        receive's) goes to the mailbox. A record whose header is ``expected`` (the one
        its sender encodes for a message that fits ``p``) is taken without decoding it
        (its header then comes back as None)."""
        inbox = self.inbox
        if not inbox.waiting(ring):
            return None
        with self.drain_lock:
            while True:
                raw = inbox.peek(ring)
                if raw is None:
                    return None
                if raw == expected:
                    payload = inbox.take(ring, p.flat.view(np.uint8))[1]
                    if payload is None:
                        raise self.lost_with_stash(p, p.peer, p.flat.nbytes)
                    self.received += 1
                    return None, _TAKEN_INTO
                h = self.ring_header(raw, ring)
                if h is None or (h.src, h.group, h.seq, h.tag, True) != key:
                    rec = inbox.take(ring)
                    if h is not None:
                        self.set_aside(h, rec[1], self.loop)
                    continue
                into = None
                if p.flat is not None and self.engine.p2p_check(p, h) is None:
                    into = p.flat.view(np.uint8)
                payload = inbox.take(ring, into)[1]
                if payload is None:
                    raise self.lost_with_stash(p, h.src, h.nbytes)
                self.received += 1
                return h, (_TAKEN_INTO if into is not None and payload is into else payload)

    def set_aside(self, h: wire.Header, payload: np.ndarray | None,
                  loop: asyncio.AbstractEventLoop | None) -> None:
        """A record that another receive takes: to the mailbox (through ``loop`` when
        not on it), or, lost with its sender's stash, remembered to say so."""
        if payload is None:
            self.dropped[(h.src, h.group, h.seq, h.tag, True)] = h.nbytes
        elif loop is None:
            self.mailbox.deposit(h, payload)
        else:
            loop.call_soon_threadsafe(self.mailbox.deposit, h, payload)

    def lost_with_stash(self, p: P2P, src: int, nbytes: int) -> PeerLostError:
        """The error of receive ``p``, whose ``nbytes``-byte message from ``src`` was
        lost with its sender's stash."""
        return PeerLostError(f"recv on rank {self.rank} from rank {src} ({tag_name(p.tag)})"
                             f": rank {src} left before its {nbytes}-byte message was "
                             "taken from its stash", ranks=[src])

    def ring_header(self, raw: bytes, ring: int) -> wire.Header | None:
        """The header of record ``raw`` read from ``ring``; None if it is not one that
        the ring's sender writes (the record is to be dropped)."""
        try:
            h = wire.decode_header(raw)
        except wire.ProtocolError:
            return None
        if h.kind != wire.Kind.P2P or h.src != self.local[ring]:
            return None  # not what this ring's sender writes: dropped
        return h

    def _deliver(self, p: P2P, h: wire.Header | None, payload: np.ndarray):
        if payload is _TAKEN_INTO:  # checked, and in p.flat already
            p.source = p.peer
            if p.user is not None:
                np.copyto(p.user, p.flat.reshape(p.user.shape))
            else:
                self.takes.went(p)
            return None
        err = self.engine.p2p_check(p, h)
        if err is None and p.flat is not None and len(payload) != p.flat.nbytes:
            err = CollectiveMismatchError(
                f"recv on rank {self.rank} from rank {h.src}: a message of {len(payload)} "
                f"bytes for a {p.flat.nbytes}-byte buffer; the buffer is unchanged")
        if err is not None:
            raise err
        p.source = h.src
        if p.flat is None:
            return bytes(payload)
        p.flat.view(np.uint8)[:] = np.frombuffer(payload, np.uint8)
        if p.user is not None:
            np.copyto(p.user, p.flat.reshape(p.user.shape))
        return None

    def _refusal(self, p: P2P, src: int) -> DistError | None:
        e = self.engine
        if e.rendezvous_lost is not None:
            return e.no_rendezvous("recv")
        dead = self.mailbox.is_dead(src)
        return dead if isinstance(dead, DistError) else None

    # ------------------------------------------------------------------ on the loop

    def close_and_drain(self) -> None:
        """On the loop, before a receive or probe there: close the inbox and move what
        its rings hold to the mailbox."""
        inbox = self.inbox
        if inbox is None or not inbox.is_open:
            return
        inbox.set_open(False)
        self.drain_on_loop()

    def drain_on_loop(self) -> None:
        """On the loop: move every record of the rings to the mailbox."""
        if self.inbox is None:
            return
        with self.drain_lock:
            inbox = self.inbox
            if inbox is None:
                return
            for ring in inbox.nonempty():
                while (rec := inbox.take(int(ring))) is not None:
                    h = self.ring_header(rec[0], int(ring))
                    if h is not None:
                        self.set_aside(h, rec[1], None)

    def forget(self, rank: int) -> None:
        """On the loop: ``rank`` is back as a new process. Messages with it go through
        sockets from now on; what its earlier process left in this rank's rings goes to
        the mailbox (which drops it, see :meth:`Mailbox.revive`)."""
        with self._send_lock:
            out = self._outboxes.pop(rank, None)
            if out is not None:
                out.close()
            self._retry.pop(rank, None)
            self.routes.forget(rank)
            self.takes.forget(rank)
        self.drain_on_loop()
        self.ring_of.pop(rank, None)

    def _doorbell(self, src: int) -> None:
        self.drain_on_loop()

    def _news(self) -> None:
        """On the loop: a message came through the socket, or a peer is gone."""
        if self.waiting and self.inbox is not None:
            self.inbox.ring_bell()

