"""reduce schedules: the root's ``out`` becomes the reduction of all ranks' ``out``.

In place on the root. Non-roots only read their ``out`` (their input) and never write
it; partial results live in tmp. The root writes ``out`` once, with its last
reduction, after data depending on every other rank has arrived.
"""

from __future__ import annotations

from ._common import build, chunk_bounds, halving, step
from .allreduce import binomial_reduce_steps
from .schedule import Buf, Recv, Reduce, Schedule, Send, Step

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


def rabenseifner(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Rabenseifner's reduce: a recursive-halving reduce-scatter, then a binomial gather
    of the reduced chunks to the root (bandwidth-optimal for large vectors).

    Ranks are numbered from the root (virtual rank ``v = (rank - root) % size``); with
    ``p`` the largest power of two <= ``size``, virtual ranks ``p + i`` fold their vector
    into virtual rank ``i`` first. After the halving, virtual rank ``v`` holds chunk
    ``v`` (of ``p``) reduced; in the gather, step ``k`` sends the ``2**k`` chunks a rank
    has collected to virtual rank ``v - 2**k``. Non-roots work in tmp and never write
    ``out``; the root writes its own chunk with its last reduction and receives the
    others straight into ``out``. tmp: two vectors.
    """
    n = size
    v = (rank - root) % n
    real = [(u + root) % n for u in range(n)]
    p = 1 << (n.bit_length() - 1)
    extra, rounds = n - p, p.bit_length() - 1
    if v >= p:
        steps = [step((Send(real[v - p], 0, "out", 0, count),))]
        return build(COLLECTIVE, "rabenseifner", rank, n, count, root, steps, out_size=count)
    chunks = chunk_bounds(count, p)
    steps: list[Step] = []
    src: tuple[Buf, int] = ("out", 0)
    if v < extra:
        steps.append(step((Recv(real[v + p], 0, "tmp", count, 2 * count),),
                          (Reduce("tmp", 0, "out", 0, "tmp", count, count),)))
        src = ("tmp", 0)

    def into_out(a: Buf, a_off: int, b: Buf, b_off: int, lo: int, hi: int) -> list[Reduce]:
        return [Reduce("out", lo, a, a_off, b, b_off, hi - lo)]

    steps += halving(v, p, chunks, src, 0, count, real, 1, into_out if v == 0 else None)
    held: Buf = "out" if v == 0 else "tmp"
    d, k = 1, 0
    while d < p:
        if v & d:  # hand everything collected to v - d, and stop
            lo, hi = chunks[v][0], chunks[v + d - 1][1]
            steps.append(step((Send(real[v - d], 1 + rounds + k, held, lo, hi),)))
            break
        lo, hi = chunks[v + d][0], chunks[v + 2 * d - 1][1]
        steps.append(step((Recv(real[v + d], 1 + rounds + k, held, lo, hi),)))
        d, k = d << 1, k + 1
    return build(COLLECTIVE, "rabenseifner", rank, n, count, root, steps,
                 tmp_size=2 * count if p > 1 else 0, out_size=count)
