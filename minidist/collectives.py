"""The collectives: one record each, the one place that says what a collective is.

A :class:`Collective` holds everything the layers need to know of one: its frames' kind,
its algorithms (in wire order), whether it has a root, reduces or works in place, the
buffers its schedules get, how the simulator computes the expected result, the traffic
a call must at least move, and how users call it. Every consumer reads it from here:
the schedules' buffer sizes (:mod:`minidist.algorithms`), the simulator and ``minidist
algo check``, the cost model's lower bounds, the planner, the blocking and asyncio
facades, the torch adapter and ``minidist bench``.

Adding a collective is: its schedules (a module under :mod:`minidist.algorithms`), its
record here, and a frame kind (:data:`KINDS`). Pure and self-contained: this module
imports nothing but the standard library, so every layer may read it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Sizes = Callable[[int, int, int, int], tuple[int, int]]
Array = Any  # a 1-D numpy array (this module does not import numpy)
Fold = Callable[[Sequence[Array]], Array]  # reduce arrays in rank order (op and finish)
Expected = Callable[[list[Array], Fold, Fold, int], list[Array]]  # inputs, fold, cat, root


@dataclass(frozen=True)
class FrontEnd:
    """How users call a collective whose functions minidist generates (from this record):
    ``minidist.<function>(array, op=SUM, group=None, async_op=False, algorithm=None,
    <flag>=False)``, the same in :mod:`minidist.aio` (awaitable) and
    :mod:`minidist.torch` (tensors). ``array`` is the input and receives the result (in
    place); ``flag`` (a keyword, default False) selects the collective ``flagged`` instead
    of this one."""

    function: str
    doc: str
    flag: str | None = None
    flagged: str | None = None


@dataclass(frozen=True)
class Collective:
    """One collective. ``count`` is what :func:`minidist.algorithms.make_schedule`
    counts: the elements of ``out`` for the in-place ones, of each rank's ``in`` for
    all_gather and gather, of each rank's ``out`` for reduce_scatter and scatter, of one
    block for all_to_all, 0 for barrier."""

    name: str
    kind: int  # its frames' kind (wire.Kind); part of the wire format: never reuse one
    summary: str
    algorithms: tuple[tuple[str, str], ...]  # (name, "module.function" in algorithms/)
    sizes: Sizes  # (rank, size, count, root) -> elements of "in" and "out"
    expected: Expected  # every rank's result from the inputs (the simulator's reference)
    rooted: bool = False  # its root argument matters (others record root 0)
    reducing: bool = False  # combines values with a ReduceOp
    in_place: bool = False  # schedules use only "out" (holding the input) and "tmp"
    split: bool = False  # the reference rank's input holds size * count elements
    finish: str = "none"  # which ranks apply ops.finish to their out: all, root, none
    moved: Callable[[int, float], float] = lambda n, N: 0.0  # bytes the busiest rank moves
    computes: bool = False  # the busiest rank reduces (n-1)/n of the vector at least
    # every rank writes out only once it heard (indirectly) from every rank
    contract: bool = True
    identity_first: bool = False  # group rank 0's result is the op's identity
    refused_ops: tuple[str, ...] = ()  # names of ReduceOps it does not take
    front: FrontEnd | None = None  # None: minidist's functions for it are written by hand

    def count_of(self, elements: int, size: int) -> int:
        """``count`` from the elements of the reference rank's input (the root's for a
        rooted collective, else rank 0's). ValueError if they do not split."""
        if self.name == "barrier":
            return 0
        if not self.split:
            return elements
        if elements % size:
            raise ValueError(f"{self.name} input of {elements} elements is not a multiple "
                             f"of {size} ranks")
        return elements // size

    def input_elements(self, rank: int, size: int, count: int, root: int) -> int:
        """The elements of ``rank``'s input in a call of ``count``."""
        i, o = self.sizes(rank, size, count, root)
        return o if self.in_place else i

    def uses_input(self, rank: int, root: int) -> bool:
        """Whether ``rank`` contributes an input."""
        return self.name != "barrier" and (self.name != "scatter" or rank == root)

    def finishes(self, rank: int, root: int) -> bool:
        """Whether ``rank`` applies the op's last step (AVG's division) to its out."""
        return self.finish == "all" or (self.finish == "root" and rank == root)

    def whole_bytes(self, size: int, count: int, itemsize: int) -> int:
        """The bytes of the call's whole vector, the same on every rank: out for the
        in-place ones, the full ``count * size`` buffer for the others."""
        return count * itemsize * (1 if self.in_place else size)


