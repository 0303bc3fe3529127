"""Blocking receives like the last one, planned once: an RL env worker receives the same
kind of small message (an action) from its learner on every step, and planning,
checking and decoding it again each time was most of what a receive through the inbox
(:mod:`minidist.shm.p2p`) cost on a crowded node.

After a message from a rank with a tag was taken whole from its ring (its header was the
one its sender writes for a message that fits), :class:`Takes` remembers its kind
(group, dtype, size and shape digest). The next blocking receive from that rank and tag
into an array of that kind is remembered as a :class:`Take`; from then on a receive
from that rank and tag into a C-contiguous, writable numpy array of the same group,
dtype and shape is numbered at once and looks at the sender's ring: a record whose 64
header bytes are the ones its sender writes for this message (the same comparison the
general path makes) is copied straight into the array. If the ring is empty and the
receiver would sleep at once (the node's ranks crowd its cores), it sleeps once on the
inbox's bell and looks again. Anything else (a record of another receive, a message
that came through the socket, a peer gone, a wait that goes on) continues on the
general receive (:meth:`FastP2P._recv`) with the number it got, which takes, sets
aside, waits and raises exactly as for any receive; its deadline starts there, so such
a receive may wait up to one sleep slice (0.1 s) longer than the group's timeout.

With the compiled core, a remembered receive is also a :class:`minidist.shm._core.Lane` in
:attr:`~minidist.shm.routes.Remembered.lanes`: the blocking API's receive hands the
caller's array to it, and the checks, the numbering, the wait of one slice at most and
the copy happen in one C call, in the inbox as above (its receiver lock held; the drain
lock for the take). A receive it does not handle it leaves unnumbered; one whose message
did not come within the slice it hands back numbered, and the general receive takes it
on with that number.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from .. import wire
from ..group import Group
from ..ops import dtype_code
from ..plan import P2P
from .fast_slots import SLICE
from .inbox import MESSAGE_BYTES
from .routes import LANE, Remembered


class Take:
    """The kind of message this rank receives from one rank with one tag, and where its
    ring lies in this rank's inbox ``inbox``."""

    __slots__ = ("group", "dtype", "dtype_code", "shape", "digest", "size", "nbytes",
                 "inbox", "ring", "lane")

    def __init__(self, group: Group, dtype: np.dtype, shape: tuple, digest: int,
                 inbox: Any, ring: int) -> None:
        self.group, self.dtype, self.shape, self.digest = group, dtype, shape, digest
        self.dtype_code = dtype_code(dtype)
        self.size = int(np.prod(shape, dtype=np.int64))
        self.nbytes = self.size * dtype.itemsize
        self.inbox, self.ring = inbox, ring
        self.lane: Any = None  # its compiled lane, if any


class Takes(Remembered):
    """One rank's remembered receives, taken from its inbox by ``p2p`` (its
    :class:`minidist.shm.p2p.FastP2P`)."""

    def __init__(self, p2p: Any) -> None:
        super().__init__()
        self.p2p = p2p
        self.plan = p2p.session.plan
        self.engine = p2p.engine
        self.mailbox = p2p.mailbox
        self._by_take = 0  # messages taken by a remembered receive in Python

    @property
    def taken(self) -> int:
        """Messages taken by a remembered receive (in Python or by its lane)."""
        return self._by_take + self.by_lanes

    def recv_again(self, array: object, src: int, tag: int, group: object,
                   loop: asyncio.AbstractEventLoop) -> bool:
        """From the caller's thread: a blocking receive from ``src`` with ``tag`` on
        ``group`` (None: the default group) into ``array`` by its remembered kind. True
        once the message is in ``array`` (DistError raises as from any receive); False
        if it has none (nothing was done: the general path plans it, and the next one
        of its kind is remembered)."""
        found = self.remembered(array, src, tag, group)
        if found is None or not array.flags.writeable:
            return False
        t, g = found
        p2p = self.p2p
        if p2p.inbox is not t.inbox:  # closed, or made again
            return False
        # None once taken; NOT_TAKEN if another thread waits in the inbox (not numbered)
        return p2p.in_inbox(loop, lambda inbox: self._take(t, array, src, tag, g, inbox)) \
            is None

    def _take(self, t: Take, array: np.ndarray, src: int, tag: int, g: Group,
              inbox: Any) -> None:
        """In the inbox: the message, numbered now, from its ring; else the general
        receive with that number (None, or its DistError)."""
        e, p2p, mailbox = self.engine, self.p2p, self.mailbox
        seq = e.next_p2p_seq(g, src, tag, False)
        expected = wire.encode_p2p(t.dtype_code, 0, g.id, seq, src, tag, t.digest, t.size,
                                   t.nbytes)
        ring, into, drain_lock = t.ring, memoryview(array).cast("B"), p2p.drain_lock
        inbox.set_open(True)
        box = inbox.core
        for sleep in (True, False):
            seen = inbox.bell()
            sleep = sleep and not (mailbox.early or e.rendezvous_lost is not None
                                   or mailbox.is_dead(src) is not None)
            if box is not None and sleep:
                box.wait(ring, seen, SLICE)  # spin, then sleep on the bell (the GIL let go)
                sleep = False
            if inbox.waiting(ring):
                with drain_lock:  # (the loop may move the rings' records meanwhile)
                    took = p2p.inbox is inbox and inbox.take_if(ring, expected, into)
                if not took:
                    break  # another receive's record: the general path sets it aside
                self._by_take += 1
                return None
            if not sleep or not p2p.sleeps_at_once():
                break
            inbox.will_sleep()  # as the general receive sleeps
            if inbox.bell() == seen and not inbox.waiting(ring):
                inbox.sleep(seen, SLICE)
        p = P2P(g, src, tag, seq, array.reshape(-1), t.digest, False)
        return p2p.receive_numbered(p, inbox, src)

    def _learn(self, array: object, src: int, tag: int, g: object) -> None:
        """A remembered receive from ``src`` with ``tag`` if ``array`` is of the kind of
        the last message taken whole from its ring, and fits a record."""
        digest = self.like(array, src, tag, g)
        p2p = self.p2p
        ring = p2p.ring_of.get(src)
        if digest is None or array.nbytes > MESSAGE_BYTES or p2p.inbox is None or \
                ring is None:
            return
        t = Take(g, array.dtype, array.shape, digest, p2p.inbox, ring)
        box = p2p.inbox.core
        if LANE is not None and box is not None and p2p.loop is not None:
            header = wire.encode_p2p(t.dtype_code, 0, g.id, 0, src, tag, digest, t.size,
                                     t.nbytes)
            t.lane = LANE(box, ring, header, g, self.plan, np.ndarray, t.dtype, t.shape,
                          t.nbytes, self.engine, (g.id, src, tag, False), src,
                          p2p.receiver, p2p, True, SLICE,
                          (p2p.inbox, self.mailbox, p2p.drain_lock, p2p.loop,
                           p2p.close_and_drain))
        self.make(src, tag, t)
