"""Building an algorithm from the schedules of other algorithms run by subsets of ranks.

A composed schedule is a sequence of *phases*. In each phase a sub-group of the ranks
runs an algorithm of its own (any collective, built in or registered) as if it were a
group: this rank's schedule within the sub-group is remapped to group ranks, its tags
moved to a range of their own, and its buffers placed where you say in the composed
schedule's buffers. Between phases, plain :class:`Step` s do local work (copies, say).

``minidist``'s own ``hierarchical`` all_reduce is built this way::

    bufs = {"out": ("tmp", 0), "tmp": ("tmp", count)}
    compose("all_reduce", "hierarchical", rank, size, count, 0, [
        Step(compute=(Copy("tmp", 0, "out", 0, count),)),
        part("reduce", "binomial", local, rank, count, root=local[0], buffers=bufs),
        part("all_reduce", "ring", leaders, rank, count, buffers=bufs),
        part("broadcast", "binomial", local, rank, count, root=local[0], buffers=bufs),
        Step(compute=(Copy("out", 0, "tmp", 0, count),)),
    ])

Every rank must list the same phases in the same order; a rank that takes no part in
a phase passes ``None`` there (:func:`part` returns None for a rank outside
``ranks``), so that phase ``p``'s tags (``(p + 1) * PHASE_TAGS`` and up) agree on
every rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ._common import buffer_sizes, tmp_extent
from .analysis import validate
from .registry import ROOTED, make_schedule
from .schedule import Buf, Copy, Recv, Reduce, Schedule, Send, Step

PHASE_TAGS = 1 << 20
"""Tags of phase ``p`` of a composed schedule start at ``(p + 1) * PHASE_TAGS``; a
sub-schedule's own tags must stay below it. Plain steps keep their tags (below it)."""

_BUFFERS = ("in", "out", "tmp")


@dataclass(frozen=True)
class Part:
    """One phase: ``schedule`` is this rank's share of an algorithm run by the
    sub-group ``ranks`` (``ranks[i]`` is the group rank of sub-group rank ``i``), and
    ``buffers`` places its buffers in the composed schedule's: ``{"out": ("tmp", 0)}``
    makes the sub-schedule's ``out`` the composed ``tmp`` from element 0. Buffers not
    named stay where they are (``"in"`` -> ``("in", 0)``, and so on)."""

    schedule: Schedule
    ranks: tuple[int, ...]
    buffers: Mapping[str, tuple[str, int]] = field(default_factory=dict)


def part(collective: str, algorithm: object, ranks: Sequence[int], rank: int, count: int,
         root: int | None = None, *, buffers: Mapping[str, tuple[str, int]] | None = None,
         nodes: tuple[int, ...] | None = None, itemsize: int = 4) -> Part | None:
    """Group rank ``rank``'s :class:`Part` of ``collective`` with ``algorithm`` (a name
    or a schedule function) run by the group ranks ``ranks``, or None when ``rank`` is
    not one of them. ``root`` is a group rank among ``ranks`` (default ``ranks[0]``;
    only rooted collectives use it); ``nodes`` the node of each rank of the sub-group."""

    ranks = tuple(int(r) for r in ranks)
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"part: ranks {list(ranks)} repeat a rank")
    if rank not in ranks:
        return None
    if root is None:
        root = ranks[0]
    if collective in ROOTED and root not in ranks:
        raise ValueError(f"part: root {root} is not one of the ranks {list(ranks)}")
    sub_root = ranks.index(root) if root in ranks else 0
    s = make_schedule(collective, algorithm, ranks.index(rank), len(ranks), count, sub_root,
                      nodes=nodes, itemsize=itemsize)
    return Part(s, ranks, dict(buffers or {}))


def _mapping(p: Part) -> dict[str, tuple[str, int]]:
    where = {b: (b, 0) for b in _BUFFERS}
    for name, target in p.buffers.items():
        if name not in _BUFFERS or not isinstance(target, tuple) or len(target) != 2 \
                or target[0] not in _BUFFERS or target[1] < 0:
            raise ValueError(f"compose: buffers maps {name!r} to {target!r}; expected a "
                             "buffer name ('in', 'out' or 'tmp') -> (buffer name, offset >= 0)")
        where[name] = target
    return where


