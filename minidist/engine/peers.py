"""The engine's knowledge of the other ranks: who died, who left, who came back,
whether the rendezvous is still there; each piece of news ends the calls that need
that rank."""

from __future__ import annotations

import asyncio

from ..errors import PeerLostError
from ..group import Group
from .base import (
    LEFT,
    NEWS_GRACE,
)


class Peers:
    """The engine's knowledge of the other ranks: who died, who left, who came back,"""

    def peer_lost(self, rank: int, reason: str) -> None:
        """The rendezvous says ``rank`` died (or, for ``rank`` -1, that the rendezvous
        itself is gone): fail everything that needs it, now and later."""
        if rank < 0:
            self._rendezvous_gone(reason)
            return
        if rank in self.lost:
            return
        self.left.pop(rank, None)
        self.lost[rank] = reason
        exc = PeerLostError(f"rank {rank} died ({reason})", ranks=[rank])
        self.mailbox.peer_dead(rank, exc)
        if self.endpoint is not None:
            self.endpoint.forbid(rank, exc)
        self._heard(rank)
        for a in list(self._active):
            if a.call is None and a.peer < 0:
                self._check_anyone(a)
            elif a.needs(rank):
                what = a.call.name if a.call is not None else "send/recv"
                self._fail(a, PeerLostError(
                    f"{what} on {a.group!r} failed on rank {self.rank}: rank {rank} died "
                    f"({reason})", ranks=[rank], collective=what, group=a.group))

    def peers_left(self, ranks: list[int]) -> None:
        """The rendezvous says these ranks left the job normally. Nothing more will come
        from them once what they sent has been read; nobody connects to them again. A
        call that waits on one of them fails; the others go on."""
        for rank in ranks:
            if rank in self.left or rank in self.lost or rank == self.rank:
                continue
            self.left[rank] = LEFT
            exc = PeerLostError(f"rank {rank} left the job ({LEFT})", ranks=[rank],
                                left=True)
            if self.endpoint is not None:
                self.endpoint.forbid(rank, exc)
            if self.endpoint is None or not self.endpoint.has_connection(rank):
                self.mailbox.peer_dead(rank, exc)
            # else: its connection's end, right behind its last frames, says so
            self._heard(rank)
        for a in list(self._active):
            if a.call is None and a.peer < 0:
                self._check_anyone(a)

    def peer_back(self, rank: int, incarnation: int) -> None:
        """``rank`` died and is back as a new process, its ``incarnation`` (the
        rendezvous admitted it again): it may be talked to again; messages to and from it
        are numbered afresh. Groups made before, with its earlier process, stay refused
        (see :meth:`stale`)."""
        self.died[rank] = self.lost.get(rank) or self.left.get(rank) or "it died"
        self.incarnation_of[rank] = incarnation
        self.lost.pop(rank, None)
        self.left.pop(rank, None)
        self._news.pop(rank, None)
        self.mailbox.revive(rank)
        for key in [k for k in self.p2p_seqs if k[1] == rank]:
            del self.p2p_seqs[key]

    def stale(self, g: Group) -> list[int]:
        """The members of ``g`` whose process, the one ``g`` was made with, died (they
        were restarted since: ``g`` can never run again)."""
        incs = g.incarnations
        return [r for r in g.members_among(self.died)
                if (incs[g.rank_of(r)] if incs else 0) != self.incarnation_of.get(r, 0)]

    def _rendezvous_gone(self, reason: str) -> None:
        if self.rendezvous_lost is not None:
            return
        self.rendezvous_lost = reason
        for fut in self._news.values():
            if not fut.done():
                fut.set_result(None)
        for a in list(self._active):
            self._fail(a, self.no_rendezvous(a.call.name if a.call is not None
                                              else "send/recv"))

    def no_rendezvous(self, what: str) -> PeerLostError:
        host = self.rendezvous_host
        if host is not None and host != self.rank:
            return PeerLostError(f"{what} on rank {self.rank} failed: rank {host}, whose "
                                 f"process hosts the rendezvous, is gone "
                                 f"({self.rendezvous_lost})", ranks=[host])
        return PeerLostError(f"{what} on rank {self.rank} failed: the rendezvous is gone "
                             f"({self.rendezvous_lost}): the launcher or this node's agent "
                             "stopped, and no failure can be told to the job any more")

    def _heard(self, rank: int) -> None:
        fut = self._news.get(rank)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _news_of(self, rank: int) -> asyncio.Future:
        """A future done once the rendezvous has said why ``rank`` is gone, or after
        NEWS_GRACE seconds without a word."""
        fut = self._news.get(rank)
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self._news[rank] = loop.create_future()
            if rank in self.lost or rank in self.left or self.rendezvous_lost is not None:
                fut.set_result(None)
            else:
                timer = loop.call_later(NEWS_GRACE, lambda: fut.done() or fut.set_result(None))
                fut.add_done_callback(lambda _f: timer.cancel())
        return fut

    def connection_lost(self, rank: int, reason: str) -> None:
        """Every connection with ``rank`` ended (all it sent has been read): receives
        from it can never complete. The error waits for the rendezvous' word on why,
        so that it says whether ``rank`` left or died, and names a rank that died first."""
        self._news_of(rank).add_done_callback(lambda _f: self._connection_gone(rank, reason))

    def _gone_error(self, rank: int, detail: str) -> PeerLostError:
        """Why nothing more can come from ``rank``, as far as this rank knows."""
        earlier = {r: why for r, why in self.lost.items() if r != rank}
        if rank in self.lost:
            msg, left = f"rank {rank} died ({self.lost[rank]})", False
        elif rank in self.left:
            msg, left = f"rank {rank} left the job ({self.left[rank]})", True
        elif self.rendezvous_lost is not None:
            return self.no_rendezvous(f"talking to rank {rank}")
        else:
            msg, left = (f"rank {rank} closed its connection ({detail}) and the rendezvous "
                         f"has not said why"), False
        if earlier:
            msg += "; before it, " + "; ".join(f"rank {r} died ({why})"
                                               for r, why in sorted(earlier.items()))
        return PeerLostError(msg, ranks=[rank, *earlier], left=left and not earlier)

    def _connection_gone(self, rank: int, reason: str) -> None:
        exc = self._gone_error(rank, reason)
        self.mailbox.peer_dead(rank, exc)
        if self.endpoint is not None:
            self.endpoint.forbid(rank, exc)
        for a in list(self._active):
            if a.call is None and a.peer < 0:
                self._check_anyone(a)

    async def _explain(self, rank: int, exc: PeerLostError) -> PeerLostError:
        """A send to ``rank`` failed: say why, once the rendezvous has had its word."""
        await asyncio.shield(self._news_of(rank))
        if rank in self.lost or rank in self.left or self.rendezvous_lost is not None:
            return self._gone_error(rank, str(exc))
        return exc
