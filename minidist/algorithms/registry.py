"""The algorithm registry: every collective's algorithms by name (the built-ins from
the catalog, :mod:`minidist.collectives`, then those registered), and the schedules
they make (:func:`make_schedule`, memoized). Pure: no I/O. Modules named by the catalog
are imported when the registry is built, by name, so that algorithms may themselves
build on the registry (:mod:`.compose`)."""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import operator
import re
import zlib
from collections.abc import Callable, Iterable

from ..collectives import CATALOG
from ._common import buffer_sizes, tmp_extent
from .analysis import ScheduleError, validate
from .schedule import Schedule, Step

Algorithm = Callable[[int, int, int, int], Schedule]

# Collective -> algorithm name -> schedule function, from the catalog's records (their
# order IS part of the wire format: frames carry an algorithm's index in
# ALGORITHMS[collective]). A record names each function as "module.function" here.


def _resolve(path: str) -> Algorithm:
    module, function = path.rsplit(".", 1)
    return getattr(importlib.import_module(f"{__package__}.{module}"), function)


_FUNCTIONS: dict[str, dict[str, Algorithm]] = {}  # by collective, resolved on first use

ALGORITHMS: dict[str, tuple[str, ...]] = {
    c.name: tuple(name for name, _ in c.algorithms) for c in CATALOG.values()}
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
_USER_INDEX: dict[str, dict[str, int]] = {c: {} for c in ALGORITHMS}
_CHECKED: dict[Algorithm, Algorithm] = {}  # a registered function -> its checking wrapper

COLLECTIVES: tuple[str, ...] = tuple(ALGORITHMS)
ROOTED: frozenset[str] = frozenset(c.name for c in CATALOG.values() if c.rooted)
"""Collectives whose ``root`` argument matters (others record root 0)."""
REDUCING: frozenset[str] = frozenset(c.name for c in CATALOG.values() if c.reducing)
"""Collectives that combine values with a ReduceOp (the executor applies ops.finish)."""
IN_PLACE: frozenset[str] = frozenset(c.name for c in CATALOG.values() if c.in_place)
"""Collectives whose schedules use only ``"out"`` (holding the input) and ``"tmp"``."""

SCHEDULE_CACHE_SIZE = 4096
"""How many schedules :func:`make_schedule` keeps (one per rank, size, count, root)."""
SCHEDULE_KEEP_OPS = 2048
"""Schedules of more operations than this (:attr:`Schedule.operations`: a ring or a
pairwise exchange over more than about 700 ranks) are built again for each call instead
of kept: a rank holds no structure that grows with the group after such a call."""


def _as_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an integer, not {value!r}") from None


