"""Fault-tolerant agreements, run by the rendezvous: shrink and agree.

The rendezvous already knows which ranks are alive, so it can decide for a group what
ULFM's ``MPIX_Comm_shrink`` and ``MPIX_Comm_agree`` decide with a consensus among the
ranks. Each surviving member asks once (``{"t": "agree", "kind": ..., "group": ...,
"seq": ..., "ranks": [...], "exclude": [...], "flag": ...}``); once every member that is
neither excluded nor known gone has asked, or died meanwhile, every caller gets the same
answer: the members that are left (in group order), a new epoch, and the AND of the
callers' flags. A member that dies while the others wait is dropped from the answer, as
ULFM's shrink drops it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FINISHED_KEPT = 4096  # decided agreements remembered for a caller that comes late
KINDS = ("shrink", "and")


@dataclass
class _Pending:
    members: tuple[int, ...]
    incarnations: dict[int, int]  # of each member when the agreement began
    exclude: set[int] = field(default_factory=set)
    # rank -> (its client, its request id, its flag)
    asked: dict[int, tuple[Any, Any, bool]] = field(default_factory=dict)


class Agreements:
    """The rendezvous' pending and decided agreements. ``incarnation(rank)`` says which
    incarnation of ``rank`` is alive now (None: none is)."""

    def __init__(self, incarnation: Callable[[int], int | None]) -> None:
        self._incarnation = incarnation
        self._pending: dict[tuple, _Pending] = {}
        self._done: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
        self._epochs = itertools.count(1)

    def ask(self, client: Any, rank: int, b: dict[str, Any]) -> None:
        """A member asks (``client.send`` takes the reply)."""
        rid = b.get("id")
        kind, ranks, exclude = b.get("kind"), b.get("ranks"), b.get("exclude", [])
        if kind not in KINDS or not isinstance(ranks, list) or not isinstance(exclude, list) \
                or not all(isinstance(r, int) for r in [*ranks, *exclude]):
            client.send({"t": "reply", "id": rid, "error": f"bad agreement request {b!r}"})
            return
        key = (kind, b.get("group"), b.get("seq"))
        members = tuple(ranks)
        done = self._done.get(key)
        if done is not None:  # decided without this caller: it was taken for gone
            if rank in done.get("ranks", ()) or kind == "and":
                client.send({"t": "reply", "id": rid, **done})
            else:
                client.send({"t": "reply", "id": rid, "error": (
                    f"rank {rank} came to {kind} call #{key[2]} of group {key[1]:#x} after "
                    f"the others had decided without it")})
            return
        p = self._pending.get(key)
        if p is None:
            # the incarnations the group was made with: a member restarted since then is
            # as gone for this group as a dead one
            incs = b.get("incarnations") or [0] * len(members)
            if not isinstance(incs, list) or len(incs) != len(members):
                incs = [self._incarnation(r) for r in members]
            p = self._pending[key] = _Pending(members, dict(zip(members, incs)))
        elif p.members != members:
            client.send({"t": "reply", "id": rid, "error": (
                f"{kind}: rank {rank} called it on members {list(members)}, another member "
                f"on {list(p.members)}")})
            return
        p.exclude.update(exclude)
        if rank in p.exclude or rank not in members:
            client.send({"t": "reply", "id": rid, "error": (
                f"{kind}: rank {rank} is excluded from (or not a member of) the group it "
                "called it on; only the members that stay call it")})
            return
        p.asked[rank] = (client, rid, bool(b.get("flag", True)))
        self._check(key, p)

    def gone(self, rank: int) -> None:
        """``rank`` died or left: agreements that waited for it may be decided now."""
        for key, p in list(self._pending.items()):
            if rank in p.members:
                self._check(key, p)

    def _alive(self, p: _Pending, rank: int) -> bool:
        inc = self._incarnation(rank)
        return inc is not None and inc == p.incarnations.get(rank)

    def _check(self, key: tuple, p: _Pending) -> None:
        waiting = [r for r in p.members
                   if r not in p.exclude and r not in p.asked and self._alive(p, r)]
        if waiting:
            return
        del self._pending[key]
        left = [r for r in p.members if r in p.asked and self._alive(p, r)]
        answer: dict[str, Any] = {
            "ranks": left, "value": all(p.asked[r][2] for r in left),
            "gone": [r for r in p.members if r not in left and r not in p.exclude],
            "epoch": next(self._epochs) if key[0] == "shrink" else 0}
        self._done[key] = answer
        while len(self._done) > FINISHED_KEPT:
            self._done.popitem(last=False)
        for r in left:
            client, rid, _ = p.asked[r]
            client.send({"t": "reply", "id": rid, **answer})
