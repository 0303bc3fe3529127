"""Setting up a group's shared memory, so that every member ends up on the same path.

A group's segment is made by its first rank and mapped by the others, at the group's
first call that needs it (every member makes that call, so every member is here). The
first rank reserves the segment's memory (:func:`minidist.segments.reserve`) before
anyone touches it; when /dev/shm has no room it says so instead of sending the name
(:data:`NO_SEGMENT`), and every member then runs the group's calls over sockets: what
each member knows about the segment comes from the first rank alone, in the same
message, so they cannot disagree. The first time any rank of a node finds no room, it
prints one warning for the job (:func:`minidist.segments.warn_no_room`).

The fast segment (:mod:`minidist.fastpath`) is all reserved, else only its slots (the
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

import contextlib
import mmap
from collections.abc import Awaitable, Callable

from . import fastpath, peer_memory, segments
from .algorithms import shm as shm_algorithm
from .group import Group

NO_SEGMENT = b"-"  # a group's first rank had no room for a segment: no name follows
Send = Callable[[bytes, int], Awaitable[None]]
Recv = Callable[[int], Awaitable[bytes]]


def slots_bytes(size: int) -> int:
    """The bytes of a fast segment of ``size`` ranks before its mid area (all of it for
    groups too large for one)."""
    whole = fastpath.segment_bytes(size)
    if size > fastpath.MID_RANKS:
        return whole
    return whole - 2 * (size + 1) * fastpath.room_bytes(size)


def make_fast(job: str, name: str, size: int) -> tuple[mmap.mmap | None, bool]:
    """(the fast segment of a group of ``size`` ranks, whether its mid area is reserved),
    made by the group's first rank; (None, False) if not even its slots fit."""
    whole, slots = fastpath.segment_bytes(size), slots_bytes(size)
    try:
        return segments.create(name, whole), whole > slots
    except segments.NoRoom as e:
        segments.warn_no_room(job, e, f"the fast path of a group of {size} ranks")
    if slots < whole:
        with contextlib.suppress(segments.NoRoom):
            return segments.create(name, whole, reserved=slots), False
    return None, False


async def lead_fast(job: str, name: str, g: Group, may_read: bool, send: Send, recv: Recv,
                    waiting: list[int]) -> tuple[mmap.mmap | None, bool, bool]:
    """The first rank's part of a fast set-up: (segment, mid area, reads). ``waiting``
    holds the ranks it still waits for (for a timeout's message)."""
    seg, mid = make_fast(job, name, g.size)
    reads = seg is not None and may_read
    offer = NO_SEGMENT if seg is None else "|".join(
        [name, str(int(mid)), peer_memory.spot() if reads else ""]).encode()
    try:
        for r in g.ranks[1:]:
            await send(offer, r)
        if seg is None:
            return None, False, False
        waiting[:] = g.ranks[1:]
        for r in g.ranks[1:]:
            got = (await recv(r)).decode().split("|")
            waiting.remove(r)
            # the member read this rank, and this rank reads the member
            reads = reads and got[1:2] == ["1"] and peer_memory.readable(got[2])
        if seg is not None and may_read:
            for r in g.ranks[1:]:
                await send(b"r1" if reads else b"r0", r)
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


async def algorithm_segment(job: str, me: int, g: Group, name: str, send: Send,
                            recv: Recv) -> mmap.mmap | None:
    """The segment of the ``shared_memory`` algorithm's calls on ``g`` (two halves of
    SEGMENT_BYTES), or None (on every member) when its first rank had no room.
    FileNotFoundError on a member if the first rank gave up meanwhile."""
    size = 2 * shm_algorithm.SEGMENT_BYTES
    leader = g.ranks[0]
    if me != leader:
        got = await recv(leader)
        if got == NO_SEGMENT:
            return None
        seg = segments.attach(got.decode(), size)
        await send(b"ok", leader)
        return seg
    try:
        seg = segments.create(name, size)
    except segments.NoRoom as e:
        segments.warn_no_room(job, e, f"the shared-memory algorithm's segment of a group "
                              f"of {g.size} ranks")
        seg = None
    try:
        for r in g.ranks[1:]:
            await send(NO_SEGMENT if seg is None else name.encode(), r)
        for r in g.ranks[1:] if seg is not None else ():
            await recv(r)
    finally:
        segments.unlink(name)
    return seg


def fits(room: tuple[bool, bool], reads: bool, nbytes: int) -> bool:
    """Whether a fast call (``reads``: one that reads its peers; ``nbytes``: its vector)
    can run in a fast segment of which ``room`` = (mid area, reads) holds."""
    if reads:
        return room[1]
    return room[0] or nbytes <= fastpath.SLOT_BYTES

