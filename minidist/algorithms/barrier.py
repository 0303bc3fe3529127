"""barrier schedules: no rank leaves before every rank has entered. No data moves."""

from __future__ import annotations

import dataclasses

from . import allreduce
from ._common import build, step
from .schedule import Recv, Schedule, Send, Step

COLLECTIVE = "barrier"


def dissemination(rank: int, size: int, count: int = 0, root: int = 0) -> Schedule:
    """Dissemination barrier: ceil(log2 size) rounds of zero-length messages.

    In round ``k`` rank ``r`` sends to ``r + 2**k`` and receives from ``r - 2**k``
    (mod size); after the last round every rank has heard, transitively, from every
    other. Messages are empty ranges of ``"tmp"`` (``tmp_size`` 0). ``count`` must be 0
    and ``root`` is ignored; size 1 gives an empty schedule.
    """
    if count != 0:
        raise ValueError(f"barrier moves no data: count must be 0, not {count}")
    steps: list[Step] = []
    k, d = 0, 1
    while d < size:
        steps.append(step((Send((rank + d) % size, k, "tmp", 0, 0),
                           Recv((rank - d) % size, k, "tmp", 0, 0))))
        k, d = k + 1, d * 2
    return build(COLLECTIVE, "dissemination", rank, size, 0, 0, steps)


def tree(rank: int, size: int, count: int = 0, root: int = 0) -> Schedule:
    """Binomial-tree barrier: empty messages up a binomial tree to rank 0 and back down.

    2(size-1) messages in all instead of the dissemination barrier's size*log2(size),
    over 2*ceil(log2 size) rounds: the better trade when many ranks share few cores,
    where every message costs CPU that the other ranks wait for. ``count`` must be 0.
    """
    if count != 0:
        raise ValueError(f"barrier moves no data: count must be 0, not {count}")
    return dataclasses.replace(allreduce.tree(rank, size, 0, 0), collective=COLLECTIVE,
                               algorithm="tree")
