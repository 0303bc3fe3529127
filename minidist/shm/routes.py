"""Blocking sends like the last one, planned once: an RL learner sends the same kind of
small message (an action) to the same env workers on every step, and planning and
checking it again each time was most of what a send through an inbox
(:mod:`minidist.shm.p2p`) cost.

After a message went through its receiver's ring, :class:`Routes` remembers its kind
(group, dtype, size and shape digest) by receiver and tag. The next blocking send there
with an array of that kind is remembered as a :class:`Route`; from then on a send to
that receiver and tag with a C-contiguous numpy array of the same group, dtype and shape
is numbered and encoded at once and written into the ring, with the same numbers and
header bytes the planner and the engine would have given it. Anything else takes the
general path, which checks and says what is wrong. A message that the ring does not
take (full, or the inbox closed) goes on through the general path with the number it
got, as any message does.

With the compiled core, a route is also a :class:`minidist.shm._core.Lane` in
:attr:`Remembered.lanes`: the blocking API's send hands the caller's array to it, and
the checks above, the numbering (in the engine's table) and the write into the ring
happen in one C call, under the send lock and with the GIL held from the numbering to
the write. Whatever the lane does not handle (another kind of message, a peer gone, the
lock busy, the ring full or closed) it leaves unnumbered, and the send goes on as above.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import wire
from ..group import Group
from ..ops import dtype_code
from ..plan import P2P
from . import core
from .inbox import Outbox

ROUTES = 1024  # remembered kinds and routes (by receiver and tag) before they are dropped
LANE = getattr(core.compiled, "Lane", None)  # the compiled core's lanes (None: pure core)


class Route:
    """The kind of message this rank sends to one rank with one tag: its group, dtype,
    shape and shape digest, and the receiver's inbox it is written into."""

    __slots__ = ("group", "dtype", "dtype_code", "shape", "digest", "out", "lane")

    def __init__(self, group: Group, dtype: np.dtype, shape: tuple, digest: int,
                 out: Outbox) -> None:
        self.group, self.dtype, self.shape, self.digest, self.out = \
            group, dtype, shape, digest, out
        self.dtype_code = dtype_code(dtype)
        self.lane: Any = None  # its compiled lane, if any


class Remembered:
    """Messages planned once, by peer and tag (:class:`Routes` for sends,
    :class:`minidist.shm.takes.Takes` for receives): ``kinds`` the kind of the last
    message that went through a ring with that peer and tag, ``made`` what was made of
    it for the next ones of that kind (each kept for at most ROUTES keys), ``lanes``
    the compiled lanes of what was made (by peer and tag; never replaced, so a caller
    may hold it)."""

    def __init__(self) -> None:
        self.kinds: dict[tuple[int, int], tuple] = {}  # (group, dtype, size, shape digest)
        self.made: dict[tuple[int, int], Any] = {}
        self.lanes: dict[tuple[int, int], Any] = {}
        self._carried = 0  # messages carried by lanes dropped since

    @property
    def by_lanes(self) -> int:
        """Messages carried by this rank's lanes (dropped ones too)."""
        return self._carried + sum(lane.count for lane in self.lanes.values())

    def _drop_lane(self, key: tuple[int, int]) -> None:
        lane = self.lanes.pop(key, None)
        if lane is not None:
            lane.drop()
            self._carried += lane.count

    def went(self, p: P2P) -> None:
        """Message ``p`` (an array, into or from a C-contiguous buffer) went whole
        through the ring of its peer ``p.peer``: remember its kind."""
        kinds = self.kinds
        if len(kinds) >= ROUTES:
            kinds.clear()
        kinds[(p.peer, p.tag)] = (p.group, p.flat.dtype, p.flat.size, p.shape)

    def like(self, array: object, peer: int, tag: int, g: object) -> int | None:
        """The shape digest of the last message with ``peer`` and ``tag`` if
        ``array`` is a C-contiguous numpy array of its kind on group ``g``; else None."""
        last = self.kinds.get((peer, tag))
        if last is None or type(array) is not np.ndarray or not array.flags.c_contiguous:
            return None
        group, dtype, size, digest = last
        if group is not g or array.dtype != dtype or array.size != size or \
                wire.shape_digest(array.shape) != digest:
            return None
        return digest

    def remembered(self, array: object, peer: int, tag: int,
                   group: object) -> tuple[Any, Group] | None:
        """(what was made for the messages with ``peer`` and ``tag``, its group) if
        ``array`` on ``group`` (None: the default group) is a C-contiguous numpy array of
        its kind; else None, nothing made yet being learnt from this one (the general
        path plans it, and the next one of its kind finds what was made)."""
        try:
            made = self.made.get((peer, tag))
        except TypeError:  # not a rank or not a tag: the general path says so
            return None
        g = self.plan.default if group is None else group
        if made is None:
            self._learn(array, peer, tag, g)
            return None
        if g is not made.group or type(array) is not np.ndarray or \
                array.dtype is not made.dtype or array.shape != made.shape or \
                not array.flags.c_contiguous:
            return None
        return made, g

    def _learn(self, array: object, peer: int, tag: int, g: object) -> None:
        """Make something of ``array``'s kind for the next messages with ``peer`` and
        ``tag``, if it is the kind of the last one (:meth:`like`)."""
        raise NotImplementedError

    def make(self, peer: int, tag: int, made: Any) -> None:
        """Use ``made`` (and its compiled lane, if it has one) for the next messages with
        ``peer`` and ``tag``."""
        if len(self.made) >= ROUTES:
            self.clear_made()
        self._drop_lane((peer, tag))
        self.made[(peer, tag)] = made
        if made.lane is not None:
            self.lanes[(peer, tag)] = made.lane

    def forget(self, rank: int) -> None:
        """``rank`` is a new process (its inbox and its ring here are others); a
        sender's :class:`Routes` calls it under its send lock."""
        for key in [k for k in self.lanes if k[0] == rank]:
            self._drop_lane(key)
        for table in (self.made, self.kinds):
            for key in [k for k in table if k[0] == rank]:
                del table[key]

    def clear_made(self) -> None:
        """Forget what was made (and drop its lanes)."""
        for key in list(self.lanes):
            self._drop_lane(key)
        self.made.clear()

    def clear(self) -> None:
        self.clear_made()
        self.kinds.clear()


