"""all_to_all schedules: block ``j`` of ``out`` on rank ``r`` = block ``r`` of ``in`` on rank ``j``.

``"in"`` and ``"out"`` both have ``count * size`` elements; ``in`` is only read.
"""

from __future__ import annotations

from ._common import build, step
from .schedule import Copy, Recv, Schedule, Send, Step

COLLECTIVE = "all_to_all"


def pairwise(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Pairwise exchange: size-1 steps; step ``k`` sends block ``r+k`` to rank ``r+k`` and
    receives block ``r-k`` from rank ``r-k`` (mod size). The rank's own block is a local
    copy, done in the first step. ``root`` is ignored.
    """
    n, c = size, count
    own = Copy("out", rank * c, "in", rank * c, c)
    steps: list[Step] = [step((), (own,))] if n == 1 else []
    for k in range(1, n):
        dst, src = (rank + k) % n, (rank - k) % n
        steps.append(step(
            (Send(dst, k, "in", dst * c, (dst + 1) * c),
             Recv(src, k, "out", src * c, (src + 1) * c)),
            (own,) if k == 1 else (),
        ))
    return build(COLLECTIVE, "pairwise", rank, n, c, 0, steps, in_size=n * c, out_size=n * c)
