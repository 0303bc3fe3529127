"""reduce_scatter schedules: ``out`` on rank ``r`` = reduction over ranks of block ``r`` of ``in``.

``"in"`` has ``count * size`` elements and is only read; ``"out"`` has ``count``.
"""

from __future__ import annotations

from ._common import build, ring_reduce_scatter, step
from .schedule import Copy, Schedule

COLLECTIVE = "reduce_scatter"


def ring(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Ring reduce_scatter: size-1 steps of one block each way (bandwidth-optimal).

    Partial sums live in two alternating tmp blocks; ``out`` is written once, by the
    last step's ``op(own block, received)``, after data depending on every other rank
    has arrived. ``root`` is ignored.
    """
    n, c = size, count
    if n == 1:
        steps = [step((), (Copy("out", 0, "in", 0, c),))]
        return build(COLLECTIVE, "ring", rank, n, c, 0, steps, in_size=c, out_size=c)
    bounds = [(i * c, (i + 1) * c) for i in range(n)]
    steps, tmp = ring_reduce_scatter(rank, n, bounds, "in", ("out", 0))
    return build(COLLECTIVE, "ring", rank, n, c, 0, steps,
                 tmp_size=tmp, in_size=n * c, out_size=c)
