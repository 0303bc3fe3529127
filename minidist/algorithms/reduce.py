"""reduce schedules: the root's ``out`` becomes the reduction of all ranks' ``out``.

In place on the root. Non-roots only read their ``out`` (their input) and never write
it; partial results live in tmp. The root writes ``out`` once, with its last
reduction, after data depending on every other rank has arrived.
"""

from __future__ import annotations

from ._common import build
from .allreduce import binomial_reduce_steps
from .schedule import Schedule

COLLECTIVE = "reduce"


def binomial(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree reduce to ``root``: ceil(log2 size) levels, whole vector per message.

    Each rank combines ``op(own subtree's value, child's value)`` for its children
    nearest first, then sends to its parent. tmp: up to two vectors on inner ranks.
    """
    v = (rank - root) % size
    real = [(u + root) % size for u in range(size)]
    steps, tmp = binomial_reduce_steps(v, size, count, real, 0)
    return build(COLLECTIVE, "binomial", rank, size, count, root, steps,
                 tmp_size=tmp, out_size=count)
