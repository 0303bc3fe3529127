"""all_reduce schedules: every rank's ``out`` becomes the reduction of all ranks' ``out``.

In place: the schedules use ``"out"`` (the caller's array, holding its input at the
start) and ``"tmp"``; never ``"in"``. ``"out"`` is written only after the rank has
received data that depends on every rank's input, and the result is bit-identical on
every rank (each value is either reduced once and forwarded, or reduced on every rank
from the same two operands in the same order).
"""

from __future__ import annotations

from ._common import build, chunk_bounds, ring_reduce_scatter, step, tree_children, tree_parent
from .schedule import Buf, Recv, Reduce, Schedule, Send, Step

COLLECTIVE = "all_reduce"


def ring(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Ring all_reduce: ring reduce-scatter, then ring all-gather (bandwidth-optimal).

    ``out`` is split into ``size`` chunks as evenly as possible (some empty when
    ``count < size``). 2(size-1) steps, each sending and receiving about
    ``count / size`` elements; tmp holds two chunks. Chunk ``r`` is reduced only on rank
    ``r`` and forwarded verbatim, so results are bit-identical. ``root`` is ignored.
    """
    n = size
    bounds = chunk_bounds(count, n)
    steps, tmp = ring_reduce_scatter(rank, n, bounds, "out", ("out", bounds[rank][0]))
    right, left = (rank + 1) % n, (rank - 1) % n
    # All-gather: step s sends chunk (r - s) and receives chunk (r - s - 1) into "out".
    for s in range(n - 1):
        slo, shi = bounds[(rank - s) % n]
        rlo, rhi = bounds[(rank - s - 1) % n]
        tag = n - 1 + s
        steps.append(step((Send(right, tag, "out", slo, shi), Recv(left, tag, "out", rlo, rhi))))
    return build(COLLECTIVE, "ring", rank, n, count, 0, steps, tmp_size=tmp, out_size=count)


def _ordered(me: int, partner: int, mine: tuple[Buf, int], theirs: tuple[Buf, int]
             ) -> tuple[Buf, int, Buf, int]:
    """Operands of a pairwise reduction, the lower rank's first (same on both ranks)."""
    if me < partner:
        return mine[0], mine[1], theirs[0], theirs[1]
    return theirs[0], theirs[1], mine[0], mine[1]


def recursive_doubling(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Recursive-doubling all_reduce (latency-optimal: log2 steps of the whole vector).

    With ``p`` the largest power of two <= ``size``, ranks ``p + i`` first send their
    vector to rank ``i`` (which folds it in), the ``p`` core ranks then exchange and
    reduce with partner ``rank ^ 2**k`` for each ``k``, and rank ``i`` finally sends
    the result to rank ``p + i`` (which receives it straight into ``out``). Both
    partners of an exchange reduce ``op(lower rank's value, higher rank's value)``, so
    all ranks end bit-identical. tmp: one vector for receiving, one more for the running
    value when a rank reduces more than once. ``root`` is ignored.
    """
    n = size
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    rounds = p.bit_length() - 1
    steps: list[Step] = []
    if rank >= p:  # folded in at the start, handed the result at the end
        partner = rank - p
        steps.append(step((Send(partner, 0, "out", 0, count),)))
        steps.append(step((Recv(partner, rounds + 1, "out", 0, count),)))
        return build(COLLECTIVE, "recursive_doubling", rank, n, count, 0, steps, out_size=count)

    folds = rank < extra
    reductions = rounds + (1 if folds else 0)
    acc_in_tmp = reductions >= 2  # the running value needs its own tmp region
    recv_off = count if acc_in_tmp else 0
    tmp_size = (2 if acc_in_tmp else 1) * count if reductions else 0
    acc: tuple[Buf, int] = ("out", 0)
    done = 0

    def target() -> tuple[Buf, int]:
        # The last reduction writes "out": by then every rank's input has arrived.
        return ("out", 0) if done == reductions - 1 else ("tmp", 0)

    if folds:
        dst = target()
        steps.append(step(
            (Recv(rank + p, 0, "tmp", recv_off, recv_off + count),),
            (Reduce(dst[0], dst[1], acc[0], acc[1], "tmp", recv_off, count),),
        ))
        acc, done = dst, done + 1
    for k in range(rounds):
        partner = rank ^ (1 << k)
        dst = target()
        a, alo, b, blo = _ordered(rank, partner, acc, ("tmp", recv_off))
        steps.append(step(
            (Send(partner, k + 1, acc[0], acc[1], acc[1] + count),
             Recv(partner, k + 1, "tmp", recv_off, recv_off + count)),
            (Reduce(dst[0], dst[1], a, alo, b, blo, count),),
        ))
        acc, done = dst, done + 1
    if folds:
        steps.append(step((Send(rank + p, rounds + 1, "out", 0, count),)))
    return build(COLLECTIVE, "recursive_doubling", rank, n, count, 0, steps,
                 tmp_size=tmp_size, out_size=count)


def binomial_reduce_steps(
    v: int, n: int, count: int, real: list[int], tag: int
) -> tuple[list[Step], int]:
    """Binomial-tree reduction to virtual rank 0; ``real[u]`` maps virtual to group ranks.

    Virtual rank ``v`` receives from its children nearest first, each in its own step,
    combining ``op(running value, child's value)`` (the child's subtree covers higher
    virtual ranks), then sends the running value to its parent. The running value starts
    as ``"out"`` (only read), moves to tmp, and only virtual rank 0 writes ``"out"``:
    its last reduction, after the last child's data arrived. Returns steps and tmp size.
    """
    kids = tree_children(v, n)
    steps: list[Step] = []
    acc: tuple[Buf, int] = ("out", 0)
    acc_in_tmp = bool(kids) and (v != 0 or len(kids) >= 2)
    recv_off = count if acc_in_tmp else 0
    for i, child in enumerate(kids):
        dst: tuple[Buf, int] = ("out", 0) if v == 0 and i == len(kids) - 1 else ("tmp", 0)
        steps.append(step(
            (Recv(real[child], tag, "tmp", recv_off, recv_off + count),),
            (Reduce(dst[0], dst[1], acc[0], acc[1], "tmp", recv_off, count),),
        ))
        acc = dst
    if v != 0:
        steps.append(step((Send(real[tree_parent(v)], tag, acc[0], acc[1], acc[1] + count),)))
    tmp_size = 0 if not kids else (2 if acc_in_tmp else 1) * count
    return steps, tmp_size


def binomial_broadcast_steps(
    v: int, n: int, bounds: tuple[int, int], real: list[int], tag: int
) -> list[Step]:
    """Binomial-tree broadcast of ``out[lo:hi]`` from virtual rank 0.

    A non-root receives straight into ``out`` from its parent, then sends to its
    children farthest (largest subtree) first, one send per step.
    """
    lo, hi = bounds
    steps: list[Step] = []
    if v != 0:
        steps.append(step((Recv(real[tree_parent(v)], tag, "out", lo, hi),)))
    for child in reversed(tree_children(v, n)):
        steps.append(step((Send(real[child], tag, "out", lo, hi),)))
    return steps


def tree(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial reduce to group rank 0, then binomial broadcast (2 log2(size) steps).

    The result is computed once, on rank 0, and forwarded: bit-identical everywhere.
    Non-zero ranks receive the result straight into ``out``. ``root`` is ignored.
    """
    real = list(range(size))
    steps, tmp = binomial_reduce_steps(rank, size, count, real, 0)
    steps += binomial_broadcast_steps(rank, size, (0, count), real, 1)
    return build(COLLECTIVE, "tree", rank, size, count, 0, steps, tmp_size=tmp, out_size=count)
