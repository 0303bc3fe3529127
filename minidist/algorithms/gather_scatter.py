"""gather and scatter schedules.

gather: ``"in"`` has ``count`` elements on every rank (only read); the root's ``"out"``
has ``count * size`` and receives rank ``r``'s ``in`` at ``out[r*count:(r+1)*count]``;
other ranks have no ``"out"`` (``out_size`` 0).

scatter: the root's ``"in"`` has ``count * size`` elements (only read; other ranks have
none); every rank's ``"out"`` (``count``) receives block ``rank`` of the root's ``in``.

The binomial versions work on virtual ranks ``v = (rank - root) % size``: the blocks of
a subtree are contiguous in virtual order, so each tree edge carries one message. In
group-rank order a subtree's blocks may wrap past the end of the root's buffer; the
root then stages that one subtree's blocks in tmp.
"""

from __future__ import annotations

from ._common import build, step, subtree_size, tree_children, tree_parent
from .schedule import Compute, Copy, Recv, Schedule, Send, Step


def _wrap_pieces(first: int, blocks: int, n: int, c: int) -> list[tuple[int, int, int]]:
    """Blocks of group ranks first, first+1, ... (mod n) as (buf elem, tmp elem, len)."""
    head = min(blocks, n - first)
    pieces = [(first * c, 0, head * c)]
    if blocks > head:
        pieces.append((0, head * c, (blocks - head) * c))
    return pieces


def gather_binomial(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree gather: ceil(log2 size) levels; a rank sends its subtree's blocks.

    An inner rank receives from all its children at once into tmp (its own block
    first), then sends the lot to its parent; a leaf sends ``in`` directly. The root
    receives straight into ``out`` except for at most one wrapping subtree.
    """
    n, c = size, count
    v = (rank - root) % n
    real = [(u + root) % n for u in range(n)]
    kids = tree_children(v, n)
    steps: list[Step] = []
    if v != 0:
        if not kids:
            steps.append(step((Send(real[tree_parent(v)], 0, "in", 0, c),)))
            return build("gather", "binomial", rank, n, c, root, steps, in_size=c)
        recvs = [Recv(real[k], 0, "tmp", (k - v) * c, (k - v + subtree_size(k, n)) * c)
                 for k in kids]
        steps.append(step(recvs, (Copy("tmp", 0, "in", 0, c),)))
        sub = subtree_size(v, n)
        steps.append(step((Send(real[tree_parent(v)], 0, "tmp", 0, sub * c),)))
        return build("gather", "binomial", rank, n, c, root, steps,
                     tmp_size=sub * c, in_size=c)
    comms: list[Recv] = []
    compute: list[Compute] = [Copy("out", root * c, "in", 0, c)]
    tmp_size = 0
    for k in kids:
        blocks = subtree_size(k, n)
        pieces = _wrap_pieces(real[k], blocks, n, c)
        if len(pieces) == 1:
            comms.append(Recv(real[k], 0, "out", real[k] * c, (real[k] + blocks) * c))
        else:
            comms.append(Recv(real[k], 0, "tmp", 0, blocks * c))
            compute += [Copy("out", o, "tmp", t, ln) for o, t, ln in pieces]
            tmp_size = blocks * c
    steps.append(step(comms, compute))
    return build("gather", "binomial", rank, n, c, root, steps,
                 tmp_size=tmp_size, in_size=c, out_size=n * c)


def gather_linear(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Linear gather: every rank sends ``in`` to the root, which receives all at once.

    One step; each block moves once (no forwarding), but the root handles size-1
    messages.
    """
    n, c = size, count
    if rank != root:
        steps = [step((Send(root, 0, "in", 0, c),))]
        return build("gather", "linear", rank, n, c, root, steps, in_size=c)
    recvs = [Recv(j, 0, "out", j * c, (j + 1) * c) for j in range(n) if j != root]
    steps = [step(recvs, (Copy("out", root * c, "in", 0, c),))]
    return build("gather", "linear", rank, n, c, root, steps, in_size=c, out_size=n * c)


def scatter_binomial(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree scatter: a rank receives its subtree's blocks in one message, keeps
    its own and sends each child its part, largest subtree first.

    Inner non-roots stage their subtree's blocks in tmp; leaves receive straight into
    ``out``. The root sends from ``in`` except for at most one wrapping subtree, which
    it first copies into tmp.
    """
    n, c = size, count
    v = (rank - root) % n
    real = [(u + root) % n for u in range(n)]
    kids = tree_children(v, n)
    steps: list[Step] = []
    if v != 0:
        if not kids:
            steps.append(step((Recv(real[tree_parent(v)], 0, "out", 0, c),)))
            return build("scatter", "binomial", rank, n, c, root, steps, out_size=c)
        sub = subtree_size(v, n)
        steps.append(step((Recv(real[tree_parent(v)], 0, "tmp", 0, sub * c),),
                          (Copy("out", 0, "tmp", 0, c),)))
        for k in reversed(kids):
            lo = (k - v) * c
            steps.append(step((Send(real[k], 0, "tmp", lo, lo + subtree_size(k, n) * c),)))
        return build("scatter", "binomial", rank, n, c, root, steps,
                     tmp_size=sub * c, out_size=c)
    stage: list[Compute] = [Copy("out", 0, "in", root * c, c)]
    sends: list[Step] = []
    tmp_size = 0
    for k in reversed(kids):
        blocks = subtree_size(k, n)
        pieces = _wrap_pieces(real[k], blocks, n, c)
        if len(pieces) == 1:
            sends.append(step((Send(real[k], 0, "in", real[k] * c, (real[k] + blocks) * c),)))
        else:
            stage += [Copy("tmp", t, "in", o, ln) for o, t, ln in pieces]
            sends.append(step((Send(real[k], 0, "tmp", 0, blocks * c),)))
            tmp_size = blocks * c
    steps = [step((), stage), *sends]
    return build("scatter", "binomial", rank, n, c, root, steps,
                 tmp_size=tmp_size, in_size=n * c, out_size=c)


def scatter_linear(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Linear scatter: the root sends every rank its block at once, in one step."""
    n, c = size, count
    if rank != root:
        steps = [step((Recv(root, 0, "out", 0, c),))]
        return build("scatter", "linear", rank, n, c, root, steps, out_size=c)
    sends = [Send(j, 0, "in", j * c, (j + 1) * c) for j in range(n) if j != root]
    steps = [step(sends, (Copy("out", 0, "in", root * c, c),))]
    return build("scatter", "linear", rank, n, c, root, steps, in_size=n * c, out_size=c)
