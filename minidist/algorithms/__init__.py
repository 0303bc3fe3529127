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

import functools
import importlib
import operator
import re
import zlib
from collections.abc import Callable, Iterable

from ..collectives import CATALOG
from . import (
    hierarchical,
    plugins,  # noqa: F401 - minidist.algorithms.plugins, loaded with the package
    shm,
)
from ._common import buffer_sizes, tmp_extent
from .analysis import ScheduleError, stats, validate
from .compose import PHASE_TAGS, Part, compose, part
from .plugins import load_module
from .schedule import Copy, Recv, Reduce, Schedule, Send, Step

__all__ = [
    "ALGORITHMS", "COLLECTIVES", "IN_PLACE", "REDUCING", "ROOTED",
    "ALLREDUCE_RING_MIN_BYTES", "BROADCAST_SCATTER_ALLGATHER_MIN_BYTES",
    "ALLGATHER_RING_MIN_BYTES", "GATHER_SCATTER_LINEAR_MIN_BYTES", "SCHEDULE_CACHE_SIZE",
    "TREE_MIN_RANKS", "USER_INDEX_BASE", "PHASE_TAGS",
    "Copy", "Part", "Recv", "Reduce", "Schedule", "ScheduleError", "Send", "Step",
    "build", "buffer_sizes", "builtin", "choose", "compose", "load_module", "make_schedule",
    "name_of",
    "part", "register", "registered", "schedules", "simulate", "stats", "unregister",
    "validate", "verify", "wire_index",
]

Algorithm = Callable[[int, int, int, int], Schedule]

# Collective -> algorithm name -> schedule function, from the catalog's records (their
# order IS part of the wire format: frames carry an algorithm's index in
# ALGORITHMS[collective]). A record names each function as "module.function" here.


def _resolve(path: str) -> Algorithm:
    module, function = path.rsplit(".", 1)
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


_REGISTRY: dict[str, dict[str, Algorithm]] = {
    c.name: {name: _resolve(path) for name, path in c.algorithms} for c in CATALOG.values()}

ALGORITHMS: dict[str, tuple[str, ...]] = {c: tuple(a) for c, a in _REGISTRY.items()}
"""Collective name -> the names of its algorithms: the built-ins (append only: their
indices go on the wire), then those registered with :func:`register`, in order."""

_BUILTIN: dict[str, tuple[str, ...]] = dict(ALGORITHMS)

USER_INDEX_BASE = 32
"""Wire indices from here up (to 253; 254 and 255 are minidist's own) belong to
registered algorithms: a registered algorithm's index is ``USER_INDEX_BASE +
crc32("collective:name") % 222``, a digest of its name, so that it does not depend on
the order in which ranks register, and ranks that run differently named algorithms are
told apart by the frames' headers."""
_USER_SLOTS = 254 - USER_INDEX_BASE
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")
_USER_INDEX: dict[str, dict[str, int]] = {c: {} for c in _REGISTRY}
_CHECKED: dict[Algorithm, Algorithm] = {}  # a registered function -> its checking wrapper

COLLECTIVES: tuple[str, ...] = tuple(_REGISTRY)
ROOTED: frozenset[str] = frozenset(c.name for c in CATALOG.values() if c.rooted)
"""Collectives whose ``root`` argument matters (others record root 0)."""
REDUCING: frozenset[str] = frozenset(c.name for c in CATALOG.values() if c.reducing)
"""Collectives that combine values with a ReduceOp (the executor applies ops.finish)."""
IN_PLACE: frozenset[str] = frozenset(c.name for c in CATALOG.values() if c.in_place)
"""Collectives whose schedules use only ``"out"`` (holding the input) and ``"tmp"``."""

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

SCHEDULE_CACHE_SIZE = 4096
"""How many schedules :func:`make_schedule` keeps (one per rank, size, count, root)."""


def _as_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an integer, not {value!r}") from None


