"""Which ring of an inbox each rank of a node writes into: a rank's index among its
node's ranks. The ranks of a node are usually a run of consecutive ranks (every
one-node job), looked up by arithmetic, so that a rank holds no table with an entry
per peer."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np


def node_ranks(nodes: Sequence[int], rank: int) -> Sequence[int]:
    """The ranks whose node is ``rank``'s, in order: a ``range`` when they are
    consecutive, else a tuple."""
    mine = np.flatnonzero(np.asarray(nodes) == nodes[rank])
    lo, hi = int(mine[0]), int(mine[-1]) + 1
    return range(lo, hi) if hi - lo == len(mine) else tuple(mine.tolist())


class RingIndex:
    """rank -> its ring (its index in ``ranks``, the node's ranks in order), for the
    ranks not yet forgotten (:meth:`pop`). Reads as a dict does: ``in``, ``[]``,
    :meth:`get`, :meth:`pop`."""

    __slots__ = ("ranks", "_first", "_table", "_gone")

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks = ranks
        self._first = ranks.start if isinstance(ranks, range) and ranks.step == 1 else None
        self._table = None if self._first is not None else \
            {r: i for i, r in enumerate(ranks)}
        self._gone: set[int] = set()

    def get(self, rank: int, default: int | None = None) -> int | None:
        if self._table is not None:
            return self._table.get(rank, default)
        try:
            i = operator.index(rank) - self._first
        except TypeError:
            return default
        if not 0 <= i < len(self.ranks) or rank in self._gone:
            return default
        return i

    def __contains__(self, rank: int) -> bool:
        return self.get(rank) is not None

    def __getitem__(self, rank: int) -> int:
        i = self.get(rank)
        if i is None:
            raise KeyError(rank)
        return i

    def pop(self, rank: int, default: int | None = None) -> int | None:
        """Forget ``rank`` (it left the job); its ring, or ``default``."""
        if self._table is not None:
            return self._table.pop(rank, default)
        i = self.get(rank)
        if i is None:
            return default
        self._gone.add(rank)
        return i
