"""Collective algorithms as pure schedules (no I/O), and an in-memory simulator.

Every algorithm is a pure function ``(rank, size, count, root) -> Schedule`` (group
ranks, element counts). :func:`make_schedule` looks one up by name, checks its
arguments and memoizes the result; :func:`choose` picks the default algorithm for a
message size. :func:`register` adds an algorithm of your own under a name, usable
everywhere a built-in one is: the simulator (:func:`simulate`, :func:`verify`),
pictures and traces, the cost replay (:mod:`.cost`) and real processes
(``algorithm="name"``). :func:`compose` builds an algorithm from the schedules of
other algorithms run by subsets of the ranks. The simulator
(:mod:`minidist.algorithms.simulator`, the only module here that uses numpy) runs the
schedules of all ranks in one process.
"""

from __future__ import annotations

from . import plugins  # noqa: F401 - minidist.algorithms.plugins, loaded with the package
from ._common import buffer_sizes
from .analysis import ScheduleError, stats, validate
from .compose import PHASE_TAGS, Part, compose, part
from .plugins import load_module
from .registry import (  # noqa: F401 - the registry's names, as the package's
    ALGORITHMS,
    COLLECTIVES,
    IN_PLACE,
    REDUCING,
    ROOTED,
    SCHEDULE_CACHE_SIZE,
    SCHEDULE_KEEP_OPS,
    USER_INDEX_BASE,
    Algorithm,
    as_function,
    build,
    builtin,
    collective_algorithms,
    make_schedule,
    name_of,
    register,
    registered,
    schedules,
    unregister,
    wire_index,
)
from .schedule import Copy, Recv, Reduce, Schedule, Send, Step

__all__ = [
    "ALGORITHMS", "COLLECTIVES", "IN_PLACE", "REDUCING", "ROOTED",
    "ALLREDUCE_RING_MIN_BYTES", "BROADCAST_SCATTER_ALLGATHER_MIN_BYTES",
    "ALLGATHER_RING_MIN_BYTES", "GATHER_SCATTER_LINEAR_MIN_BYTES", "SCHEDULE_CACHE_SIZE",
    "SCHEDULE_KEEP_OPS",
    "TREE_MIN_RANKS", "USER_INDEX_BASE", "PHASE_TAGS",
    "Copy", "Part", "Recv", "Reduce", "Schedule", "ScheduleError", "Send", "Step",
    "build", "buffer_sizes", "builtin", "choose", "compose", "load_module", "make_schedule",
    "name_of",
    "part", "register", "registered", "schedules", "simulate", "stats", "unregister",
    "validate", "verify", "wire_index",
]


# ---------------------------------------------------------------------------------------
# Default thresholds, in bytes of the whole vector (see choose()).
#
# Alpha-beta-gamma model: a message of N bytes costs alpha + N*beta, reducing N bytes
# costs N*gamma. For all_reduce over n ranks:
#   recursive doubling  ~ log2(n) * (alpha + N*beta + N*gamma)
#   ring                ~ 2(n-1) * alpha + 2(n-1)/n * N*beta + (n-1)/n * N*gamma
# so ring wins once N > alpha * (2(n-1) - log2 n) / (log2 n * (beta+gamma) - (n-1)/n *
# (2 beta + gamma)). With figures measured on a 2-core machine (alpha ~ 20-35 us per
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

def __getattr__(name: str):  # simulate and verify need numpy: load them on first use
    if name in ("simulate", "verify"):
        from . import simulator

        return getattr(simulator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def choose(collective: str, size: int, nbytes: int, *, count: int | None = None) -> str:
    """The default algorithm for ``collective`` over ``size`` ranks.

    ``nbytes`` is the size of the collective's whole vector in bytes: ``out`` for
    all_reduce, broadcast and reduce, the full ``count * size`` buffer for all_gather,
    reduce_scatter, gather, scatter and all_to_all. ``count`` (elements, optional) lets
    all_reduce and broadcast avoid chunked algorithms when there are fewer elements than
    ranks (for all_to_all: the elements of one block). Same arguments, same answer on
    every rank. Thresholds are the module constants ``*_MIN_BYTES``; all_to_all follows
    the cost replay with the built-in costs (:func:`cost.choose_replayed`: Bruck for
    small blocks, pairwise for large ones). Raises ValueError for an unknown collective
    or negative sizes.
    """
    collective_algorithms(collective)
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
    if collective == "all_to_all":  # the cost replay with the built-in costs
        from . import cost

        block = count if count is not None else nbytes // (4 * size)
        itemsize = nbytes // (block * size) if block else 4
        return cost.choose_replayed("all_to_all", size, block, cost.DEFAULT,
                                    cost.ALL_TO_ALL_CANDIDATES, itemsize=max(1, itemsize))
    return ALGORITHMS[collective][0]
