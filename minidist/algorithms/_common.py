"""Small pure helpers shared by the algorithm modules: chunking, binomial trees, building."""

from __future__ import annotations

from collections.abc import Iterable

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
