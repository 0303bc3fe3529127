"""Point-to-point messages through the engine: sends, receives from one rank or
any, probes, with the same deadlines and news of peers as collectives."""

from __future__ import annotations

import asyncio
import functools

from .. import ops, wire
from ..errors import CollectiveMismatchError, DistError, DistTimeoutError, PeerLostError
from ..group import Group
from ..plan import Call
from ..transport.endpoint import Connection
from .base import (
    FLAG_OBJECT,
    OBJECT_DTYPE,
    Active,
    as_bytes,
    tag_name,
)


class PointToPoint:
    """Point-to-point messages through the engine: sends, receives from one rank or"""

    def send_p2p_now(self, p, loop: asyncio.AbstractEventLoop) -> bool:
        """From the caller's thread: write a small message to a peer already connected
        over a Unix socket, without the loop. False (nothing written): use
        :meth:`send_p2p`."""
        conn = self._direct(p.peer)
        return conn is not None and conn.send_now(loop, *self.p2p_frame(p))

    def _direct(self, dst: int) -> Connection | None:
        """The connection a frame to ``dst`` may be written on from the caller's thread:
        open, over a Unix socket, to a peer not gone."""
        conn = None if self.endpoint is None else self.endpoint.connected(dst)
        return conn if conn is not None and conn.unix and dst not in self.lost \
            and dst not in self.left and self.rendezvous_lost is None else None

    def p2p_frame(self, p) -> tuple[bytes, memoryview | None]:
        """The frame of message ``p``: its header, and its payload (None if empty)."""
        nbytes = p.flat.nbytes
        return _header(p, self.rank), as_bytes(p.flat) if nbytes else None

    def expected_header(self, p) -> bytes | None:
        """The header of the message that receive ``p`` (from a known rank) takes
        whole, exactly as its sender encodes it, when it fits (None for an object,
        whose size is any): a message with these 64 bytes needs no other check."""
        return None if p.flat is None else _header(p, p.peer)

    async def send_p2p(self, p, timeout: float) -> None:
        """Send one point-to-point message (done once the kernel has taken it)."""
        if self.rendezvous_lost is not None:
            raise self.no_rendezvous("send")
        a = self._enter(p.group, peer=p.peer)
        try:
            try:
                async with asyncio.timeout(timeout):
                    await self.endpoint.send(p.peer, *self.p2p_frame(p))
            except PeerLostError as e:
                raise await self._explain(p.peer, e) from None
        except (asyncio.CancelledError, DistError, TimeoutError) as e:
            err = self._outcome(a, e)
            if err is e:
                raise
            if err is not None:
                raise err from None
            raise DistTimeoutError(f"send to rank {p.peer} ({tag_name(p.tag)}) did not finish "
                                   f"within {timeout:g} s", collective="send",
                                   group=p.group, missing=[p.peer]) from None
        finally:
            self._active.discard(a)

    def p2p_check(self, p, h: wire.Header) -> Exception | None:
        """The error a receive ``p`` gets for the message with header ``h`` (it does not
        fit), or None."""
        me = self.rank
        obj = bool(h.flags & FLAG_OBJECT)
        if obj != p.is_object:
            return CollectiveMismatchError(
                f"recv on rank {me} from rank {h.src} ({tag_name(p.tag)}): rank {h.src} "
                f"sent {'an object' if obj else 'an array'} but this rank expects "
                f"{'an object' if p.is_object else 'an array'}")
        if obj or (h.dtype == ops.dtype_code(p.flat.dtype) and h.count == p.flat.size
                   and h.shape == p.shape):
            return None
        theirs = Call(wire.Kind.P2P, p.group, p.seq, h.dtype, 0, 0, "", -1, h.count,
                      h.shape)
        return CollectiveMismatchError(
            f"recv on rank {me} from rank {h.src} ({tag_name(p.tag)}): the message does "
            f"not fit the buffer: sent {theirs.describe(h)[4:]}, buffer is "
            f"count={p.flat.size}, dtype={p.flat.dtype} (shape digest "
            f"{'differs' if h.shape != p.shape else 'equal'}); the buffer is unchanged")

    async def recv_p2p(self, p, timeout: float) -> bytes | None:
        """Receive one point-to-point message into ``p.flat`` (or, for an object, return
        its bytes); ``p.source`` is then its sender. ``p.peer`` -1: from any rank of the
        group, the first message to arrive. CollectiveMismatchError, with the buffer
        untouched, if the message does not fit."""
        if self.rendezvous_lost is not None:
            raise self.no_rendezvous("recv")
        self.before_receive()
        me = self.rank
        anyone = p.peer < 0
        where = "any rank" if anyone else f"rank {p.peer}"

        check = functools.partial(self.p2p_check, p)
        view = None if p.flat is None else as_bytes(p.flat)
        a = self._enter(p.group, peer=p.peer)
        if anyone:
            gid, tag = p.group.id, p.tag

            def expected(src: int) -> int:
                return self.p2p_seqs.get((gid, src, tag, False), 0)

            def taken(src: int) -> None:
                self.p2p_seqs[(gid, src, tag, False)] = expected(src) + 1

            fut = self.mailbox.post_any(gid, tag, view, check, expected, taken)
            forget = lambda: self.mailbox.cancel_any(fut)  # noqa: E731
            if not fut.done():
                self._check_anyone(a)
                if a.error is not None:
                    forget()
                    self._active.discard(a)
                    raise a.error
        else:
            key = (p.peer, p.group.id, p.seq, p.tag, True)
            fut = self.mailbox.post(key, view, check)
            forget = lambda: self.mailbox.cancel(key)  # noqa: E731
        try:
            async with asyncio.timeout(timeout):
                result = await fut
        except (asyncio.CancelledError, DistError, TimeoutError) as e:
            forget()
            err = self._outcome(a, e)
            if err is e:
                raise
            if err is not None:
                raise err from None
            if not anyone:
                self.give_back_p2p_seq(p)
            raise DistTimeoutError(f"recv on rank {me} from {where} ({tag_name(p.tag)}) "
                                   f"timed out after {timeout:g} s: no matching send",
                                   collective="recv", group=p.group,
                                   missing=[] if anyone else [p.peer]) from None
        finally:
            self._active.discard(a)
        header = result if view is not None else result[0]
        p.source = header.src
        return result[1] if view is None else None

    async def probe(self, group: Group, src: int | None, tag: int,
                    timeout: float | None) -> int | None:
        """The sender of the message a receive from ``src`` (None: any rank) with ``tag``
        would take now, without receiving it; with ``timeout`` None, None if none has
        arrived, else wait for one (DistTimeoutError after ``timeout`` seconds)."""
        gid = group.id
        self.before_receive()

        def expected(r: int) -> int:
            return self.p2p_seqs.get((gid, r, tag, False), 0)

        h = self.mailbox.peek(gid, tag, src, expected)
        if h is not None or timeout is None:
            return None if h is None else h.src
        try:
            async with asyncio.timeout(timeout):
                while True:
                    if self.rendezvous_lost is not None:
                        raise self.no_rendezvous("probe")
                    if src is not None and self.mailbox.is_dead(src) is not None:
                        raise self.mailbox.is_dead(src)
                    await self.mailbox.next_arrival()
                    h = self.mailbox.peek(gid, tag, src, expected)
                    if h is not None:
                        return h.src
        except TimeoutError:
            raise DistTimeoutError(
                f"probe on rank {self.rank} for a message from "
                f"{'any rank' if src is None else f'rank {src}'} ({tag_name(tag)}) timed "
                f"out after {timeout:g} s", collective="probe", group=group,
                missing=[] if src is None else [src]) from None

    def _check_anyone(self, a: Active) -> None:
        """A receive from any rank fails once nothing more can come from any other rank
        of its group (each died, or left and what it sent has been read)."""
        others = [r for r in a.group.ranks if r != self.rank]
        if others and all(r in self.lost or self.mailbox.is_dead(r) is not None
                          for r in others):
            self._fail(a, PeerLostError(
                f"recv from any rank on {a.group!r}: every other rank of the group is gone",
                ranks=others, collective="recv", group=a.group,
                left=not any(r in self.lost for r in others)))


def _header(p, src: int) -> bytes:
    """The header that global rank ``src`` sends message ``p`` with."""
    flat = p.flat
    return wire.encode_p2p(OBJECT_DTYPE if p.is_object else ops.dtype_code(flat.dtype),
                           FLAG_OBJECT if p.is_object else 0, p.group.id, p.seq, src, p.tag,
                           p.shape, flat.size, flat.nbytes)
