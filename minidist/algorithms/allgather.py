"""all_gather schedules: ``out[r*count:(r+1)*count]`` = ``in`` of rank ``r``, on every rank.

``"in"`` (``count`` elements) is only read; ``"out"`` has ``count * size`` elements.
"""

from __future__ import annotations

from ._common import build, step
from .schedule import Copy, Recv, Schedule, Send, Step

COLLECTIVE = "all_gather"


def ring(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Ring all_gather: size-1 steps, one block to the right and one from the left each.

    Step 0 sends ``in`` and copies it into its own block; step ``s`` forwards block
    ``r - s`` (received the step before). Bandwidth-optimal. ``root`` is ignored.
    """
    n, c = size, count
    own = Copy("out", rank * c, "in", 0, c)
    if n == 1:
        return build(COLLECTIVE, "ring", rank, n, c, 0, [step((), (own,))],
                     in_size=c, out_size=c)
    right, left = (rank + 1) % n, (rank - 1) % n
    steps: list[Step] = []
    for s in range(n - 1):
        if s == 0:
            send = Send(right, 0, "in", 0, c)
        else:
            b = (rank - s) % n
            send = Send(right, s, "out", b * c, (b + 1) * c)
        b = (rank - s - 1) % n
        recv = Recv(left, s, "out", b * c, (b + 1) * c)
        steps.append(step((send, recv), (own,) if s == 0 else ()))
    return build(COLLECTIVE, "ring", rank, n, c, 0, steps, in_size=c, out_size=n * c)


def recursive_doubling(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Latency-optimal all_gather in ceil(log2 size) steps. ``root`` is ignored.

    Power-of-two sizes: recursive doubling straight in ``out`` (round ``k`` swaps the
    aligned ``2**k`` blocks held with partner ``rank ^ 2**k``). Other sizes: Bruck's
    algorithm: round ``k`` sends the first ``min(2**k, size - 2**k)`` blocks of a
    rotated copy in tmp (``size * count`` elements) to ``rank - 2**k`` and appends
    those of ``rank + 2**k``; a final two-piece copy un-rotates tmp into ``out``.
    """
    n, c = size, count
    if n & (n - 1):
        return _bruck(rank, n, c)
    own = Copy("out", rank * c, "in", 0, c)
    steps: list[Step] = [step((), (own,))] if n == 1 else []
    k, d = 0, 1
    while d < n:
        partner = rank ^ d
        mine, theirs = rank & ~(d - 1), partner & ~(d - 1)
        send = (Send(partner, k, "in", 0, c) if k == 0
                else Send(partner, k, "out", mine * c, (mine + d) * c))
        recv = Recv(partner, k, "out", theirs * c, (theirs + d) * c)
        steps.append(step((send, recv), (own,) if k == 0 else ()))
        k, d = k + 1, d * 2
    return build(COLLECTIVE, "recursive_doubling", rank, n, c, 0, steps,
                 in_size=c, out_size=n * c)


def bruck(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Bruck's all_gather for every size: ceil(log2 size) rounds; round ``k`` sends the
    first ``min(2**k, size - 2**k)`` blocks of a rotated copy in tmp (block ``i`` there
    is rank ``rank + i``'s) to rank ``rank - 2**k`` and appends those of rank
    ``rank + 2**k``; a final two-piece copy un-rotates tmp into ``out``. tmp: the whole
    output. ``root`` is ignored."""
    if size == 1:
        return build(COLLECTIVE, "bruck", rank, 1, count,
                     0, [step((), (Copy("out", 0, "in", 0, count),))],
                     in_size=count, out_size=count)
    return _bruck(rank, size, count, "bruck")


def _bruck(rank: int, n: int, c: int, name: str = "recursive_doubling") -> Schedule:
    """Bruck all_gather for any size; tmp position i holds the block of rank (rank+i)%n."""
    steps: list[Step] = []
    k, d = 0, 1
    while d < n:
        m = min(d, n - d)
        send = (Send((rank - d) % n, k, "in", 0, c) if k == 0
                else Send((rank - d) % n, k, "tmp", 0, m * c))
        recv = Recv((rank + d) % n, k, "tmp", d * c, (d + m) * c)
        compute = [Copy("tmp", 0, "in", 0, c)] if k == 0 else []
        if d * 2 >= n:  # last round: un-rotate into out
            head = (n - rank) * c
            compute.append(Copy("out", rank * c, "tmp", 0, head))
            compute.append(Copy("out", 0, "tmp", head, rank * c))
        steps.append(step((send, recv), compute))
        k, d = k + 1, d * 2
    return build(COLLECTIVE, name, rank, n, c, 0, steps,
                 tmp_size=n * c, in_size=c, out_size=n * c)
