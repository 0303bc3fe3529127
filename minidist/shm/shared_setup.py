"""Setting up a group's shared memory, so that every member ends up on the same path.

A group's segment is made by its first rank and mapped by the others, at the group's
first call that needs it (every member makes that call, so every member is here). The
first rank reserves the segment's memory (:func:`minidist.segments.reserve`) before
anyone touches it; when /dev/shm has no room it says so instead of sending the name
(:data:`NO_SEGMENT`), and every member then runs the group's calls over sockets: what
each member knows about the segment comes from the first rank alone, in the same
message, so they cannot disagree. The first time any rank of a node finds no room, it
prints one warning for the job (:func:`minidist.segments.warn_no_room`).

The ``shared_memory`` algorithm's segment (:class:`AlgorithmSegment`) is reserved as its
calls need it: a call that needs more than is reserved has its group's first rank
reserve more first and tell the others how much there is, so all run it over sockets
alike when there was no room.

The fast segment (:mod:`minidist.shm.fast_slots`) is all reserved, else only its slots (the
calls that need its mid area go over sockets), else none of it. When the ranks' keys
say they may read each other's memory (:mod:`minidist.peer_memory`), the set-up also
tries it, once: the first rank sends where it can be read, each other rank reads it and
answers whether it could and where it can be read, the first rank reads each of them
and tells them all whether the group's large all_reduces read the peers (a container's
seccomp profile refuses ``process_vm_readv`` with EPERM; then they go over sockets).
Members read the first rank and are read by it; reads between two other members are
taken to be allowed alike (the same user, namespace and ptrace rules for all).
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
from collections.abc import Awaitable, Callable
from typing import Any

from .. import peer_memory, segments
from ..algorithms import shm as shm_algorithm
from ..group import Group
from . import fast_slots

FAN_OUT = 32  # a set-up's messages in flight at once (a connection each, at first)
NO_SEGMENT = b"-"  # a group's first rank had no room for a segment: no name follows
Send = Callable[[bytes, int], Awaitable[None]]
Recv = Callable[[int], Awaitable[bytes]]


def slots_bytes(size: int) -> int:
    """The bytes of a fast segment of ``size`` ranks before its mid area (all of it for
    groups too large for one)."""
    whole = fast_slots.segment_bytes(size)
    if size > fast_slots.MID_RANKS:
        return whole
    return whole - 2 * (size + 1) * fast_slots.room_bytes(size)


def make_fast(job: str, name: str, size: int) -> tuple[mmap.mmap | None, bool]:
    """(the fast segment of a group of ``size`` ranks, whether its mid area is reserved),
    made by the group's first rank; (None, False) if not even its slots fit."""
    whole, slots = fast_slots.segment_bytes(size), slots_bytes(size)
    try:
        return segments.create(name, whole), whole > slots
    except segments.NoRoom as e:
        segments.warn_no_room(job, e, f"the fast path of a group of {size} ranks")
    if slots < whole:
        with contextlib.suppress(segments.NoRoom):
            return segments.create(name, whole, reserved=slots), False
    return None, False


async def _each(ranks: list[int], work: Callable[[int], Awaitable[Any]]) -> list[Any]:
    """``work(r)`` for every rank of ``ranks``, :data:`FAN_OUT` at a time; their answers,
    in that order. The first failure is raised as itself (the others' work is
    cancelled)."""
    turns = asyncio.Semaphore(FAN_OUT)

    async def one(r: int) -> Any:
        async with turns:
            return await work(r)

    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(one(r)) for r in ranks]
    except BaseExceptionGroup as eg:
        raise eg.exceptions[0] from None
    return [t.result() for t in tasks]


async def lead_fast(job: str, name: str, g: Group, may_read: bool, send: Send, recv: Recv,
                    waiting: list[int]) -> tuple[mmap.mmap | None, bool, bool]:
    """The first rank's part of a fast set-up: (segment, mid area, reads). ``waiting``
    holds the ranks it still waits for (for a timeout's message)."""
    seg, mid = make_fast(job, name, g.size)
    reads = seg is not None and may_read
    offer = NO_SEGMENT if seg is None else "|".join(
        [name, str(int(mid)), peer_memory.spot() if reads else ""]).encode()
    async def answer(r: int) -> bool:  # whether member r reads this rank, and it r
        got = (await recv(r)).decode().split("|")
        waiting.remove(r)
        return got[1:2] == ["1"] and peer_memory.readable(got[2])

    try:  # every member at once: a large group's set-up waits for no member in turn
        await _each(g.ranks[1:], lambda r: send(offer, r))
        if seg is None:
            return None, False, False
        waiting[:] = g.ranks[1:]
        answers = await _each(g.ranks[1:], answer)
        reads = reads and all(answers)
        if may_read:
            await _each(g.ranks[1:], lambda r: send(b"r1" if reads else b"r0", r))
    except BaseException:
        with contextlib.suppress(BufferError):
            seg.close()
        raise
    finally:
        segments.unlink(name)  # every member has it mapped (or failed): no name left
    return seg, mid, reads


