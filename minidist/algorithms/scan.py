"""scan and exscan schedules: prefix reductions over the group's ranks (MPI_Scan and
MPI_Exscan).

scan (in place): rank r's ``out`` becomes ``op(x_0, ..., x_r)`` of the ranks' inputs,
folded lowest rank first. exscan: rank r's ``out`` becomes ``op(x_0, ..., x_{r-1})``
from its ``in``; rank 0's ``out`` is never written (the planner gives it the op's
identity).
"""

from __future__ import annotations

from ._common import buffer_sizes, step, tmp_extent
from ._common import build as _build
from .schedule import Buf, Copy, Recv, Reduce, Schedule, Send, Step


def build(collective: str, algorithm: str, rank: int, size: int, count: int, root: int,
          steps: list[Step]) -> Schedule:
    """The schedule, with the collective's own buffer sizes and the tmp its steps use."""
    kept = [s for s in steps if s.comms or s.compute]
    ins, outs = buffer_sizes(collective, rank, size, count, root)
    return _build(collective, algorithm, rank, size, count, root, kept,
                  tmp_size=tmp_extent(kept), in_size=ins, out_size=outs)


def recursive_doubling(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Hillis and Steele's scan: in round k (distance d = 2**k) every rank sends its
    running value to rank + d and folds the one from rank - d in front of its own;
    ceil(log2 size) rounds, a whole vector per message. tmp: one vector."""
    steps: list[Step] = []
    d, k = 1, 0
    while d < size:
        comms, compute = [], []
        if rank + d < size:
            comms.append(Send(rank + d, k, "out", 0, count))
        if rank - d >= 0:
            comms.append(Recv(rank - d, k, "tmp", 0, count))
            compute.append(Reduce("out", 0, "tmp", 0, "out", 0, count))
        steps.append(step(comms, compute))
        d, k = d << 1, k + 1
    return build("scan", "recursive_doubling", rank, size, count, 0, steps)


def linear(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """A chain: rank r folds what rank r - 1 sends in front of its own, then passes the
    result on; size - 1 rounds, each rank moves one vector each way. tmp: one vector."""
    steps: list[Step] = []
    if rank > 0:
        steps.append(step((Recv(rank - 1, 0, "tmp", 0, count),),
                          (Reduce("out", 0, "tmp", 0, "out", 0, count),)))
    if rank + 1 < size:
        steps.append(step((Send(rank + 1, 0, "out", 0, count),)))
    return build("scan", "linear", rank, size, count, 0, steps)


def exclusive_recursive_doubling(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """exscan by Hillis and Steele's rounds: a rank keeps its running inclusive value
    (its input, then ``tmp[0:count]``) to send, and folds each value it receives in front
    of its result ``out`` (the first one it copies). tmp: two vectors."""
    steps: list[Step] = []
    held: tuple[Buf, int] = ("in", 0)  # where this rank's running inclusive value is
    wrote = False
    d, k = 1, 0
    while d < size:
        comms, compute = [], []
        if rank + d < size:
            comms.append(Send(rank + d, k, held[0], held[1], held[1] + count))
        if rank - d >= 0:
            comms.append(Recv(rank - d, k, "tmp", count, 2 * count))
            compute.append(Reduce("out", 0, "tmp", count, "out", 0, count) if wrote
                           else Copy("out", 0, "tmp", count, count))
            wrote = True
            if rank + 2 * d < size:  # sent again later: fold it into the running value
                compute.append(Reduce("tmp", 0, "tmp", count, held[0], held[1], count))
                held = ("tmp", 0)
        steps.append(step(comms, compute))
        d, k = d << 1, k + 1
    return build("exscan", "recursive_doubling", rank, size, count, 0, steps)


def exclusive_linear(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """exscan as a chain: rank r receives op(x_0 .. x_{r-1}) from rank r - 1 into its
    ``out``, folds its own input behind it and passes that on. tmp: one vector."""
    steps: list[Step] = []
    if rank > 0:
        steps.append(step((Recv(rank - 1, 0, "out", 0, count),)))
    if rank + 1 < size:
        if rank > 0:
            steps.append(step(compute=(Reduce("tmp", 0, "out", 0, "in", 0, count),)))
        steps.append(step((Send(rank + 1, 0, "tmp" if rank > 0 else "in", 0, count),)))
    return build("exscan", "linear", rank, size, count, 0, steps)
