"""Small pure helpers shared by the algorithm modules: chunking, binomial trees, building."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .. import collectives
from .schedule import Buf, Comm, Compute, Recv, Reduce, Schedule, Send, Step


def chunk_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(count)`` into ``parts`` contiguous chunks, as even as possible.

    The first ``count % parts`` chunks get one element more; chunks may be empty when
    ``count < parts``. Every rank computes the same bounds from the same arguments.
    """
    q, rem = divmod(count, parts)
    bounds: list[tuple[int, int]] = []
    lo = 0
    for i in range(parts):
        hi = lo + q + (1 if i < rem else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def lowbit(v: int) -> int:
    """The lowest set bit of ``v`` (``v > 0``)."""
    return v & -v


def tree_parent(v: int) -> int:
    """Parent of virtual rank ``v > 0`` in the binomial tree rooted at virtual rank 0."""
    return v - lowbit(v)


def tree_children(v: int, n: int) -> list[int]:
    """Children of virtual rank ``v`` in the binomial tree over ``n`` ranks, nearest first.

    Child ``v + m`` (``m`` a power of two below ``lowbit(v)``, any power for the root)
    owns the subtree of virtual ranks ``[v + m, v + 2m)`` clipped to ``n``.
    """
    limit = n if v == 0 else lowbit(v)
    kids = []
    m = 1
    while m < limit and v + m < n:
        kids.append(v + m)
        m <<= 1
    return kids


def subtree_size(v: int, n: int) -> int:
    """How many virtual ranks the binomial subtree of ``v`` spans: ``[v, v + size)``."""
    return n if v == 0 else min(lowbit(v), n - v)


def step(comms: Iterable[Comm] = (), compute: Iterable[Compute] = ()) -> Step:
    """Build a :class:`Step` from iterables."""
    return Step(tuple(comms), tuple(compute))


def build(
    collective: str,
    algorithm: str,
    rank: int,
    size: int,
    count: int,
    root: int,
    steps: Iterable[Step],
    *,
    tmp_size: int = 0,
    in_size: int = 0,
    out_size: int = 0,
) -> Schedule:
    """Assemble a :class:`Schedule`, dropping steps that do nothing."""
    kept = tuple(s for s in steps if s.comms or s.compute)
    return Schedule(
        collective=collective,
        algorithm=algorithm,
        rank=rank,
        size=size,
        count=count,
        root=root,
        tmp_size=tmp_size,
        steps=kept,
        in_size=in_size,
        out_size=out_size,
    )


def ring_reduce_scatter(
    rank: int,
    size: int,
    bounds: list[tuple[int, int]],
    src: Buf,
    final_dst: tuple[Buf, int],
) -> tuple[list[Step], int]:
    """Ring reduce-scatter steps: rank ``r`` ends with chunk ``r`` fully reduced.

    ``bounds[i]`` is chunk ``i`` of buffer ``src`` (the rank's own contribution, only
    read). At step ``s`` (0 .. size-2) rank ``r`` sends the partial sum of chunk
    ``(r - s - 1) % size`` to ``r + 1`` and receives the partial sum of chunk
    ``(r - s - 2) % size`` from ``r - 1``, which it combines with its own contribution
    as ``op(own, received)``. Partial sums live in two alternating tmp regions, so the
    region sent in a step is never the one received into. Only the last step writes
    ``final_dst`` (buffer, offset): ``op(own chunk r, received)``, after a message that
    depends on every other rank's input has arrived. Each chunk is reduced on exactly
    one rank, so forwarding it later gives bit-identical results everywhere.

    Returns the steps (tags 0 .. size-2) and the tmp elements they need.
    """
    n = size
    if n == 1:
        return [], 0
    width = max(hi - lo for lo, hi in bounds)
    regions = (0, width)
    steps: list[Step] = []
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        slo, shi = bounds[(rank - s - 1) % n]
        if s == 0:
            send = Send(right, s, src, slo, shi)
        else:
            off = regions[(s - 1) % 2]
            send = Send(right, s, "tmp", off, off + (shi - slo))
        clo, chi = bounds[(rank - s - 2) % n]
        k = chi - clo
        off = regions[s % 2]
        recv = Recv(left, s, "tmp", off, off + k)
        if s < n - 2:
            red = Reduce("tmp", off, src, clo, "tmp", off, k)
        else:
            dst, dlo = final_dst
            red = Reduce(dst, dlo, src, clo, "tmp", off, k)
        steps.append(step((send, recv), (red,)))
    return steps, width * min(2, n - 1)


def buffer_sizes(collective: str, rank: int, size: int, count: int, root: int = 0
                 ) -> tuple[int, int]:
    """(elements of ``"in"``, elements of ``"out"``) that ``rank`` of a collective call
    gets from the executor; ``count`` as in :func:`minidist.algorithms.make_schedule`
    (the collective's record in :mod:`minidist.collectives` says). ValueError for an
    unknown collective."""
    return collectives.get(collective).sizes(rank, size, count, root)


def tmp_extent(steps: Iterable[Step]) -> int:
    """The end of the highest region of ``"tmp"`` that ``steps`` touch."""
    end = 0
    for st in steps:
        for c in st.comms:
            if c.buf == "tmp":
                end = max(end, c.hi)
        for op in st.compute:
            if isinstance(op, Reduce):
                regions = ((op.dst, op.dst_lo), (op.a, op.a_lo), (op.b, op.b_lo))
            else:
                regions = ((op.dst, op.dst_lo), (op.src, op.src_lo))
            for buf, lo in regions:
                if buf == "tmp":
                    end = max(end, lo + op.n)
    return end


def halving(v: int, p: int, chunks: list[tuple[int, int]], src: tuple[Buf, int],
            acc: int, recv: int, real: list[int], tag: int,
            last: Callable[[Buf, int, Buf, int, int, int], list[Reduce]] | None = None
            ) -> list[Step]:
    """Recursive-halving reduce-scatter among ``p`` (a power of two) virtual ranks.

    ``chunks[u]`` is the element range virtual rank ``u`` ends up owning (contiguous,
    in order). This rank (virtual ``v``, group rank ``real[v]``) reads its own vector
    at ``src`` (buffer, base offset: element ``i`` is at ``base + i``), keeps partial
    results in ``tmp[acc + i]`` and receives into ``tmp[recv + i]``. Step ``k``
    exchanges half of the current range with virtual rank ``v ^ (p >> (k + 1))`` (tag
    ``tag + k``) and reduces the kept half as ``op(lower rank's, higher rank's)``.
    After the last step chunk ``v`` is fully reduced, in ``tmp[acc:]``, or wherever
    ``last(a_buf, a_off, b_buf, b_off, lo, hi)`` (the Reduce ops of the last step, for
    elements ``lo:hi``) puts it.
    """
    steps: list[Step] = []
    clo, chi = 0, p
    cur: tuple[Buf, int] = src
    d, k = p >> 1, 0
    while d >= 1:
        mid = (clo + chi) // 2
        partner = v ^ d
        if v & d:
            keep, give = (mid, chi), (clo, mid)
        else:
            keep, give = (clo, mid), (mid, chi)
        glo, ghi = chunks[give[0]][0], chunks[give[1] - 1][1]
        klo, khi = chunks[keep[0]][0], chunks[keep[1] - 1][1]
        send = Send(real[partner], tag + k, cur[0], cur[1] + glo, cur[1] + ghi)
        get = Recv(real[partner], tag + k, "tmp", recv + klo, recv + khi)
        mine: tuple[Buf, int] = (cur[0], cur[1] + klo)
        theirs: tuple[Buf, int] = ("tmp", recv + klo)
        a, b = (mine, theirs) if v < partner else (theirs, mine)
        if d == 1 and last is not None:
            ops = last(a[0], a[1], b[0], b[1], klo, khi)
        else:
            ops = [Reduce("tmp", acc + klo, a[0], a[1], b[0], b[1], khi - klo)]
        steps.append(step((send, get), ops))
        cur = ("tmp", acc)
        clo, chi = keep
        d, k = d >> 1, k + 1
    return steps


def doubling_gather(v: int, p: int, chunks: list[tuple[int, int]], buf: tuple[Buf, int],
                    real: list[int], tag: int) -> list[Step]:
    """Recursive-doubling all-gather among ``p`` (a power of two) virtual ranks: virtual
    rank ``v`` starts with ``chunks[v]`` at ``buf`` (buffer, base) and ends with every
    chunk; step ``k`` swaps the aligned blocks of ``2**k`` chunks with ``v ^ 2**k``."""
    steps: list[Step] = []
    d, k = 1, 0
    while d < p:
        partner = v ^ d
        mine, theirs = v & ~(d - 1), partner & ~(d - 1)
        mlo, mhi = chunks[mine][0], chunks[mine + d - 1][1]
        tlo, thi = chunks[theirs][0], chunks[theirs + d - 1][1]
        steps.append(step((Send(real[partner], tag + k, buf[0], buf[1] + mlo, buf[1] + mhi),
                           Recv(real[partner], tag + k, buf[0], buf[1] + tlo, buf[1] + thi))))
        d, k = d << 1, k + 1
    return steps
