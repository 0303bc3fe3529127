"""Topology-aware all_reduce: inside each node, then among one leader per node.

``hierarchical(rank, size, count, nodes)`` composes three plain schedules
(:func:`minidist.algorithms.compose`), remapped to the group's ranks: a binomial
reduce to each node's leader (its lowest rank), an all_reduce among the leaders (ring
for large vectors, recursive doubling for small ones), and a binomial broadcast from
each leader. Traffic between nodes then depends
on the number of nodes, not on the processes per node.

Everything runs in ``tmp`` (the caller's vector is copied in first and the result
copied out last), so the caller's array is written only once every rank has been
heard from, as the schedule contract asks.
"""

from __future__ import annotations

import functools

from ._common import step
from .compose import PHASE_TAGS, compose, part
from .schedule import Copy, Schedule

__all__ = ["LEADERS_RING_MIN_BYTES", "PHASE_TAGS", "hierarchical"]

COLLECTIVE = "all_reduce"
LEADERS_RING_MIN_BYTES = 64 * 1024


@functools.lru_cache(maxsize=1024)
def hierarchical(rank: int, size: int, count: int, nodes: tuple[int, ...],
                 itemsize: int = 4) -> Schedule:
    """The schedule of group rank ``rank``; ``nodes[r]`` is the node of group rank ``r``.

    ``itemsize`` only picks the leaders' algorithm (by bytes). Raises ValueError if
    ``nodes`` does not give one node per rank.
    """
    if len(nodes) != size or not 0 <= rank < size:
        raise ValueError(f"nodes must give the node of each of the {size} ranks")
    local = [r for r in range(size) if nodes[r] == nodes[rank]]
    leaders = sorted({min(r for r in range(size) if nodes[r] == n) for n in set(nodes)})
    inner = ("ring" if count * itemsize >= LEADERS_RING_MIN_BYTES and count >= len(leaders)
             else "recursive_doubling")
    # every phase works in tmp: the caller's vector is copied in first and out last
    bufs = {"out": ("tmp", 0), "tmp": ("tmp", count)}
    inside = len(local) > 1
    return compose(COLLECTIVE, "hierarchical", rank, size, count, 0, [
        step(compute=[Copy("tmp", 0, "out", 0, count)]),
        part("reduce", "binomial", local, rank, count, local[0], buffers=bufs)
        if inside else None,
        part(COLLECTIVE, inner, leaders, rank, count, buffers=bufs)
        if len(leaders) > 1 else None,
        part("broadcast", "binomial", local, rank, count, local[0], buffers=bufs)
        if inside else None,
        step(compute=[Copy("out", 0, "tmp", 0, count)]),
    ])


def flat(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """The schedule with no node layout given: every rank counts as one node."""
    return hierarchical(rank, size, count, (0,) * size)
