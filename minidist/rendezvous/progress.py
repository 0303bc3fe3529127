"""Progress queries: how far the ranks of a group got, for a rank whose call timed out
(its error names the ranks that never arrived)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Collection

from .. import messages
from .channels import Client

QUERY_TIMEOUT = 3.0  # seconds the rendezvous waits for the ranks' answers


class ProgressQueries:
    """Asks ranks (``client_of(rank)``: its connection, None if it has none) and answers;
    ``lost()`` names the ranks known dead."""

    def __init__(self, client_of: Callable[[int], Client | None],
                 lost: Callable[[], Collection[int]]) -> None:
        self._client_of = client_of
        self._lost = lost
        self._ids = itertools.count(1)

    async def answer(self, c: Client, m: messages.Progress) -> None:
        """Ask each rank ``m`` names how many collectives it has entered on the group
        (each answers with a QueryReply, or not within :data:`QUERY_TIMEOUT`), then
        reply to ``c``."""
        futs: dict[int, asyncio.Future] = {}
        loop = asyncio.get_running_loop()
        for r in m.ranks:
            peer = self._client_of(r)
            if peer is None:
                continue
            qid = next(self._ids)
            fut = loop.create_future()
            peer.queries[qid] = fut
            futs[r] = fut
            peer.send(messages.Query(qid=qid, group=m.group))
        if futs:
            await asyncio.wait(futs.values(), timeout=QUERY_TIMEOUT)
        entered = {str(r): f.result() for r, f in futs.items() if f.done()}
        c.send(messages.Reply(id=m.id, entered=entered,
                              lost=sorted(set(m.ranks) & set(self._lost()))))
        with contextlib.suppress(ConnectionError):
            await c.channel.drain()

    @staticmethod
    def answered(c: Client, m: messages.QueryReply) -> None:
        """``c`` answered query ``m.qid``."""
        fut = c.queries.pop(m.qid, None)
        if fut is not None and not fut.done():
            fut.set_result(m.entered)
