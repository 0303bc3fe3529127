"""Groups: an id and an ordered list of global ranks. Creating one opens no socket."""

from __future__ import annotations

import hashlib
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


def consecutive(ranks: Sequence[int]) -> bool:
    """Whether ``ranks`` is a run of consecutive ranks, ascending (checked at C speed)."""
    n = len(ranks)
    return n == 0 or (ranks[-1] - ranks[0] == n - 1
                      and all(map(operator.eq, ranks, range(ranks[0], ranks[0] + n))))


class Positions:
    """Each of the distinct ``ranks``' position among them: by arithmetic for a run of
    consecutive ranks (the world, a node's ranks: no table with an entry per rank),
    else from a table made when first asked."""

    __slots__ = ("ranks", "_first", "_table")

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks = ranks
        self._first = (ranks[0] if len(ranks) else 0) if consecutive(ranks) else None
        self._table: dict[int, int] | None = None

    def of(self, rank: int) -> int:
        """``rank``'s position, or -1 if it is not one of the ranks."""
        lo = self._first
        if lo is not None and isinstance(rank, (int, np.integer)):
            i = int(rank) - lo
            return i if 0 <= i < len(self.ranks) else -1
        if self._table is None:
            self._table = dict(zip(self.ranks, range(len(self.ranks))))
        return self._table.get(rank, -1)


@dataclass(frozen=True, eq=False)
class Group:
    """A set of ranks that run collectives together.

    ``ranks[i]`` is the global rank of group rank ``i``. ``timeout`` (seconds), when
    set, bounds every call on the group instead of the job's timeout. ``id`` is the same on every
    member and distinct from every other group of the job: it follows from the members
    and the order in which the members created groups with exactly those members.
    """

    id: int
    ranks: tuple[int, ...]
    name: str = ""
    #: seconds every call on this group may take (None: the job's timeout)
    timeout: float | None = field(default=None, compare=False)
    _positions: Positions = field(init=False, repr=False, compare=False)
    #: the epoch a shrink gave this group (0: not made by shrink_group)
    epoch: int = field(default=0, compare=False)
    #: how often each member had been restarted when the group was made (empty: never)
    incarnations: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_positions", Positions(self.ranks))

    @property
    def size(self) -> int:
        return len(self.ranks)

    def rank_of(self, global_rank: int) -> int:
        """The group rank of a global rank, or -1 if it is not a member."""
        return self._positions.of(global_rank)

    def members_among(self, ranks: object) -> list[int]:
        """Those of ``ranks`` (a set or dict of global ranks, usually a few: the dead)
        that are members, in group-rank order: a look-up per rank of ``ranks``, not a
        pass over the members."""
        found = [(i, r) for r in ranks if (i := self.rank_of(r)) >= 0]
        return [r for _, r in sorted(found)]

    def global_rank(self, group_rank: int) -> int:
        if not 0 <= group_rank < len(self.ranks):
            raise ValueError(f"group rank {group_rank} is outside 0..{len(self.ranks) - 1}")
        return self.ranks[group_rank]

    def __contains__(self, global_rank: int) -> bool:
        return self.rank_of(global_rank) >= 0

    def __repr__(self) -> str:
        shown = self.ranks if len(self.ranks) <= 8 else (*self.ranks[:4], "...", self.ranks[-1])
        return f"Group(id={self.id:#x}, size={len(self.ranks)}, ranks={shown})"


WORLD_ID = 0


def group_id(ranks: tuple[int, ...], ordinal: int,
             incarnations: tuple[int, ...] = ()) -> int:
    """The id of the ``ordinal``-th group created with exactly these ranks (never 0).
    ``incarnations``: how often each member was restarted (see :func:`minidist.wait_ranks`);
    all zeros (or empty) give the id a job without restarts has always given."""
    if any(incarnations):
        packed = struct.pack(f"<4sq{len(ranks)}q{len(ranks)}q", b"inc:", ordinal, *ranks,
                             *incarnations)
    else:
        packed = struct.pack(f"<q{len(ranks)}q", ordinal, *ranks)
    h = hashlib.blake2b(packed, digest_size=8)
    return int.from_bytes(h.digest(), "little") | 1


def shrunk_group_id(ranks: tuple[int, ...], epoch: int) -> int:
    """The id of the group that a shrink numbered ``epoch`` (handed out once by the
    rendezvous) made of ``ranks``: never the id of a group made any other way."""
    h = hashlib.blake2b(struct.pack(f"<6sq{len(ranks)}q", b"shrink", epoch, *ranks),
                        digest_size=8)
    return int.from_bytes(h.digest(), "little") | 1


class _NonMember:
    """What ``new_group`` returns on a rank that is not in the group."""

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


NON_GROUP_MEMBER = _NonMember()


class GroupMember:
    """torch.distributed-style markers: ``WORLD`` (None) and ``NON_GROUP_MEMBER``."""

    WORLD = None
    NON_GROUP_MEMBER = NON_GROUP_MEMBER