def _same(rank: int, size: int, count: int, root: int) -> tuple[int, int]:
    return 0, count


def _share(n: int, N: float) -> float:
    return (n - 1) / n * N


def _prefix(flat: list[Array], fold: Fold, exclusive: bool) -> list[Array]:
    """Rank r's inclusive (or exclusive) prefix reduction; rank 0's exclusive one is left
    empty here (it is the op's identity, which the caller fills in)."""
    out = []
    for r in range(len(flat)):
        part = flat[:r] if exclusive else flat[:r + 1]
        out.append(fold(part) if part else flat[0][:0])
    return out


CATALOG: dict[str, Collective] = {c.name: c for c in (
    Collective(
        "barrier", 1, "every rank waits until all have arrived",
        (("dissemination", "barrier.dissemination"), ("tree", "barrier.tree")),
        lambda r, n, c, root: (0, 0),
        lambda flat, fold, cat, root: [flat[0][:0]] * len(flat)),
    Collective(
        "all_reduce", 2, "every rank gets the reduction of every rank's array",
        (("ring", "allreduce.ring"), ("recursive_doubling", "allreduce.recursive_doubling"),
         ("tree", "allreduce.tree"), ("hierarchical", "hierarchical.flat"),
         ("shared_memory", "shm.all_reduce_default"),
         ("rabenseifner", "allreduce.rabenseifner"),
         ("double_binary_tree", "allreduce.double_binary_tree")),
        _same, lambda flat, fold, cat, root: [fold(flat)] * len(flat),
        reducing=True, in_place=True, finish="all", moved=lambda n, N: 2 * _share(n, N),
        computes=True),
    Collective(
        "broadcast", 3, "every rank gets the root's array",
        (("binomial", "broadcast.binomial"),
         ("scatter_allgather", "broadcast.scatter_allgather"),
         ("shared_memory", "shm.broadcast_default"), ("pipeline", "broadcast.pipeline")),
        _same, lambda flat, fold, cat, root: [flat[root]] * len(flat),
        rooted=True, in_place=True, moved=lambda n, N: N / 2),
    Collective(
        "reduce", 4, "the root gets the reduction of every rank's array",
        (("binomial", "reduce.binomial"), ("rabenseifner", "reduce.rabenseifner")),
        _same, lambda flat, fold, cat, root: [fold(flat) if r == root else flat[r]
                                             for r in range(len(flat))],
        rooted=True, reducing=True, in_place=True, finish="root",
        moved=lambda n, N: N / 2, computes=True),
    Collective(
        "all_gather", 5, "every rank gets every rank's array, in rank order",
        (("ring", "allgather.ring"), ("recursive_doubling", "allgather.recursive_doubling"),
         ("bruck", "allgather.bruck")),
        lambda r, n, c, root: (c, n * c),
        lambda flat, fold, cat, root: [cat(flat)] * len(flat), moved=_share),
    Collective(
        "reduce_scatter", 6, "rank r gets block r of the reduction of every rank's input",
        (("ring", "reduce_scatter.ring"),
         ("recursive_halving", "reduce_scatter.recursive_halving")),
        lambda r, n, c, root: (n * c, c),
        lambda flat, fold, cat, root: [
            fold(flat)[r * (flat[0].size // len(flat)):(r + 1) * (flat[0].size // len(flat))]
            for r in range(len(flat))],
        reducing=True, split=True, finish="all", moved=_share, computes=True),
    Collective(
        "gather", 7, "the root gets every rank's array, in rank order",
        (("binomial", "gather_scatter.gather_binomial"),
         ("linear", "gather_scatter.gather_linear")),
        lambda r, n, c, root: (c, n * c if r == root else 0),
        lambda flat, fold, cat, root: [cat(flat) if r == root else flat[0][:0]
                                      for r in range(len(flat))],
        rooted=True, moved=lambda n, N: _share(n, N) / 2),
    Collective(
        "scatter", 8, "rank r gets block r of the root's input",
        (("binomial", "gather_scatter.scatter_binomial"),
         ("linear", "gather_scatter.scatter_linear")),
        lambda r, n, c, root: (n * c if r == root else 0, c),
        lambda flat, fold, cat, root: [
            flat[root][r * (flat[root].size // len(flat)):
                       (r + 1) * (flat[root].size // len(flat))] for r in range(len(flat))],
        rooted=True, split=True, moved=lambda n, N: _share(n, N) / 2),
    Collective(
        "all_to_all", 9, "rank r's block j goes to rank j, as its block r",
        (("pairwise", "alltoall.pairwise"), ("bruck", "alltoall.bruck")),
        lambda r, n, c, root: (n * c, n * c),
        lambda flat, fold, cat, root: [
            cat([flat[j][r * (flat[0].size // len(flat)):(r + 1) * (flat[0].size // len(flat))]
                  for j in range(len(flat))]) for r in range(len(flat))],
        split=True, moved=_share),
    Collective(
        "scan", 11, "rank r gets the reduction of the arrays of ranks 0..r (MPI_Scan)",
        (("recursive_doubling", "scan.recursive_doubling"), ("linear", "scan.linear")),
        _same, lambda flat, fold, cat, root: _prefix(flat, fold, exclusive=False),
        reducing=True, in_place=True, moved=lambda n, N: N, contract=False,
        refused_ops=("AVG",),
        front=FrontEnd("scan", """Inclusive prefix reduction in place (MPI_Scan): group rank ``r``'s
    ``array`` becomes ``op`` of the arrays of group ranks ``0 .. r``, folded lowest rank
    first. With ``exclusive=True`` (MPI_Exscan) it becomes that of ranks ``0 .. r - 1``,
    and group rank 0's the identity of ``op`` (0 for SUM, 1 for PRODUCT, the dtype's
    largest value for MIN...). Every op but AVG, on every dtype it is defined on. With
    ``async_op=True`` returns a Work; ``algorithm`` is ``"recursive_doubling"`` (the
    default, ceil(log2 n) rounds) or ``"linear"`` (a chain, n - 1 rounds). A rank only
    hears from the ranks before it, so a rank that called something else is detected by
    the ranks after it (group rank 0 may raise on its next call instead).""",
                       flag="exclusive", flagged="exscan")),
    Collective(
        "exscan", 12, "rank r gets the reduction of the arrays of ranks 0..r-1 (MPI_Exscan)",
        (("recursive_doubling", "scan.exclusive_recursive_doubling"),
         ("linear", "scan.exclusive_linear")),
        lambda r, n, c, root: (c, c),
        lambda flat, fold, cat, root: _prefix(flat, fold, exclusive=True),
        reducing=True, moved=lambda n, N: N, contract=False, identity_first=True,
        refused_ops=("AVG",)),
)}
"""Every collective by name, in the order of their frame kinds."""

P2P_KIND = 10  # point-to-point messages' frame kind


def get(name: str) -> Collective:
    """The record of collective ``name``; ValueError naming the known ones if none."""
    try:
        return CATALOG[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(CATALOG)}") from None


def front_ends() -> list[Collective]:
    """The collectives whose user functions are generated from their records."""
    return [c for c in CATALOG.values() if c.front is not None]


KINDS: dict[str, int] = {**{c.name.upper(): c.kind for c in CATALOG.values()},
                         "P2P": P2P_KIND}
"""Frame kinds by upper-case name (:class:`minidist.wire.Kind` is made from it)."""
