"""Collective algorithms as pure schedules (no I/O), and an in-memory simulator.

Every algorithm is a pure function ``(rank, size, count, root) -> Schedule`` (group
ranks, element counts). :func:`make_schedule` looks one up by name, checks its
arguments and memoizes the result; :func:`choose` picks the default algorithm for a
message size. The simulator (:mod:`minidist.algorithms.simulator`, the only module here
that uses numpy) runs the schedules of all ranks in one process.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

from . import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    gather_scatter,
    hierarchical,
    reduce,
    shm,
)
from . import reduce_scatter as _reduce_scatter
from .analysis import ScheduleError, stats, validate
from .schedule import Copy, Recv, Reduce, Schedule, Send, Step

__all__ = [
    "ALGORITHMS", "COLLECTIVES", "IN_PLACE", "REDUCING", "ROOTED",
    "ALLREDUCE_RING_MIN_BYTES", "BROADCAST_SCATTER_ALLGATHER_MIN_BYTES",
    "ALLGATHER_RING_MIN_BYTES", "GATHER_SCATTER_LINEAR_MIN_BYTES", "SCHEDULE_CACHE_SIZE",
    "TREE_MIN_RANKS",
    "Copy", "Recv", "Reduce", "Schedule", "ScheduleError", "Send", "Step",
    "choose", "make_schedule", "stats", "validate",
]

Algorithm = Callable[[int, int, int, int], Schedule]

# Collective -> algorithm name -> schedule function. Defaults come from choose(), not
# from the order; but the order IS part of the wire format (frames carry an algorithm's
# index in ALGORITHMS[collective]), so only ever append.
_REGISTRY: dict[str, dict[str, Algorithm]] = {
    "all_reduce": {
        "ring": allreduce.ring,
        "recursive_doubling": allreduce.recursive_doubling,
        "tree": allreduce.tree,
        # with no node layout given, every rank counts as one node
        "hierarchical": lambda rank, size, count, root=0: hierarchical.hierarchical(
            rank, size, count, (0,) * size),
        "shared_memory": lambda rank, size, count, root=0: shm.shared_memory(
            rank, size, count, shm.chunk_elements(size, 4)),
    },
    "broadcast": {
        "binomial": broadcast.binomial,
        "scatter_allgather": broadcast.scatter_allgather,
        "shared_memory": lambda rank, size, count, root=0: shm.broadcast_shared_memory(
            rank, size, count, root, shm.BROADCAST_CHUNK_BYTES // 4),
    },
    "barrier": {"dissemination": barrier.dissemination, "tree": barrier.tree},
    "reduce": {"binomial": reduce.binomial},
    "all_gather": {"ring": allgather.ring, "recursive_doubling": allgather.recursive_doubling},
    "reduce_scatter": {"ring": _reduce_scatter.ring},
    "gather": {"binomial": gather_scatter.gather_binomial, "linear": gather_scatter.gather_linear},
    "scatter": {
        "binomial": gather_scatter.scatter_binomial,
        "linear": gather_scatter.scatter_linear,
    },
    "all_to_all": {"pairwise": alltoall.pairwise},
}

ALGORITHMS: dict[str, tuple[str, ...]] = {c: tuple(a) for c, a in _REGISTRY.items()}
"""Collective name -> the names of its algorithms (append only: indices go on the wire)."""

COLLECTIVES: tuple[str, ...] = tuple(_REGISTRY)
ROOTED: frozenset[str] = frozenset({"broadcast", "reduce", "gather", "scatter"})
"""Collectives whose ``root`` argument matters (others record root 0)."""
REDUCING: frozenset[str] = frozenset({"all_reduce", "reduce", "reduce_scatter"})
"""Collectives that combine values with a ReduceOp (the executor applies ops.finish)."""
IN_PLACE: frozenset[str] = frozenset({"all_reduce", "broadcast", "reduce"})
"""Collectives whose schedules use only ``"out"`` (holding the input) and ``"tmp"``."""

# ---------------------------------------------------------------------------------------
# Default thresholds, in bytes of the whole vector (see choose()).
#
# Alpha-beta-gamma model: a message of N bytes costs alpha + N*beta, reducing N bytes
# costs N*gamma. For all_reduce over n ranks:
#   recursive doubling  ~ log2(n) * (alpha + N*beta + N*gamma)
#   ring                ~ 2(n-1) * alpha + 2(n-1)/n * N*beta + (n-1)/n * N*gamma
# so ring wins once N > alpha * (2(n-1) - log2 n) / (log2 n * (beta+gamma) - (n-1)/n *
# (2 beta + gamma)). With the figures measured for this design (alpha ~ 20-35 us per
# asyncio message, beta ~ 0.3 ns/B over a Unix socket, gamma ~ 0.17 ns/B) and a core
# per rank that is a few hundred KiB at n = 4..16. But minidist's target is many ranks
# per node on few cores: there every byte copied or reduced by any rank competes for the
# same cores (beta and gamma grow ~ n / cores) while waiting for a message costs no CPU,
# which pulls the crossover down by roughly that factor. 64 KiB is the middle of that
# range; it also keeps recursive doubling (which moves and reduces log2(n) whole
# vectors) away from the sizes where its memory traffic dominates.
ALLREDUCE_RING_MIN_BYTES = 64 * 1024
# Broadcast: binomial ~ log2(n) * (alpha + N*beta); scatter+allgather ~
# (log2(n) + n-1) * alpha + 2 (n-1)/n * N*beta. It pays once N*beta*(log2 n - 2(n-1)/n)
# exceeds (n-1)*alpha: about 6-8 alpha/beta (~600 KiB at the figures above with a core
# per rank, less when ranks share cores), and never for n = 2, where both move N bytes
# from the root but scatter+allgather needs two messages.
BROADCAST_SCATTER_ALLGATHER_MIN_BYTES = 256 * 1024
# all_gather (bytes of the whole output): recursive doubling / Bruck ~ log2(n) alpha +
# (n-1)/n N beta, ring ~ (n-1) alpha + (n-1)/n N beta: same bytes, fewer messages; but
# Bruck stages the whole output in tmp and copies it once more, and ring lets the
# engine overlap neighbours' transfers, so ring takes over for large outputs.
ALLGATHER_RING_MIN_BYTES = 64 * 1024
# gather/scatter (bytes of the root's whole buffer): binomial needs log2(n) rounds but
# forwards blocks through inner ranks (about N/2 * log2(n) bytes moved in all, plus
# copies); linear moves each block once, in n-1 messages to or from the root.
GATHER_SCATTER_LINEAR_MIN_BYTES = 512 * 1024
# Latency-bound calls (barrier, small all_reduce) on large groups: recursive doubling
# and dissemination send size*log2(size) messages per call, binomial trees 2(size-1).
# With a core per rank the former finish in half the rounds; with many ranks per core
# (minidist's target) every message costs CPU the others wait for, and first calls also
# open a connection per new peer, so above this group size the trees win.
TREE_MIN_RANKS = 17

SCHEDULE_CACHE_SIZE = 4096
"""How many schedules :func:`make_schedule` keeps (one per rank, size, count, root)."""


def _as_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an integer, not {value!r}") from None


def _algorithm(collective: str, algorithm: str) -> Algorithm:
    try:
        algos = _REGISTRY[collective]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}") from None
    try:
        return algos[algorithm]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown {collective} algorithm {algorithm!r}; known: {', '.join(algos)}"
        ) from None


def make_schedule(
    collective: str, algorithm: str, rank: int, size: int, count: int, root: int = 0,
    *, nodes: tuple[int, ...] | None = None, itemsize: int = 4,
) -> Schedule:
    """The schedule of ``rank`` (group rank) for one call of a collective.

    ``count`` counts elements: the length of ``out`` for all_reduce, broadcast and
    reduce; of each rank's ``in`` for all_gather, gather and reduce_scatter's ``out``;
    of one block for scatter and all_to_all; 0 for barrier. ``root`` matters only for
    rooted collectives (:data:`ROOTED`); others record 0. Equal arguments give the same
    (cached, immutable) Schedule object.

    ``nodes`` (the node of each group rank) and ``itemsize`` matter only for the
    topology-aware all_reduce "hierarchical".

    Raises ValueError for an unknown collective or algorithm, ``size < 1``, ``rank`` or
    ``root`` outside ``0..size-1``, a negative count, a non-zero barrier count, or
    non-integer numbers.
    """
    fn = _algorithm(collective, algorithm)
    rank, size = _as_int("rank", rank), _as_int("size", size)
    count, root = _as_int("count", count), _as_int("root", root)
    if size < 1:
        raise ValueError(f"group size must be >= 1, not {size}")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside the group (size {size})")
    if not 0 <= root < size:
        raise ValueError(f"root {root} is outside the group (size {size})")
    if count < 0:
        raise ValueError(f"count must be >= 0, not {count}")
    if collective == "barrier" and count != 0:
        raise ValueError(f"barrier moves no data: count must be 0, not {count}")
    if collective not in ROOTED:
        root = 0
    if algorithm == "hierarchical" and nodes is not None:
        return hierarchical.hierarchical(rank, size, count, tuple(nodes), itemsize)
    if algorithm == "shared_memory" and collective == "all_reduce":
        return shm.shared_memory(rank, size, count, shm.chunk_elements(size, itemsize))
    if algorithm == "shared_memory" and collective == "broadcast":
        return shm.broadcast_shared_memory(rank, size, count, root,
                                           max(1, shm.BROADCAST_CHUNK_BYTES // itemsize))
    return _cached(fn, rank, size, count, root)


@functools.lru_cache(maxsize=SCHEDULE_CACHE_SIZE)
def _cached(fn: Algorithm, rank: int, size: int, count: int, root: int) -> Schedule:
    return fn(rank, size, count, root)


make_schedule.cache_info = _cached.cache_info  # type: ignore[attr-defined]
make_schedule.cache_clear = _cached.cache_clear  # type: ignore[attr-defined]


def choose(collective: str, size: int, nbytes: int, *, count: int | None = None) -> str:
    """The default algorithm for ``collective`` over ``size`` ranks.

    ``nbytes`` is the size of the collective's whole vector in bytes: ``out`` for
    all_reduce, broadcast and reduce, the full ``count * size`` buffer for all_gather,
    reduce_scatter, gather, scatter and all_to_all. ``count`` (elements, optional) lets
    all_reduce and broadcast avoid chunked algorithms when there are fewer elements than
    ranks. Same arguments, same answer on every rank. Thresholds are the module
    constants ``*_MIN_BYTES``. Raises ValueError for an unknown collective or negative
    sizes.
    """
    if collective not in _REGISTRY:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if size < 1 or nbytes < 0 or (count is not None and count < 0):
        raise ValueError(f"bad size {size} / nbytes {nbytes} / count {count}")
    few = count is not None and count < size
    if collective == "all_reduce":
        if nbytes < ALLREDUCE_RING_MIN_BYTES or few:
            return "tree" if size >= TREE_MIN_RANKS else "recursive_doubling"
        return "ring"
    if collective == "barrier":
        return "tree" if size >= TREE_MIN_RANKS else "dissemination"
    if collective == "broadcast":
        if size <= 2 or nbytes < BROADCAST_SCATTER_ALLGATHER_MIN_BYTES or few:
            return "binomial"
        return "scatter_allgather"
    if collective == "all_gather":
        return "recursive_doubling" if nbytes < ALLGATHER_RING_MIN_BYTES else "ring"
    if collective in ("gather", "scatter"):
        return "binomial" if nbytes < GATHER_SCATTER_LINEAR_MIN_BYTES else "linear"
    return ALGORITHMS[collective][0]
