"""Fault-tolerant agreements, run by the rendezvous: shrink and agree.

The rendezvous already knows which ranks are alive, so it can decide for a group what
ULFM's ``MPIX_Comm_shrink`` and ``MPIX_Comm_agree`` decide with a consensus among the
ranks. Each surviving member asks once (a :class:`minidist.messages.Agree`: kind,
group, seq, the members as [first, last + 1) runs, the ranks to exclude, a flag); once
every member that is neither excluded nor known gone has asked, or died meanwhile, every
caller gets the same answer: which members are left out (the excluded ones, and those
found gone), a new epoch, and the AND of the callers' flags. A member that dies while
the others wait is left out of the answer, as ULFM's shrink leaves it out.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .. import messages
from ..group import consecutive


def runs(ranks: list[int] | tuple[int, ...]) -> list[list[int]]:
    """``ranks`` as [first, last + 1) runs of consecutive ranks (what a request carries:
    a group of 1024 consecutive ranks is one pair, not 1024 numbers)."""
    if ranks and consecutive(ranks):
        return [[ranks[0], ranks[0] + len(ranks)]]  # (one run: no loop in Python)
    out: list[list[int]] = []
    for r in ranks:
        if out and out[-1][1] == r:
            out[-1][1] = r + 1
        else:
            out.append([r, r + 1])
    return out


def expand(spans: list) -> tuple[int, ...]:
    """The ranks of :func:`runs`' answer, in order; ValueError for anything else."""
    out: list[int] = []
    for span in spans:
        a, b = span
        if not isinstance(a, int) or not isinstance(b, int) or b <= a:
            raise ValueError(f"bad run {span!r}")
        out.extend(range(a, b))
    return tuple(out)


FINISHED_KEPT = 4096  # decided agreements remembered for a caller that comes late
KINDS = ("shrink", "and")


@dataclass
class _Pending:
    members: tuple[int, ...]
    incarnations: dict[int, int]  # of each member when the agreement began
    exclude: set[int] = field(default_factory=set)
    waiting: set[int] = field(default_factory=set)  # members still to ask (alive, kept)
    spans: list = field(default_factory=list)  # the members as the callers sent them
    # rank -> (its client, its request id, its flag)
    asked: dict[int, tuple[Any, Any, bool]] = field(default_factory=dict)


class Agreements:
    """The rendezvous' pending and decided agreements. ``incarnation(rank)`` says which
    incarnation of ``rank`` is alive now (None: none is)."""

    def __init__(self, incarnation: Callable[[int], int | None]) -> None:
        self._incarnation = incarnation
        self._pending: dict[tuple, _Pending] = {}
        self._done: OrderedDict[tuple, messages.Reply] = OrderedDict()
        self._epochs = itertools.count(1)

    def ask(self, client: Any, rank: int, b: messages.Agree | Mapping[str, Any]) -> None:
        """A member asks (an Agree, or its JSON object); ``client.send`` takes the
        :class:`~minidist.messages.Reply`."""
        if not isinstance(b, messages.Agree):
            b = messages.Agree.from_body(b)
        rid = b.id

        def refuse(why: str) -> None:
            client.send(messages.Reply(id=rid, error=why))

        kind, spans = b.kind, b.runs
        exclude = [] if b.exclude is None else b.exclude
        if kind not in KINDS or not isinstance(spans, list) or not isinstance(exclude, list) \
                or not all(isinstance(r, int) for r in exclude):
            return refuse(f"bad agreement request {b.body!r}")
        key = (kind, b.group, b.seq)
        done = self._done.get(key)
        if done is not None:  # decided without this caller: it was taken for gone
            if rank not in done.gone and rank not in done.excluded:
                client.send(replace(done, id=rid))
            else:
                refuse(
                    f"rank {rank} came to {kind} call #{key[2]} of group {key[1]:#x} after "
                    f"the others had decided without it")
            return
        p = self._pending.get(key)
        if p is None:
            try:
                members = expand(spans)
            except (TypeError, ValueError):
                return refuse(f"bad agreement request {b.body!r}")
            # the incarnations the group was made with (those not 0): a member restarted
            # since then is as gone for this group as a dead one
            incs = b.incarnations or {}
            p = self._pending[key] = _Pending(
                members, {r: int(incs.get(str(r), 0)) for r in members}, spans=spans)
            p.waiting = {r for r in members if self._alive(p, r)}
        elif p.spans != spans:
            return refuse(f"{kind}: rank {rank} called it on members {expand(spans)}, "
                          f"another member on {list(p.members)}")
        if rank in p.exclude or rank in exclude or rank not in p.incarnations:
            return refuse(f"{kind}: rank {rank} is excluded from (or not a member of) the "
                          "group it called it on; only the members that stay call it")
        p.exclude.update(exclude)
        p.waiting.difference_update(exclude)
        p.asked[rank] = (client, rid, bool(b.flag))
        p.waiting.discard(rank)
        if not p.waiting:
            self._decide(key, p)

    def gone(self, rank: int) -> None:
        """``rank`` died or left: agreements that waited for it may be decided now."""
        for key, p in list(self._pending.items()):
            if rank in p.waiting:
                p.waiting.discard(rank)
                if not p.waiting:
                    self._decide(key, p)

    def _alive(self, p: _Pending, rank: int) -> bool:
        inc = self._incarnation(rank)
        return inc is not None and inc == p.incarnations.get(rank)

    def _decide(self, key: tuple, p: _Pending) -> None:
        """Every member that stays has asked, or is gone: answer them all alike."""
        del self._pending[key]
        left = [r for r in p.members if r in p.asked and self._alive(p, r)]
        # the answer names what is left out (usually a few ranks), not what stays
        stay = set(left)
        answer = messages.Reply(
            value=all(p.asked[r][2] for r in left),
            excluded=sorted(p.exclude),
            gone=[r for r in p.members if r not in stay and r not in p.exclude],
            epoch=next(self._epochs) if key[0] == "shrink" else 0)
        self._done[key] = answer
        while len(self._done) > FINISHED_KEPT:
            self._done.popitem(last=False)
        for r in left:
            client, rid, _ = p.asked[r]
            client.send(replace(answer, id=rid))