class Routes(Remembered):
    """One rank's remembered sends. ``lock`` and ``outboxes`` are the inboxes' writers'
    (:class:`minidist.shm.p2p.FastP2P`'s send lock and mapped inboxes by receiver);
    ``doorbell(group, dst, loop)`` tells a receiver whose inbox closed to look."""

    def __init__(self, session: Any, lock: threading.Lock, outboxes: dict[int, Outbox],
                 doorbell: Callable[[Group, int, asyncio.AbstractEventLoop], None]) -> None:
        super().__init__()
        self.plan = session.plan
        self.engine = session.engine
        self.rank = session.rank
        self.lock, self.outboxes, self.doorbell = lock, outboxes, doorbell
        self._by_route = 0  # messages sent by a route in Python

    @property
    def sent(self) -> int:
        """Messages sent by a route (in Python or by its lane)."""
        return self._by_route + self.by_lanes

    def send_again(self, array: object, dst: int, tag: int, group: object,
                   loop: asyncio.AbstractEventLoop) -> bool | P2P | None:
        """From the caller's thread: a blocking send of ``array`` to ``dst`` with ``tag``
        on ``group`` (None: the default group) by its route. True once it is written;
        the message numbered (a :class:`P2P`) if the ring took nothing (it then goes as
        any message does); None if it has no route (nothing was done: the general path
        plans it, and the next one of its kind takes the route)."""
        found = self.remembered(array, dst, tag, group)
        if found is None:
            return None
        r, g = found
        e = self.engine
        if dst in e.lost or dst in e.left or e.rendezvous_lost is not None:
            return None  # the general path says why
        with self.lock:
            if self.outboxes.get(dst) is not r.out:  # forgotten meanwhile
                return None
            seq = e.next_p2p_seq(g, dst, tag, True)
            done = r.out.put(wire.encode_p2p(r.dtype_code, 0, g.id, seq, self.rank, tag,
                                             r.digest, array.size, array.nbytes), array)
        if done == 0:
            return P2P(g, dst, tag, seq, array.reshape(-1), r.digest, False, sending=True)
        self._by_route += 1
        if done == 2:
            self.doorbell(g, dst, loop)
        return True

    def _learn(self, array: object, dst: int, tag: int, g: object) -> None:
        """A route to ``dst`` with ``tag`` if ``array`` is of the kind of the last
        message that went there through its ring."""
        digest = self.like(array, dst, tag, g)
        out = self.outboxes.get(dst)
        if digest is None or out is None:
            return
        r = Route(g, array.dtype, array.shape, digest, out)
        if LANE is not None and out.core is not None:
            header = wire.encode_p2p(r.dtype_code, 0, g.id, 0, self.rank, tag, digest,
                                     array.size, array.nbytes)
            r.lane = LANE(out.core, out.ring, header, g, self.plan, np.ndarray, r.dtype,
                          r.shape, array.nbytes, self.engine, (g.id, dst, tag, True), dst,
                          self.lock, self.outboxes, False, 0.0, out)
        self.make(dst, tag, r)
