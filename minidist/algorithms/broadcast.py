"""broadcast schedules: the root's ``out`` is copied into every rank's ``out``.

In place: only ``"out"`` (never ``"in"``, no tmp). Non-roots receive straight into
``out``; the root only reads its ``out``.
"""

from __future__ import annotations

import math

from ._common import build, chunk_bounds, step, subtree_size, tree_children, tree_parent
from .allreduce import binomial_broadcast_steps
from .schedule import Recv, Schedule, Send, Step

COLLECTIVE = "broadcast"


def _real(size: int, root: int) -> list[int]:
    """Virtual rank -> group rank, for a tree rooted at ``root``."""
    return [(u + root) % size for u in range(size)]


def binomial(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree broadcast: ceil(log2 size) rounds, the whole vector per message.

    Latency-optimal; every non-leaf rank sends the full vector to each of its children,
    largest subtree first.
    """
    v = (rank - root) % size
    steps = binomial_broadcast_steps(v, size, (0, count), _real(size, root), 0)
    return build(COLLECTIVE, "binomial", rank, size, count, root, steps, out_size=count)


def scatter_allgather(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Van de Geijn broadcast: binomial scatter of ``size`` chunks, then ring all-gather.

    Chunk ``u`` (of ``size`` near-equal chunks; empty ones when ``count < size``) goes to
    virtual rank ``u = (rank - root) % size``. The scatter hands each subtree its chunks
    as one contiguous message; the ring all-gather then circulates chunks to the right,
    skipping the ones a rank already holds (the root receives nothing). Each rank sends
    and receives about ``count`` elements in total instead of ``count * log2(size)``.
    """
    n = size
    v = (rank - root) % n
    real = _real(n, root)
    bounds = chunk_bounds(count, n)

    def span(u: int) -> tuple[int, int]:
        """Elements of the chunks of u's binomial subtree."""
        return bounds[u][0], bounds[u + subtree_size(u, n) - 1][1]

    def holds(u: int, chunk: int) -> bool:
        """Whether virtual rank u has ``chunk`` after the scatter."""
        return u <= chunk < u + subtree_size(u, n)

    steps: list[Step] = []
    if v != 0:
        steps.append(step((Recv(real[tree_parent(v)], 0, "out", *span(v)),)))
    for child in reversed(tree_children(v, n)):
        steps.append(step((Send(real[child], 0, "out", *span(child)),)))
    right, left = (v + 1) % n, (v - 1) % n
    for s in range(n - 1):
        comms = []
        out_chunk = (v - s) % n
        if not holds(right, out_chunk):
            comms.append(Send(real[right], 1 + s, "out", *bounds[out_chunk]))
        in_chunk = (v - s - 1) % n
        if not holds(v, in_chunk):
            comms.append(Recv(real[left], 1 + s, "out", *bounds[in_chunk]))
        steps.append(step(comms))
    return build(COLLECTIVE, "scatter_allgather", rank, n, count, root, steps, out_size=count)


def pipeline_segments(size: int, count: int) -> int:
    """How many segments the pipelined chain cuts ``count`` elements into: about
    sqrt((size - 1) * count / 16384), at least 4 (or ``count``), at most ``count``."""
    if count == 0 or size < 3:
        return 1
    best = math.isqrt((size - 1) * count // 16384)
    return max(min(4, count), min(count, best))


def pipeline(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Pipelined chain broadcast: the ranks form a chain from the root (``root``,
    ``root + 1``, ...) and the vector travels down it in ``S`` segments
    (:func:`pipeline_segments`); in step ``s`` a rank receives segment ``s`` from its
    predecessor while it passes segment ``s - 1`` on. ``n - 2 + S`` rounds of ``N / S``
    bytes: close to ``N`` bytes' time for large vectors however many ranks, but
    ``n - 1`` hops of latency. Non-roots receive straight into ``out``.
    """
    n = size
    v = (rank - root) % n
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    segs = chunk_bounds(count, pipeline_segments(n, count))
    steps: list[Step] = []
    for s in range(len(segs) + 1):
        comms: list = []
        if v > 0 and s < len(segs):
            comms.append(Recv(prev, s, "out", *segs[s]))
        if v < n - 1 and s >= 1 and n > 1:
            comms.append(Send(nxt, s - 1, "out", *segs[s - 1]))
        steps.append(step(comms))
    if v == 0 and n > 1:  # the root sends segment s in step s: no waiting on itself
        steps = [step((Send(nxt, s, "out", *segs[s]),)) for s in range(len(segs))]
    return build(COLLECTIVE, "pipeline", rank, n, count, root, steps, out_size=count)