def remap(p: Part, tag_base: int) -> list[Step]:
    """``p``'s steps with sub-group ranks mapped to group ranks, tags moved up by
    ``tag_base`` and buffers placed as ``p.buffers`` says."""
    s = p.schedule
    if len(p.ranks) != s.size:
        raise ValueError(f"compose: a part of {s.size} ranks lists {len(p.ranks)} ranks")
    if s.shared_tmp:
        raise ValueError(f"compose: {s.collective}/{s.algorithm} uses shared memory "
                         "and cannot be part of a composed schedule")
    where = _mapping(p)

    def at(buf: Buf, lo: int) -> tuple[Buf, int]:
        b, off = where[buf]
        return b, off + lo  # type: ignore[return-value]

    out: list[Step] = []
    for st in s.steps:
        comms = []
        for c in st.comms:
            if not 0 <= c.tag < PHASE_TAGS:
                raise ValueError(f"compose: {s.collective}/{s.algorithm} uses tag {c.tag}; "
                                 f"a part's tags must stay below PHASE_TAGS ({PHASE_TAGS})")
            b, lo = at(c.buf, c.lo)
            kind = Send if isinstance(c, Send) else Recv
            comms.append(kind(p.ranks[c.peer], c.tag + tag_base, b, lo, lo + c.hi - c.lo))
        compute: list[Reduce | Copy] = []
        for c in st.compute:
            if isinstance(c, Reduce):
                compute.append(Reduce(*at(c.dst, c.dst_lo), *at(c.a, c.a_lo), *at(c.b, c.b_lo),
                                      c.n))
            else:
                compute.append(Copy(*at(c.dst, c.dst_lo), *at(c.src, c.src_lo), c.n))
        out.append(Step(tuple(comms), tuple(compute)))
    return out


def compose(collective: str, algorithm: str, rank: int, size: int, count: int,
            root: int = 0, pieces: Iterable[Part | Step | None] = (), *,
            tmp_size: int | None = None, in_size: int | None = None,
            out_size: int | None = None) -> Schedule:
    """Rank ``rank``'s schedule made of ``pieces``, in order: a :class:`Part` (a phase
    run by a sub-group; see :func:`part`), ``None`` (a phase this rank sits out), or a
    plain :class:`Step` (kept as it is).

    ``in_size`` and ``out_size`` default to the collective's own
    (:func:`~minidist.algorithms.buffer_sizes`); ``tmp_size`` to what the pieces need
    (every part's buffers placed with their full declared sizes). Phase ``p`` (counting
    Parts and Nones) gets tags from ``(p + 1) * PHASE_TAGS``. The result is checked
    with :func:`~minidist.algorithms.validate`; whether it computes the collective is
    for :func:`~minidist.algorithms.verify` to say.
    """

    steps: list[Step] = []
    need_tmp = 0
    phase = 0
    for piece in pieces:
        if piece is None:
            phase += 1
            continue
        if isinstance(piece, Step):
            steps.append(Step(tuple(piece.comms), tuple(piece.compute)))
            continue
        if not isinstance(piece, Part):
            raise ValueError(f"compose: a piece is a Part, a Step or None, not {piece!r}")
        phase += 1
        steps += remap(piece, phase * PHASE_TAGS)
        s = piece.schedule
        for name, (buf, off) in _mapping(piece).items():
            if buf == "tmp":
                need_tmp = max(need_tmp, off + {"in": s.in_size, "out": s.out_size,
                                                "tmp": s.tmp_size}[name])
    kept = tuple(st for st in steps if st.comms or st.compute)
    want_in, want_out = buffer_sizes(collective, rank, size, count, root)
    result = Schedule(
        collective, algorithm, rank, size, count, root,
        max(need_tmp, tmp_extent(kept)) if tmp_size is None else tmp_size, kept,
        want_in if in_size is None else in_size, want_out if out_size is None else out_size)
    validate(result)
    return result