async def join_fast(size: int, leader: int, send: Send, recv: Recv,
                    attach: Callable[[str, int], Awaitable[mmap.mmap]]
                    ) -> tuple[mmap.mmap | None, bool, bool]:
    """Another rank's part of a fast set-up: (segment, mid area, reads), as the first
    rank (``leader``) said; ``attach(name, size)`` maps the segment."""
    offer = await recv(leader)
    if offer == NO_SEGMENT:
        return None, False, False
    name, mid, spot = offer.decode().split("|")
    seg = await attach(name, size)
    reply = f"ok|{int(peer_memory.readable(spot))}|{peer_memory.spot()}" if spot else "ok"
    await send(reply.encode(), leader)
    reads = spot != "" and await recv(leader) == b"r1"
    return seg, mid == "1", reads


class AlgorithmSegment:
    """The segment of the ``shared_memory`` algorithm's calls on a group: two halves of
    SEGMENT_BYTES (consecutive calls use them in turn), of which the first
    ``reserved[h]`` bytes of half ``h`` have their memory. A call needs the first
    ``tmp_size`` bytes of its half (its chunks are no longer than its vector); when that
    is more, the first rank reserves more (it keeps the file open: ``fd``) and says how
    much the half now has, so every member knows the same ``reserved`` and runs a call
    over sockets alike when there was no room (:meth:`room_for`)."""

    def __init__(self, seg: mmap.mmap, fd: int = -1) -> None:
        self.seg, self.fd = seg, fd
        self.reserved = [0, 0]
        self.refused = 0  # calls that had to go over sockets

    async def room_for(self, job: str, g: Group, me: int, half: int, need: int,
                       send: Send, recv: Recv) -> bool:
        """Whether a call of ``need`` bytes in half ``half`` may run in the segment (every
        member asks at the same call, so they answer alike); the first rank tries to
        reserve more when it is short."""
        have = self.reserved[half]
        if need <= have:
            return True
        leader = g.ranks[0]
        if me == leader:
            if self.fd >= 0:
                have = _reserve(job, self.fd, half, have, need, g.size)
            await _each(g.ranks[1:], lambda r: send(str(have).encode(), r))
        else:
            have = int(await recv(leader))
        self.reserved[half] = have
        self.refused += need > have
        return need <= have

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(BufferError):
            self.seg.close()


def _reserve(job: str, fd: int, half: int, have: int, need: int, size: int) -> int:
    """Reserve the first ``need`` bytes (in powers of two from 1 MiB, at most a half) of
    half ``half`` of an algorithm segment that has ``have``; what it now has."""
    span = shm_algorithm.SEGMENT_BYTES
    want = min(span, max(1 << 20, 1 << (need - 1).bit_length()))
    try:
        segments.reserve(fd, half * span + have, want - have, "the shared_memory algorithm")
    except segments.NoRoom as e:
        segments.warn_no_room(job, e, f"the shared-memory algorithm on a group of {size} "
                              f"ranks (a call of {segments.mib(need)} per half)")
        return have
    return want


async def algorithm_segment(job: str, me: int, g: Group, name: str, send: Send,
                            recv: Recv) -> AlgorithmSegment:
    """Set up the algorithm segment of ``g`` (every member, at the group's first call of
    the ``shared_memory`` algorithm), none of it reserved yet. FileNotFoundError on a
    member if the first rank gave up meanwhile."""
    size = 2 * shm_algorithm.SEGMENT_BYTES
    leader = g.ranks[0]
    if me != leader:
        got = await recv(leader)
        seg = segments.attach(got.decode(), size)
        await send(b"ok", leader)
        return AlgorithmSegment(seg)
    seg, fd = segments.create_open(name, size, reserved=0)
    try:
        await _each(g.ranks[1:], lambda r: send(name.encode(), r))
        await _each(g.ranks[1:], recv)
    except BaseException:
        os.close(fd)
        raise
    finally:
        segments.unlink(name)
    return AlgorithmSegment(seg, fd)


def fits(room: tuple[bool, bool], reads: bool, nbytes: int) -> bool:
    """Whether a fast call (``reads``: one that reads its peers; ``nbytes``: its vector)
    can run in a fast segment of which ``room`` = (mid area, reads) holds."""
    if reads:
        return room[1]
    return room[0] or nbytes <= fast_slots.SLOT_BYTES

