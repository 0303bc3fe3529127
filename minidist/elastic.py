"""Going on when ranks die: shrink, agree, and ranks that come back.

One :class:`Elastic` per session, on its loop. :meth:`shrink` and :meth:`agree` are
agreements that the rendezvous decides for the group's surviving members (see
:mod:`minidist.rendezvous.agreement`): every caller gets the same answer even when
another member dies during the call. A rank that died and was started again (same
rank, a new process) is admitted by the rendezvous as the rank's next *incarnation*;
:meth:`rank_back` makes this rank talk to it again, and :meth:`wait_ranks` waits for
such ranks.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from . import messages
from .errors import DistError, DistTimeoutError
from .group import Group, shrunk_group_id
from .rendezvous.agreement import runs


class Elastic:
    """Shrink, agree and rejoin for one session."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.incarnations = [0] * session.cfg.world_size
        self._seq: dict[tuple[str, int], int] = {}
        self._news: asyncio.Future | None = None
        self._local_epoch = 0  # a world of one decides alone

    # ------------------------------------------------------------------ news

    @property
    def incarnation(self) -> int:
        """How often this rank was restarted (0: it is the rank's first process)."""
        return self.incarnations[self.session.rank]

    def welcome(self, body: dict[str, Any]) -> None:
        """What the rendezvous' welcome says about restarts: every rank's incarnation, and
        (for a restarted rank) which ranks are gone at the moment."""
        s = self.session
        incs = body.get("incarnations")
        if incs and len(incs) == len(self.incarnations):
            self.incarnations[:] = [int(i) for i in incs]
            s.plan.incarnations = self.incarnations
            s.endpoint.incarnation = self.incarnation
            s.endpoint.incarnations.update(
                {r: i & 0xFFFF for r, i in enumerate(self.incarnations) if i})
        for r, why in (body.get("lost") or {}).items():
            s.engine.peer_lost(int(r), str(why))
        if body.get("left"):
            s.engine.peers_left([int(r) for r in body["left"]])

    def rank_back(self, rank: int, incarnation: int) -> None:
        """The rendezvous admitted a new process for ``rank`` (which had died)."""
        s = self.session
        if not 0 <= rank < len(self.incarnations) or rank == s.rank:
            return
        self.incarnations[rank] = incarnation
        s.plan.incarnations = self.incarnations
        if s.p2p is not None:
            s.p2p.forget(rank)
        s.engine.peer_back(rank, incarnation)
        if s.endpoint is not None:
            s.endpoint.revive(rank, incarnation)
        self._tell()

    def _tell(self) -> None:
        fut, self._news = self._news, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _alive(self, rank: int) -> bool:
        e = self.session.engine
        return rank not in e.lost and rank not in e.left

    # ------------------------------------------------------------------ calls

    def _exclusions(self, g: Group, exclude: list[int] | None) -> list[int]:
        """The ranks to leave out of ``g`` (checked); None: every member known gone."""
        me = self.session.rank
        if exclude is None:
            e = self.session.engine
            stale = e.stale(g)  # restarted since g was made
            return g.members_among({*e.lost, *e.left, *stale})
        if isinstance(exclude, (str, bytes)) or not hasattr(exclude, "__iter__"):
            raise TypeError(f"shrink_group: ranks_to_exclude must be a list of global ranks, "
                            f"not {type(exclude).__name__}")
        out = list(exclude)
        for r in out:
            if not isinstance(r, int) or isinstance(r, bool):
                raise TypeError(f"shrink_group: ranks_to_exclude holds {r!r}, not a rank")
            if r not in g:
                raise ValueError(f"shrink_group: rank {r} is not a member of {g!r}")
        if len(set(out)) != len(out):
            raise ValueError(f"shrink_group: ranks_to_exclude {out} names a rank twice")
        if me in out:
            raise ValueError(f"shrink_group: rank {me} excludes itself; only the ranks "
                             "that stay call shrink_group")
        return sorted(out)

    async def _ask(self, kind: str, g: Group, exclude: list[int], flag: bool,
                   what: str) -> messages.Reply:
        s = self.session
        key = (kind, g.id)
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        if s.client is None:  # a world of one
            self._local_epoch += 1
            return messages.Reply(excluded=exclude, value=flag, epoch=self._local_epoch,
                                  gone=[])
        timeout = s.timeout_of(g)
        request = messages.Agree(
            kind=kind, group=g.id, seq=seq, runs=runs(g.ranks), exclude=exclude,
            flag=bool(flag),
            incarnations={str(r): i for r, i in zip(g.ranks, g.incarnations) if i})
        try:
            reply = await s.client.request(request, timeout=timeout)
        except DistTimeoutError:
            missing = [r for r in g.ranks if r not in exclude and self._alive(r)]
            raise DistTimeoutError(
                f"{what} on {g!r} timed out after {timeout:g} s on rank {s.rank}: not every "
                f"live member called it (members this rank takes for alive: {missing})",
                collective=what, group=g) from None
        return reply

    async def shrink(self, g: Group, exclude: list[int] | None) -> Group:
        """See :func:`minidist.shrink_group`."""
        ex = self._exclusions(g, exclude)
        if len(ex) >= g.size:
            raise ValueError(f"shrink_group: excluding {ex} leaves nobody in {g!r}")
        answer = await self._ask("shrink", g, ex, True, "shrink_group")
        out = {*(answer.excluded or ()), *(answer.gone or ())}
        ranks = tuple(itertools.filterfalse(out.__contains__, g.ranks))
        if self.session.rank not in ranks:
            raise DistError(f"shrink_group on {g!r}: rank {self.session.rank} is not in the "
                            f"shrunk group {list(ranks)}")
        epoch = int(answer.epoch or 0)
        incs = tuple(map(self.incarnations.__getitem__, ranks))
        new = Group(shrunk_group_id(ranks, epoch), ranks, g.name, timeout=g.timeout,
                    epoch=epoch, incarnations=incs if any(incs) else ())
        plan = self.session.plan
        if g is plan.default or g.id == plan.default.id:
            plan.default = new
        return new

    async def agree(self, flag: bool, g: Group) -> bool:
        """See :func:`minidist.agree`."""
        if not isinstance(flag, (bool, int)):
            raise TypeError(f"agree: flag must be a bool, not {type(flag).__name__}")
        answer = await self._ask("and", g, [], bool(flag), "agree")
        return bool(answer.value)

    async def wait_ranks(self, ranks: list[int], timeout: float | None) -> list[int]:
        """See :func:`minidist.wait_ranks`."""
        n = len(self.incarnations)
        ranks = list(ranks)
        for r in ranks:
            if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < n:
                raise ValueError(f"wait_ranks: {r!r} is not a rank of this job (0..{n - 1})")
        if timeout is None:
            timeout = self.session.timeout
        if timeout < 0:
            raise ValueError(f"wait_ranks: timeout must be >= 0, not {timeout}")
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            alive = [r for r in ranks if self._alive(r)]
            left = end - loop.time()
            if len(alive) == len(ranks) or left <= 0:
                return alive
            if self._news is None or self._news.done():
                self._news = loop.create_future()
            try:  # only rank_back() brings a rank back, and it sets the news
                await asyncio.wait_for(asyncio.shield(self._news), left)
            except TimeoutError:
                pass
