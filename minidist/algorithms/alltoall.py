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


def bruck(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Bruck's all_to_all: ceil(log2 size) rounds instead of size-1, each moving about
    half of the blocks (for small blocks, where the number of messages dominates).

    The input is first copied into tmp rotated by ``rank`` blocks, so that position
    ``i`` holds the block for rank ``rank + i``, which must travel ``i`` ranks forward.
    Round ``k`` packs the blocks at the positions with bit ``k`` set, sends them to rank
    ``rank + 2**k`` and unpacks what rank ``rank - 2**k`` sent into the same positions.
    Afterwards position ``i`` holds the block from rank ``rank - i``; the last step
    copies each into its place in ``out``. Neighbouring positions are packed and
    unpacked in one copy (round ``k``'s positions come in runs of ``2**k``), so the
    rounds take about 2 n copies in all, not n log2 n. Each round moves about half of
    the blocks: ceil(log2 n)/2 · N bytes per rank instead of the pairwise exchange's N,
    in log2 n messages instead of n-1. tmp: the rotated blocks plus two packing areas.
    ``root`` is ignored.
    """
    n, c = size, count
    if n == 1:
        return build(COLLECTIVE, "bruck", rank, n, c, 0,
                     [step((), (Copy("out", 0, "in", 0, c),))], in_size=c, out_size=c)
    rounds = []
    d = 1
    while d < n:
        rounds.append([i for i in range(n) if i & d])
        d <<= 1
    most = max(len(r) for r in rounds)
    pack, unpack = n * c, n * c + most * c
    rot = (n - rank) * c
    compute: list[Copy] = [Copy("tmp", 0, "in", rank * c, rot), Copy("tmp", rot, "in", 0, rank * c)]
    steps: list[Step] = []
    for k, positions in enumerate(rounds):
        d = 1 << k
        spans = _runs(positions)  # blocks next to each other move in one copy
        compute += [Copy("tmp", pack + j * c, "tmp", i * c, m * c) for j, i, m in spans]
        steps.append(step((), compute))
        m = len(positions) * c
        steps.append(step((Send((rank + d) % n, k, "tmp", pack, pack + m),
                           Recv((rank - d) % n, k, "tmp", unpack, unpack + m))))
        compute = [Copy("tmp", i * c, "tmp", unpack + j * c, m * c) for j, i, m in spans]
    compute += [Copy("out", j * c, "tmp", ((rank - j) % n) * c, c) for j in range(n)]
    steps.append(step((), compute))
    return build(COLLECTIVE, "bruck", rank, n, c, 0, steps,
                 tmp_size=n * c + 2 * most * c, in_size=n * c, out_size=n * c)


def _runs(positions: list[int]) -> list[tuple[int, int, int]]:
    """(index in ``positions``, first position, length) of each run of consecutive
    positions (``positions`` ascending): the blocks that one copy packs or unpacks."""
    out: list[tuple[int, int, int]] = []
    for j, i in enumerate(positions):
        if out and out[-1][1] + out[-1][2] == i:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((j, i, 1))
    return out