def collective_algorithms(collective: str) -> dict[str, Algorithm]:
    """Algorithm name -> schedule function of ``collective``: the built-ins (their
    modules imported on first use), then the registered ones. ValueError for an unknown
    collective."""
    algos = _FUNCTIONS.get(collective) if isinstance(collective, str) else None
    if algos is None:
        if collective not in ALGORITHMS:
            raise ValueError(
                f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
        algos = _FUNCTIONS[collective] = {
            name: _resolve(path) for name, path in CATALOG[collective].algorithms}
    return algos


def resolve_builtins() -> None:
    """Import every module the catalog names and resolve every collective's built-in
    algorithms now (a launcher does it once, before it forks the ranks that share it)."""
    for collective in CATALOG:
        collective_algorithms(collective)


def algorithm_function(collective: str, algorithm: str) -> Algorithm:
    algos = collective_algorithms(collective)
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


def digest_index(collective: str, name: str) -> int:
    """The wire index a registered algorithm ``name`` of ``collective`` gets."""
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
    algos = collective_algorithms(collective)
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
        base = unwrap(old)
        same = base is fn or (_describe(base) == _describe(fn) and "<" not in _describe(fn))
        if not (same or replace):
            raise ValueError(f"{collective} algorithm {name!r} is already registered "
                             f"({_describe(base)}); pass replace=True to replace it")
    else:
        index = digest_index(collective, name)
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
    algos = collective_algorithms(collective)
    if name in _BUILTIN[collective] or name not in algos:
        raise ValueError(f"{name!r} is not a registered {collective} algorithm")
    del algos[name]
    del _USER_INDEX[collective][name]
    ALGORITHMS[collective] = tuple(algos)


def builtin(collective: str) -> tuple[str, ...]:
    """The names of ``collective``'s built-in algorithms."""
    collective_algorithms(collective)
    return _BUILTIN[collective]


def registered(collective: str | None = None) -> dict[str, dict[str, str]]:
    """The registered (not built-in) algorithms: collective -> name -> ``module.function``."""
    names = [collective] if collective is not None else list(COLLECTIVES)
    return {c: {a: _describe(unwrap(collective_algorithms(c)[a])) for a in _USER_INDEX[c]}
            for c in names}


def wire_index(collective: str, algorithm: str) -> int:
    """The number frames carry for ``algorithm``: a built-in's position in
    ``ALGORITHMS[collective]``, a registered algorithm's name digest. ValueError if the
    algorithm is unknown here."""
    algorithm_function(collective, algorithm)
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


def unwrap(fn: Algorithm) -> Algorithm:
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


def as_function(collective: str, algorithm: str | Algorithm) -> tuple[str, Algorithm]:
    """(name, checked schedule function) for a name or a function of your own."""
    if isinstance(algorithm, str):
        return algorithm, algorithm_function(collective, algorithm)
    if not callable(algorithm):
        raise ValueError(f"an algorithm is a name or a function, not {algorithm!r}")
    collective_algorithms(collective)
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
    keep: bool = True,
) -> Schedule:
    """The schedule of ``rank`` (group rank) for one call of a collective.

    ``algorithm`` is a name (built in or registered) or a schedule function of your own.
    ``count`` counts elements: the length of ``out`` for all_reduce, broadcast and
    reduce; of each rank's ``in`` for all_gather, gather and reduce_scatter's ``out``;
    of one block for scatter and all_to_all; 0 for barrier. ``root`` matters only for
    rooted collectives (:data:`ROOTED`); others record 0. Equal arguments give the same
    (cached, immutable) Schedule object, but for schedules of more than
    :data:`SCHEDULE_KEEP_OPS` operations, built anew each time.

    ``nodes`` (the node of each group rank) and ``itemsize`` matter only for the
    topology-aware all_reduce "hierarchical" and the shared-memory algorithms.
    ``keep=False`` builds the schedule without keeping it in the cache (a schedule only
    looked at, such as another rank's for an estimate, holds no memory afterwards).

    Raises ValueError for an unknown collective or algorithm, ``size < 1``, ``rank`` or
    ``root`` outside ``0..size-1``, a negative count, a non-zero barrier count, or
    non-integer numbers; :class:`ScheduleError` (a ValueError) when a function of your
    own returns a schedule that is malformed or not for these arguments.
    """
    _, fn = as_function(collective, algorithm)
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
    if algorithm == "hierarchical" and nodes is not None:  # by the node layout
        return _resolve("hierarchical.hierarchical")(rank, size, count, tuple(nodes),
                                                     itemsize)
    if algorithm == "shared_memory" and collective in ("all_reduce", "broadcast"):
        return _resolve("shm.sized")(collective, rank, size, count, root, itemsize)
    return _CACHE.get(fn, rank, size, count, root) if keep else fn(rank, size, count, root)


CacheInfo = collections.namedtuple("CacheInfo", "hits misses maxsize currsize")


class _Kept:
    """The schedules :func:`make_schedule` keeps: the last SCHEDULE_CACHE_SIZE built, of
    at most SCHEDULE_KEEP_OPS operations each."""

    def __init__(self) -> None:
        self._kept: collections.OrderedDict[tuple, Schedule] = collections.OrderedDict()
        self.hits = self.misses = 0

    def get(self, fn: Algorithm, rank: int, size: int, count: int, root: int) -> Schedule:
        # (each dict operation is atomic: threads that plan at once at worst build a
        # schedule twice; the counts are only a guide)
        key = (fn, rank, size, count, root)
        s = self._kept.get(key)
        if s is not None:
            self.hits += 1
            with contextlib.suppress(KeyError):  # (another thread dropped it just now)
                self._kept.move_to_end(key)
            return s
        self.misses += 1
        s = fn(rank, size, count, root)
        if s.operations <= SCHEDULE_KEEP_OPS:
            self._kept[key] = s
            while len(self._kept) > SCHEDULE_CACHE_SIZE:
                try:
                    self._kept.popitem(last=False)
                except KeyError:
                    break
        return s

    def cache_info(self) -> CacheInfo:
        return CacheInfo(self.hits, self.misses, SCHEDULE_CACHE_SIZE, len(self._kept))

    def cache_clear(self) -> None:
        self._kept.clear()
        self.hits = self.misses = 0


_CACHE = _Kept()
make_schedule.cache_info = _CACHE.cache_info  # type: ignore[attr-defined]
make_schedule.cache_clear = _CACHE.cache_clear  # type: ignore[attr-defined]


def schedules(collective: str, algorithm: str | Algorithm, size: int, count: int,
              root: int = 0, *, nodes: tuple[int, ...] | None = None,
              itemsize: int = 4) -> list[Schedule]:
    """Every rank's schedule of one call: ``[make_schedule(..., r, size, ...) for r]``,
    built for a look (a replay, a drawing), not kept in the cache: a rank that replays
    its candidates keeps no other rank's schedules."""
    return [make_schedule(collective, algorithm, r, size, count, root, nodes=nodes,
                          itemsize=itemsize, keep=False) for r in range(size)]


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
