"""all_reduce schedules: every rank's ``out`` becomes the reduction of all ranks' ``out``.

In place: the schedules use ``"out"`` (the caller's array, holding its input at the
start) and ``"tmp"``; never ``"in"``. ``"out"`` is written only after the rank has
received data that depends on every rank's input, and the result is bit-identical on
every rank (each value is either reduced once and forwarded, or reduced on every rank
from the same two operands in the same order).
"""

from __future__ import annotations

from ._common import (
    build,
    chunk_bounds,
    doubling_gather,
    halving,
    ring_reduce_scatter,
    step,
    tree_children,
    tree_parent,
)
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


def rabenseifner(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Rabenseifner's all_reduce: a recursive-halving reduce-scatter, then a
    recursive-doubling all-gather (bandwidth-optimal in 2 log2 p rounds).

    With ``p`` the largest power of two <= ``size``, ranks ``p + i`` first send their
    vector to rank ``i`` (which folds it in, in tmp) and get the result back at the
    end. Among the ``p`` core ranks, step ``k`` halves the range a rank works on: it
    sends the half it gives up to partner ``rank ^ (p >> (k + 1))`` and reduces the half
    it keeps with the partner's copy, ``op(lower rank's, higher rank's)``; after log2 p
    steps rank ``r`` holds chunk ``r`` (of ``p`` near-equal chunks) fully reduced,
    written straight into ``out``. The all-gather then swaps ever larger aligned blocks
    of ``out``. Each element is reduced on one rank and forwarded: bit-identical
    everywhere. tmp: two vectors (partial results, receives). ``root`` is ignored.
    """
    n = size
    p = 1 << (n.bit_length() - 1)
    extra, rounds = n - p, p.bit_length() - 1
    back = 2 * rounds + 1  # the tag of the result handed to a folded rank
    if rank >= p:  # folded in at the start, handed the result at the end
        partner = rank - p
        steps = [step((Send(partner, 0, "out", 0, count),)),
                 step((Recv(partner, back, "out", 0, count),))]
        return build(COLLECTIVE, "rabenseifner", rank, n, count, 0, steps, out_size=count)
    chunks = chunk_bounds(count, p)
    core = list(range(p))
    steps: list[Step] = []
    src: tuple[Buf, int] = ("out", 0)
    if rank < extra:
        steps.append(step((Recv(rank + p, 0, "tmp", count, 2 * count),),
                          (Reduce("tmp", 0, "out", 0, "tmp", count, count),)))
        src = ("tmp", 0)

    def into_out(a: Buf, a_off: int, b: Buf, b_off: int, lo: int, hi: int) -> list[Reduce]:
        return [Reduce("out", lo, a, a_off, b, b_off, hi - lo)]

    steps += halving(rank, p, chunks, src, 0, count, core, 1, into_out)
    steps += doubling_gather(rank, p, chunks, ("out", 0), core, 1 + rounds)
    if rank < extra:
        steps.append(step((Send(rank + p, back, "out", 0, count),)))
    return build(COLLECTIVE, "rabenseifner", rank, n, count, 0, steps,
                 tmp_size=2 * count if p > 1 else 0, out_size=count)


def btree(n: int, rank: int) -> tuple[int, list[int]]:
    """(parent, children) of ``rank`` in NCCL's binary tree over ``n`` ranks (parent -1
    for the root, rank 0). Odd ranks are leaves; a rank's subtree is about the ranks
    within its lowest set bit."""
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, ([bit >> 1] if n > 1 else [])
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    low = bit >> 1
    kids = []
    if low:
        kids.append(rank - low)
        while low and rank + low >= n:
            low >>= 1
        if low:
            kids.append(rank + low)
    return up, kids


def double_trees(n: int) -> list[tuple[list[int], list[list[int]]]]:
    """NCCL's two complementary binary trees over ``n`` ranks, each as (parent of every
    rank, children of every rank): the first :func:`btree`; the second the same shape
    mirrored (even ``n``) or shifted by one (odd ``n``), so that a rank inside one tree
    is mostly a leaf of the other."""
    def pos_b(r: int) -> int:
        return (r - 1) % n if n % 2 else n - 1 - r

    def rank_b(q: int) -> int:
        return (q + 1) % n if n % 2 else n - 1 - q

    trees = []
    for to_pos, to_rank in ((lambda r: r, lambda q: q), (pos_b, rank_b)):
        parent, children = [-1] * n, [[] for _ in range(n)]
        for r in range(n):
            up, kids = btree(n, to_pos(r))
            parent[r] = -1 if up < 0 else to_rank(up)
            children[r] = [to_rank(k) for k in kids]
        trees.append((parent, children))
    return trees


def _heights(parent: list[int], children: list[list[int]]) -> tuple[list[int], list[int]]:
    n = len(parent)
    height, depth = [0] * n, [0] * n
    order = []  # parents before children
    todo = [r for r in range(n) if parent[r] < 0]
    while todo:
        r = todo.pop()
        order.append(r)
        for k in children[r]:
            depth[k] = depth[r] + 1
            todo.append(k)
    for r in reversed(order):
        height[r] = 1 + max((height[k] for k in children[r]), default=-1)
    return height, depth


def double_binary_tree(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """NCCL's double binary tree all_reduce: two binary trees, each reducing one half of
    the vector to its root and broadcasting it back.

    The trees complement each other (:func:`double_trees`): a rank that forwards data
    in one is mostly a leaf of the other, so every rank sends and receives about one
    vector in each direction, in about 2 log2 n rounds, and no root is a bottleneck. The
    steps run in global rounds: in the reduce phase a rank at height ``h`` of a tree
    sends its partial result to its parent in round ``h`` (the parent reduces it on
    arrival, ``op(own, child)``, in tmp); in the broadcast phase a rank at depth ``d``
    receives the result straight into ``out`` in round ``H + d - 1``. A round in which
    some rank would talk to the same peer in both trees is split in two (first tree
    first), the same on every rank. Each half is reduced once, at its root, and
    forwarded: bit-identical everywhere. tmp: three halves per tree (partial result,
    two children). ``root`` is ignored.
    """
    n = size
    if n == 1:
        return build(COLLECTIVE, "double_binary_tree", rank, n, count, 0, [], out_size=count)
    half = (count + 1) // 2
    parts = [(0, half), (half, count)]
    trees = double_trees(n)
    shapes = [_heights(*t) for t in trees]
    top = max(h[r] for h, _ in shapes for r in range(n))  # rounds of the reduce phase
    # ops[(round, tree)][rank] = (comms, compute)
    ops: dict[tuple[int, int], dict[int, tuple[list, list]]] = {}
    tmp_base = [0, 3 * half]

    def at(rnd: int, t: int, r: int) -> tuple[list, list]:
        return ops.setdefault((rnd, t), {}).setdefault(r, ([], []))

    for t, ((parent, children), (height, depth)) in enumerate(zip(trees, shapes)):
        lo, hi = parts[t]
        k = hi - lo
        if k == 0:
            continue
        base = tmp_base[t]
        for r in range(n):
            kids = sorted(children[r], key=lambda c: height[c])
            acc: tuple[Buf, int] = ("out", lo)
            for i, c in enumerate(kids):
                last = parent[r] < 0 and i == len(kids) - 1
                dst: tuple[Buf, int] = ("out", lo) if last else ("tmp", base)
                slot = base + (1 + i) * k
                comms, compute = at(height[c], t, r)
                comms.append(Recv(c, 2 * t, "tmp", slot, slot + k))
                compute.append(Reduce(dst[0], dst[1], acc[0], acc[1], "tmp", slot, k))
                acc = dst
            if parent[r] >= 0:
                at(height[r], t, r)[0].append(Send(parent[r], 2 * t, acc[0], acc[1],
                                                   acc[1] + k))
                at(top + depth[r] - 1, t, r)[0].append(Recv(parent[r], 2 * t + 1, "out", lo,
                                                            hi))
            for c in children[r]:
                at(top + depth[r], t, r)[0].append(Send(c, 2 * t + 1, "out", lo, hi))
    steps: list[Step] = []
    last_round = max((rnd for rnd, _ in ops), default=-1)
    for rnd in range(last_round + 1):
        both = [ops.get((rnd, t), {}) for t in (0, 1)]
        clash = False
        for r in range(n):
            a, b = both[0].get(r, ([], [])), both[1].get(r, ([], []))
            for kind in (Send, Recv):
                peers_a = {c.peer for c in a[0] if isinstance(c, kind)}
                if any(isinstance(c, kind) and c.peer in peers_a for c in b[0]):
                    clash = True
        mine = [x.get(rank, ([], [])) for x in both]
        if clash:
            steps += [step(m[0], m[1]) for m in mine]
        else:
            steps.append(step(mine[0][0] + mine[1][0], mine[0][1] + mine[1][1]))
    return build(COLLECTIVE, "double_binary_tree", rank, n, count, 0, steps,
                 tmp_size=6 * half, out_size=count)
