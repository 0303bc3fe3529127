"""Topology-aware all_reduce: inside each node, then among one leader per node.

``hierarchical(rank, size, count, nodes)`` composes three plain schedules, remapped to
the group's ranks: a binomial reduce to each node's leader (its lowest rank), an
all_reduce among the leaders (ring for large vectors, recursive doubling for small
ones), and a binomial broadcast from each leader. Traffic between nodes then depends
on the number of nodes, not on the processes per node.

Everything runs in ``tmp`` (the caller's vector is copied in first and the result
copied out last), so the caller's array is written only once every rank has been
heard from, as the schedule contract asks.
"""

from __future__ import annotations

import functools

from . import allreduce, broadcast, reduce
from ._common import build, step
from .schedule import Buf, Copy, Recv, Reduce, Schedule, Send, Step

COLLECTIVE = "all_reduce"
PHASE_TAGS = 1 << 20  # tag offset between phases: tags stay unique per (src, dst)
LEADERS_RING_MIN_BYTES = 64 * 1024


def _remap(s: Schedule, ranks: list[int], tag_base: int, base: int) -> list[Step]:
    """``s``'s steps with sub-group ranks mapped to group ranks, tags shifted, and its
    ``out`` / ``tmp`` moved to ``tmp[0:]`` / ``tmp[base:]``."""
    def where(buf: Buf, lo: int) -> tuple[Buf, int]:
        return ("tmp", lo) if buf == "out" else ("tmp", base + lo)

    out = []
    for st in s.steps:
        comms = []
        for c in st.comms:
            b, lo = where(c.buf, c.lo)
            kind = Send if isinstance(c, Send) else Recv
            comms.append(kind(ranks[c.peer], c.tag + tag_base, b, lo, lo + c.hi - c.lo))
        compute = []
        for c in st.compute:
            if isinstance(c, Reduce):
                d, dlo = where(c.dst, c.dst_lo)
                a, alo = where(c.a, c.a_lo)
                b2, blo = where(c.b, c.b_lo)
                compute.append(Reduce(d, dlo, a, alo, b2, blo, c.n))
            else:
                d, dlo = where(c.dst, c.dst_lo)
                src, slo = where(c.src, c.src_lo)
                compute.append(Copy(d, dlo, src, slo, c.n))
        out.append(step(comms, compute))
    return out


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
    me_local = local.index(rank)
    base = count
    phases: list[Step] = [step(compute=[Copy("tmp", 0, "out", 0, count)])]
    tmp_extra = 0
    if len(local) > 1:
        s = reduce.binomial(me_local, len(local), count, 0)
        phases += _remap(s, local, 0, base)
        tmp_extra = max(tmp_extra, s.tmp_size)
    if rank in leaders and len(leaders) > 1:
        inner = (allreduce.ring if count * itemsize >= LEADERS_RING_MIN_BYTES
                 and count >= len(leaders) else allreduce.recursive_doubling)
        s = inner(leaders.index(rank), len(leaders), count, 0)
        phases += _remap(s, leaders, PHASE_TAGS, base)
        tmp_extra = max(tmp_extra, s.tmp_size)
    if len(local) > 1:
        s = broadcast.binomial(me_local, len(local), count, 0)
        phases += _remap(s, local, 2 * PHASE_TAGS, base)
        tmp_extra = max(tmp_extra, s.tmp_size)
    phases.append(step(compute=[Copy("out", 0, "tmp", 0, count)]))
    return build(COLLECTIVE, "hierarchical", rank, size, count, 0, phases,
                 tmp_size=count + tmp_extra, out_size=count)