def _collective(collective: str) -> dict[str, Algorithm]:
    try:
        return _REGISTRY[collective]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}") from None


def _algorithm(collective: str, algorithm: str) -> Algorithm:
    algos = _collective(collective)
    try:
        return algos[algorithm]
    except (KeyError, TypeError):
        hint = ("; an algorithm of your own must be registered on every rank, with "
                "minidist.algorithms.register() or MINIDIST_ALGO_MODULE"
                if algorithm not in _BUILTIN[collective] else "")
        raise ValueError(
            f"unknown {collective} algorithm {algorithm!r}; known: {', '.join(algos)}{hint}"
        ) from None


# --------------------------------------------------------------------------- registering


def _digest_index(collective: str, name: str) -> int:
    return USER_INDEX_BASE + zlib.crc32(f"{collective}:{name}".encode()) % _USER_SLOTS


def _describe(fn: object) -> str:
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{mod}.{qual}" if mod and qual else repr(fn)


def register(collective: str, name: str, fn: Algorithm | None = None, *,
             replace: bool = False):
    """Make ``fn(rank, size, count, root=0) -> Schedule`` usable as algorithm ``name`` of
    ``collective``: in :func:`make_schedule`, the simulator, pictures, the cost replay,
    and in real jobs (``algorithm="name"``, ``MINIDIST_ALGO_<COLLECTIVE>=name``).

    Without ``fn``, returns a decorator. ``fn`` is called like the built-ins (group
    ranks, ``count`` as in :func:`make_schedule`, ``root`` 0 for unrooted collectives)
    and must be pure: every rank computes its own schedule, and all of them must fit
    together. Each schedule it returns is checked (:func:`validate`, and that it is for
    the collective, rank, size, count and root asked) the first time it is built.

    Every rank of a job must register the same names (importing one module with
    ``MINIDIST_ALGO_MODULE`` does that). A registered algorithm's wire index is a digest
    of its name (:data:`USER_INDEX_BASE`), so the order of registration does not
    matter, and a rank running another algorithm, or one it never registered, is
    reported as a ``CollectiveMismatchError`` naming both.

    Registering the same function (or a reloaded one of the same module and name)
    again is a no-op. ValueError for an unknown collective, a bad name (letters, digits,
    ``_ . -``; at most 64), a built-in's name, a name already taken by another function
    (unless ``replace``), or a name whose wire index another registered name of this
    collective already has (choose another name).
    """
    if fn is None:
        def decorator(f: Algorithm) -> Algorithm:
            register(collective, name, f, replace=replace)
            return f
        return decorator
    algos = _collective(collective)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"bad algorithm name {name!r}: use letters, digits, '_', '.' or "
                         "'-' (at most 64, starting with a letter or '_')")
    if name in _BUILTIN[collective]:
        raise ValueError(f"{collective} algorithm {name!r} is built in; choose another name")
    if not callable(fn):
        raise ValueError(f"register({collective!r}, {name!r}, ...) needs a function, "
                         f"not {type(fn).__name__}")
    old = algos.get(name)
    if old is not None:
        base = _unwrap(old)
        same = base is fn or (_describe(base) == _describe(fn) and "<" not in _describe(fn))
        if not (same or replace):
            raise ValueError(f"{collective} algorithm {name!r} is already registered "
                             f"({_describe(base)}); pass replace=True to replace it")
    else:
        index = _digest_index(collective, name)
        for other, i in _USER_INDEX[collective].items():
            if i == index:
                raise ValueError(
                    f"{collective} algorithm names {name!r} and {other!r} have the same "
                    f"wire index ({index}); register this one under another name")
        _USER_INDEX[collective][name] = index
    algos[name] = _checking(collective, name, fn)
    ALGORITHMS[collective] = tuple(algos)
    return fn


