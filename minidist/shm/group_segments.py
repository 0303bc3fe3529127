"""Setting up the fast segments of a rank's groups (the shared slots of
:mod:`minidist.shm.fast_slots` and :mod:`minidist.shm.rooted_area`).

Every member of a group sets its segment up at the group's first fast call, on the
session's loop: the group's first rank makes it and sends its name to the others
(:func:`~.shared_setup.lead_fast`, :func:`~.shared_setup.join_fast`), which map it. A
member that never comes makes the set-up fail as the call would; a rank lost meanwhile,
or an abort, ends it at once on every member. When there is no room for it, every
member learns so from the first rank, and the group's fast calls go over sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from .. import segments
from ..errors import DistError, DistTimeoutError
from ..prepared import FAST_TAG, Prepared
from . import fast_slots, rooted_area, shared_setup

REFUSAL_CHECK = 0.02  # seconds before a set-up's first look at lost ranks and aborts
REFUSAL_EVERY = 0.1  # the longest between its later looks, for 64 ranks; more for more


class FastSegments:
    """The fast segments of one session's groups. ``slots`` maps a group's id to its
    segment (:class:`minidist.shm.rooted_area.Fast`; None: its calls go over sockets); a
    group that is not in it has not been set up yet. ``session``: the
    :class:`~minidist.session.Session` they are part of (which imports this module)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.engine = session.engine
        self.slots: dict[int, rooted_area.Fast | None] = {}
        self.room: dict[int, tuple[bool, bool]] = {}  # (mid area, reads) per group
        self._maps: list[object] = []
        self._setups: dict[int, asyncio.Future] = {}  # the set-ups under way, per group

    async def setup(self, p: Prepared) -> None:
        """Map the fast slots of ``p``'s group (on the loop; every member does it at the
        group's first fast call, ``p``): the first rank creates them and sends their
        name to the others. A rank that never comes makes it fail as ``p`` would."""
        g = p.call.group
        if g.id in self.slots:
            return
        pending = self._setups.get(g.id)
        if pending is not None:  # an earlier call on the group is setting them up
            await asyncio.shield(pending)
            return
        pending = self._setups[g.id] = asyncio.get_running_loop().create_future()
        pending.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await self._setup(p)
        except BaseException as e:
            pending.set_exception(e if isinstance(e, Exception) else DistError(str(e)))
            raise
        finally:
            self._setups.pop(g.id, None)
        pending.set_result(None)

    async def _setup(self, p: Prepared) -> None:
        s = self.session
        g = p.call.group
        refused = self.engine.refusal(p.call)
        if refused is not None:
            raise refused
        leader = g.ranks[0]
        key = g.id ^ 0x5A5A5A5A5A5A5A5A  # not the group's other segment's name
        waiting = [leader]
        messages = s.setup_messages(g, FAST_TAG)
        try:
            if s.rank == leader:
                seg, mid, reads = await self._unless_refused(p, shared_setup.lead_fast(
                    s.job, segments.segment_name(s.job, key, os.getpid()), g,
                    s.plan.can_read(g), *messages, waiting))
            else:
                seg, mid, reads = await self._unless_refused(p, shared_setup.join_fast(
                    fast_slots.segment_bytes(g.size), leader, *messages,
                    lambda name, size: self._attach(p, name, size, leader)))
        except DistTimeoutError:  # the rendezvous knows who never came to this call
            raise await self.engine.timeout_error(p.call, s.timeout_of(g),
                                                   set(waiting)) from None
        self.room[g.id] = (mid, reads)
        if seg is None:  # every member says so: the group's calls go over sockets
            self.slots[g.id] = None
            return
        self._maps.append(seg)
        self.slots[g.id] = rooted_area.Fast(seg, g, g.rank_of(s.rank))

    async def _unless_refused(self, p: Prepared, work):
        """Await ``work`` (a set-up's exchange with some members), but raise at once what
        ends ``p`` for any member (a rank of its group lost or gone, an abort): a member
        that waits for the first rank's word must not wait out the timeout for a rank
        that died without ever coming. The looks grow sparser (up to 0.1 s at 64 ranks,
        1 s at 640 and more), so that a large group's waiting members leave the first
        rank the machine's time."""
        task = asyncio.ensure_future(work)
        most = min(1.0, REFUSAL_EVERY * max(1.0, p.call.group.size / 64))
        wait = REFUSAL_CHECK
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=wait)
                if done:
                    return task.result()
                wait = min(most, 2 * wait)
                refused = self.engine.refusal(p.call, consume=False)
                if refused is not None:
                    raise refused
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _attach(self, p: Prepared, name: str, size: int, leader: int):
        """Map the fast segment ``name`` of ``p``'s group, which its first rank made."""
        try:
            return segments.attach(name, size)
        except FileNotFoundError:
            # the first rank gave up on this call: its abort says why, shortly
            end = asyncio.get_running_loop().time() + 2.0
            while asyncio.get_running_loop().time() < end:
                refused = self.engine.refusal(p.call)
                if refused is not None:
                    raise refused from None
                await asyncio.sleep(0.01)
            raise DistError(f"{p.call.name} on {p.call.group!r} failed on rank "
                            f"{self.session.rank}: rank {leader} abandoned the set-up of "
                            "its shared slots") from None

    def fits(self, p: Prepared) -> bool:
        """Whether ``p``'s group's fast segment can run ``p`` (the same answer on every
        rank): else it runs over sockets."""
        gid = p.call.group.id
        return self.slots.get(gid) is not None and (
            p.call.kind in rooted_area.KINDS  # its area is in the slots' part
            or shared_setup.fits(self.room[gid], p.reads, p.bufs["out"].nbytes))

    def close(self) -> None:
        """Forget every group's segment and unmap them (one still viewed by an array
        stays mapped)."""
        self.slots.clear()
        for seg in self._maps:
            with contextlib.suppress(BufferError):
                seg.close()
        self._maps.clear()
