"""reduce_scatter schedules: ``out`` on rank ``r`` = reduction over ranks of block ``r`` of ``in``.

``"in"`` has ``count * size`` elements and is only read; ``"out"`` has ``count``.
"""

from __future__ import annotations

from ._common import build, halving, ring_reduce_scatter, step
from .schedule import Buf, Copy, Recv, Reduce, Schedule, Send

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


def recursive_halving(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Recursive-halving reduce_scatter: log2 p steps, each exchanging half of what is
    left (bandwidth-optimal like the ring, in log2 rounds instead of n-1).

    With ``p`` the largest power of two <= ``size``, ranks ``p + i`` first send their
    whole input to rank ``i`` and get their reduced block back at the end. Core rank
    ``u`` ends with blocks ``u`` and (if ``u`` took in a rank) ``u + p``: the input is
    first copied (or, with the folded rank's, reduced) into tmp in that order, so that
    each core rank's blocks are contiguous. Step ``k`` sends the half of the current
    range the rank gives up to ``rank ^ (p >> (k + 1))`` and reduces the half it keeps,
    ``op(lower rank's, higher rank's)``; the last step writes ``out``. tmp: two inputs.
    ``root`` is ignored.
    """
    n, c = size, count
    if n == 1:
        steps = [step((), (Copy("out", 0, "in", 0, c),))]
        return build(COLLECTIVE, "recursive_halving", rank, n, c, 0, steps,
                     in_size=c, out_size=c)
    p = 1 << (n.bit_length() - 1)
    extra, rounds = n - p, p.bit_length() - 1
    back = rounds + 1
    if rank >= p:
        partner = rank - p
        steps = [step((Send(partner, 0, "in", 0, n * c),)),
                 step((Recv(partner, back, "out", 0, c),))]
        return build(COLLECTIVE, "recursive_halving", rank, n, c, 0, steps,
                     in_size=n * c, out_size=c)
    order: list[int] = []
    chunks: list[tuple[int, int]] = []
    for u in range(p):
        lo = len(order) * c
        order += [u, u + p] if u < extra else [u]
        chunks.append((lo, len(order) * c))
    recv = n * c
    if rank < extra:
        first = step((Recv(rank + p, 0, "tmp", recv, recv + n * c),),
                     [Reduce("tmp", i * c, "in", b * c, "tmp", recv + b * c, c)
                      for i, b in enumerate(order)])
    else:
        first = step((), [Copy("tmp", i * c, "in", b * c, c) for i, b in enumerate(order)])

    def last(a: Buf, a_off: int, b: Buf, b_off: int, lo: int, hi: int) -> list[Reduce]:
        ops = [Reduce("out", 0, a, a_off, b, b_off, c)]  # this rank's own block
        if rank < extra:  # the folded rank's block, kept for it
            ops.append(Reduce("tmp", lo + c, a, a_off + c, b, b_off + c, c))
        return ops

    steps = [first, *halving(rank, p, chunks, ("tmp", 0), 0, recv, list(range(p)), 1, last)]
    if rank < extra:
        lo = chunks[rank][0]
        steps.append(step((Send(rank + p, back, "tmp", lo + c, lo + 2 * c),)))
    return build(COLLECTIVE, "recursive_halving", rank, n, c, 0, steps,
                 tmp_size=2 * n * c, in_size=n * c, out_size=c)