def unregister(collective: str, name: str) -> None:
    """Forget a registered algorithm (built-ins stay). ValueError if it is not one."""
    algos = _collective(collective)
    if name in _BUILTIN[collective] or name not in algos:
        raise ValueError(f"{name!r} is not a registered {collective} algorithm")
    del algos[name]
    del _USER_INDEX[collective][name]
    ALGORITHMS[collective] = tuple(algos)


def builtin(collective: str) -> tuple[str, ...]:
    """The names of ``collective``'s built-in algorithms."""
    _collective(collective)
    return _BUILTIN[collective]


def registered(collective: str | None = None) -> dict[str, dict[str, str]]:
    """The registered (not built-in) algorithms: collective -> name -> ``module.function``."""
    names = [collective] if collective is not None else list(COLLECTIVES)
    return {c: {a: _describe(_unwrap(_collective(c)[a])) for a in _USER_INDEX[c]}
            for c in names}


def wire_index(collective: str, algorithm: str) -> int:
    """The number frames carry for ``algorithm``: a built-in's position in
    ``ALGORITHMS[collective]``, a registered algorithm's name digest. ValueError if the
    algorithm is unknown here."""
    _algorithm(collective, algorithm)
    user = _USER_INDEX[collective].get(algorithm)
    return user if user is not None else _BUILTIN[collective].index(algorithm)


def name_of(collective: str, index: int) -> str | None:
    """The algorithm a frame's index names on this rank (None if it names none here)."""
    names = _BUILTIN.get(collective, ())
    if 0 <= index < len(names):
        return names[index]
    for name, i in _USER_INDEX.get(collective, {}).items():
        if i == index:
            return name
    return None


def _unwrap(fn: Algorithm) -> Algorithm:
    return getattr(fn, "__wrapped__", fn)


def _checking(collective: str, name: str, fn: Algorithm) -> Algorithm:
    """``fn`` wrapped so that every schedule it returns is checked once."""
    @functools.wraps(fn)
    def checked(rank: int, size: int, count: int, root: int = 0) -> Schedule:
        return _check_result(collective, name, fn, fn(rank, size, count, root),
                             rank, size, count, root)
    return checked


def _check_result(collective: str, name: str, fn: object, s: object, rank: int, size: int,
                  count: int, root: int) -> Schedule:
    what = f"{collective} algorithm {name!r} ({_describe(fn)})"
    if not isinstance(s, Schedule):
        raise ScheduleError(f"{what} returned {type(s).__name__}, not a Schedule",
                            rank=rank)
    want = (collective, rank, size, count, root)
    got = (s.collective, s.rank, s.size, s.count, s.root)
    if got != want:
        fields = ("collective", "rank", "size", "count", "root")
        bad = ", ".join(f"{f}={g!r} (asked {w!r})" for f, g, w in zip(fields, got, want)
                        if g != w)
        raise ScheduleError(f"{what} returned a schedule with {bad}", rank=rank)
    if s.algorithm != name or not isinstance(s.steps, tuple):
        s = Schedule(s.collective, name, s.rank, s.size, s.count, s.root, s.tmp_size,
                     tuple(s.steps), s.in_size, s.out_size, s.shared_tmp)
    try:
        validate(s)
    except ScheduleError as e:
        raise ScheduleError(f"{what}: {e}", rank=e.rank, step=e.step) from None
    return s


def _as_function(collective: str, algorithm: str | Algorithm) -> tuple[str, Algorithm]:
    """(name, checked schedule function) for a name or a function of your own."""
    if isinstance(algorithm, str):
        return algorithm, _algorithm(collective, algorithm)
    if not callable(algorithm):
        raise ValueError(f"an algorithm is a name or a function, not {algorithm!r}")
    _collective(collective)
    fn = _CHECKED.get(algorithm)
    if fn is None:
        name = getattr(algorithm, "__name__", "custom")
        fn = _checking(collective, name if _NAME.match(name) else "custom", algorithm)
        if len(_CHECKED) > 256:
            _CHECKED.clear()
        _CHECKED[algorithm] = fn
    return getattr(fn, "__name__", "custom"), fn


