"""Running the calls of the ``shared_memory`` algorithm: their group's segment, in turns.

A group's segment (:class:`minidist.shm.shared_setup.AlgorithmSegment`) is set up by every
member at the group's first such call. It has two halves of
:data:`~minidist.algorithms.shm.SEGMENT_BYTES`, which consecutive calls use in turn: a
rank that finished a call may start the next before a slower one has copied out its
result, and cannot start the one after before every rank finished the first. Calls on
one group run one at a time. Everything here runs on the session's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import numpy as np

from .. import segments
from ..algorithms import shm as shm_algorithm
from ..algorithms.schedule import Schedule
from ..errors import DistError
from ..group import Group
from ..prepared import SHM_TAG, Prepared
from . import shared_setup


class ShmCalls:
    """The ``shared_memory`` algorithm's calls of ``session`` (the
    :class:`~minidist.session.Session` they are part of, which imports this module)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.segments: dict[int, shared_setup.AlgorithmSegment] = {}  # per group
        self._locks: dict[int, asyncio.Lock] = {}
        self._turns: dict[int, int] = {}  # calls per group that ran in its segment so far

    async def run(self, p: Prepared) -> None:
        """Run ``p`` (its schedule has ``shared_tmp``) with its temporary buffer in its
        group's segment; over sockets on every rank when the segment has no room for it."""
        s = self.session
        g = p.call.group
        out = p.bufs["out"]

        async def map_segment() -> Schedule | None:
            turn = self._turns.get(g.id, 0)
            # inside the call: a rank that chose another algorithm is found out here
            seg = await self.segment(g, turn % 2, p.schedule.tmp_size * out.itemsize)
            if seg is None:  # no room in /dev/shm: every rank runs this instead (and
                # the turn stays: only the calls that ran here take turns)
                instead = s.plan.socket_schedule(p.call, p.bufs)
                p.bufs["tmp"] = np.empty(instead.tmp_size, out.dtype)
                return instead
            self._turns[g.id] = turn + 1
            p.bufs["tmp"] = np.frombuffer(seg, out.dtype, p.schedule.tmp_size,
                                          (turn % 2) * shm_algorithm.SEGMENT_BYTES)
            return None

        lock = self._locks.setdefault(g.id, asyncio.Lock())
        async with lock:  # calls on one group share its segment: one at a time
            try:
                await s.engine.run(p.call, p.schedule, p.bufs, p.op, s.timeout_of(g),
                                   prologue=map_segment)
            finally:
                p.bufs["tmp"] = None

    async def segment(self, g: Group, half: int, need: int):
        """This group's shared-memory segment, set up on first use by every member; None
        (on every member) if a call of ``need`` bytes has no room in half ``half``."""
        s = self.session
        seg = self.segments.get(g.id)
        messages = s.setup_messages(g, SHM_TAG)
        if seg is None:
            try:
                seg = self.segments[g.id] = await shared_setup.algorithm_segment(
                    s.job, s.rank, g, segments.segment_name(s.job, g.id, os.getpid()),
                    *messages)
            except FileNotFoundError:  # the first rank gave up on this call meanwhile
                raise DistError(f"shared-memory set-up on {g!r} failed on rank "
                                f"{s.rank}: rank {g.ranks[0]} abandoned it") from None
        ok = await seg.room_for(s.job, g, s.rank, half, need, *messages)
        return seg.seg if ok else None

    def close(self) -> None:
        """Unmap every segment (one still viewed by an array stays mapped)."""
        for seg in self.segments.values():
            with contextlib.suppress(BufferError):
                seg.close()
        self.segments.clear()
