"""Which ring of an inbox each rank of a node writes into: a rank's index among its
node's ranks. The ranks of a node are usually a run of consecutive ranks (every
one-node job), looked up by arithmetic, so that a rank holds no table with an entry
per peer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..group import Positions


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

    __slots__ = ("ranks", "_positions", "_gone")

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks = ranks
        self._positions = Positions(ranks)
        self._gone: set[int] = set()

    def get(self, rank: int, default: int | None = None) -> int | None:
        i = self._positions.of(rank)
        return default if i < 0 or rank in self._gone else i

    def __contains__(self, rank: int) -> bool:
        return self.get(rank) is not None

    def __getitem__(self, rank: int) -> int:
        i = self.get(rank)
        if i is None:
            raise KeyError(rank)
        return i

    def pop(self, rank: int, default: int | None = None) -> int | None:
        """Forget ``rank`` (it left the job); its ring, or ``default``."""
        i = self.get(rank)
        if i is None:
            return default
        self._gone.add(rank)
        return i