# --------------------------------------------------------------------------- schedules


def make_schedule(
    collective: str, algorithm: str | Algorithm, rank: int, size: int, count: int,
    root: int = 0, *, nodes: tuple[int, ...] | None = None, itemsize: int = 4,
) -> Schedule:
    """The schedule of ``rank`` (group rank) for one call of a collective.

    ``algorithm`` is a name (built in or registered) or a schedule function of your own.
    ``count`` counts elements: the length of ``out`` for all_reduce, broadcast and
    reduce; of each rank's ``in`` for all_gather, gather and reduce_scatter's ``out``;
    of one block for scatter and all_to_all; 0 for barrier. ``root`` matters only for
    rooted collectives (:data:`ROOTED`); others record 0. Equal arguments give the same
    (cached, immutable) Schedule object.

    ``nodes`` (the node of each group rank) and ``itemsize`` matter only for the
    topology-aware all_reduce "hierarchical" and the shared-memory algorithms.

    Raises ValueError for an unknown collective or algorithm, ``size < 1``, ``rank`` or
    ``root`` outside ``0..size-1``, a negative count, a non-zero barrier count, or
    non-integer numbers; :class:`ScheduleError` (a ValueError) when a function of your
    own returns a schedule that is malformed or not for these arguments.
    """
    _, fn = _as_function(collective, algorithm)
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
    # chunks no longer than the vector: a short one needs (and reserves) less memory
    if algorithm == "shared_memory" and collective == "all_reduce":
        return shm.shared_memory(rank, size, count,
                                 min(shm.chunk_elements(size, itemsize), max(1, count)))
    if algorithm == "shared_memory" and collective == "broadcast":
        return shm.broadcast_shared_memory(
            rank, size, count, root, min(max(1, shm.BROADCAST_CHUNK_BYTES // itemsize),
                                         max(1, count)))
    return _cached(fn, rank, size, count, root)


@functools.lru_cache(maxsize=SCHEDULE_CACHE_SIZE)
def _cached(fn: Algorithm, rank: int, size: int, count: int, root: int) -> Schedule:
    return fn(rank, size, count, root)


make_schedule.cache_info = _cached.cache_info  # type: ignore[attr-defined]
make_schedule.cache_clear = _cached.cache_clear  # type: ignore[attr-defined]


def schedules(collective: str, algorithm: str | Algorithm, size: int, count: int,
              root: int = 0, *, nodes: tuple[int, ...] | None = None,
              itemsize: int = 4) -> list[Schedule]:
    """Every rank's schedule of one call: ``[make_schedule(..., r, size, ...) for r]``."""
    return [make_schedule(collective, algorithm, r, size, count, root, nodes=nodes,
                          itemsize=itemsize) for r in range(size)]


def build(collective: str, algorithm: str, rank: int, size: int, count: int, root: int,
          steps: Iterable[Step], *, tmp_size: int | None = None, in_size: int | None = None,
          out_size: int | None = None, shared_tmp: bool = False) -> Schedule:
    """A :class:`Schedule` from its steps, the easy way: steps that do nothing are
    dropped, lists become tuples, ``in_size`` and ``out_size`` default to the
    collective's own (:func:`buffer_sizes`) and ``tmp_size`` to the end of the highest
    region of ``"tmp"`` that a step touches."""
    kept = tuple(Step(tuple(s.comms), tuple(s.compute)) for s in steps
                 if s.comms or s.compute)
    want_in, want_out = buffer_sizes(collective, rank, size, count, root)
    if tmp_size is None:
        tmp_size = tmp_extent(kept)
    return Schedule(collective, algorithm, rank, size, count, root, tmp_size, kept,
                    want_in if in_size is None else in_size,
                    want_out if out_size is None else out_size, shared_tmp)


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
    _collective(collective)
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
