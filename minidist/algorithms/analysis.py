"""Static checks and cost counts for one rank's :class:`Schedule` (pure, no numpy).

:func:`validate` enforces the rules a schedule must follow on its own (bounds, tags,
conflicts inside a step); the simulator adds the checks that need every rank (matching,
lengths, deadlock). :func:`stats` counts steps, messages and elements, for people
comparing algorithms under the alpha-beta cost model.
"""

from __future__ import annotations

from .schedule import Copy, Recv, Reduce, Schedule, Send

BUFFERS = ("in", "out", "tmp")


class ScheduleError(ValueError):
    """A schedule breaks the contract documented in :mod:`minidist.algorithms.schedule`.

    ``rank`` and ``step`` say where, when known (else None)."""

    def __init__(self, message: str, *, rank: int | None = None,
                 step: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.step = step


def _err(s: Schedule, step: int | None, message: str) -> ScheduleError:
    return ScheduleError(message, rank=s.rank, step=step)


def _sizes(schedule: Schedule) -> dict[str, int]:
    return {"in": schedule.in_size, "out": schedule.out_size, "tmp": schedule.tmp_size}


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` is well formed on its own.

    Checks: sane header (size >= 1, rank/root in range, count and buffer sizes >= 0);
    every op names a known buffer and stays within its declared size; nothing writes
    ``"in"``; peers are other ranks of the group; within one step at most one Send to
    and one Recv from each peer, and no Recv region overlaps another comm's region of
    the same buffer (comms run concurrently; the step's computations run after them,
    in order, and may read what the step received); a (peer, tag) pair is used by at
    most one Send and one Recv in the whole schedule; a Reduce's destination is either
    exactly one of its operands or disjoint from it; a Copy's source and destination
    do not overlap.
    """
    s = schedule
    where = f"{s.collective}/{s.algorithm} rank {s.rank} of {s.size}"
    if s.size < 1:
        raise _err(s, None, f"{where}: size must be >= 1")
    if not 0 <= s.rank < s.size or not 0 <= s.root < s.size:
        raise _err(s, None, f"{where}: rank or root {s.root} out of range")
    if s.count < 0:
        raise _err(s, None, f"{where}: negative count {s.count}")
    sizes = _sizes(s)
    for name, n in sizes.items():
        if n < 0:
            raise _err(s, None, f"{where}: negative {name}_size {n}")

    def region(i: int, op: object, buf: str, lo: int, hi: int) -> None:
        if buf not in sizes:
            raise _err(s, i, f"{where} step {i}: unknown buffer {buf!r} in {op}")
        if not 0 <= lo <= hi <= sizes[buf]:
            raise _err(s, i, f"{where} step {i}: {buf}[{lo}:{hi}] out of range "
                       f"(size {sizes[buf]}) in {op}")

    sent: set[tuple[int, int]] = set()
    received: set[tuple[int, int]] = set()
    for i, st in enumerate(s.steps):
        to: set[int] = set()
        frm: set[int] = set()
        spans: list[tuple[str, int, int, bool, object]] = []
        for c in st.comms:
            if not isinstance(c, Send | Recv):
                raise _err(s, i, f"{where} step {i}: {c!r} is not a Send or Recv")
            if not 0 <= c.peer < s.size or c.peer == s.rank:
                raise _err(s, i, f"{where} step {i}: bad peer {c.peer} in {c}")
            if not 0 <= c.tag < 1 << 32:
                raise _err(s, i, f"{where} step {i}: tag {c.tag} outside 0..2**32-1 in {c}")
            region(i, c, c.buf, c.lo, c.hi)
            if isinstance(c, Send):
                if c.peer in to:
                    raise _err(s, i, f"{where} step {i}: two Sends to rank {c.peer}")
                if (c.peer, c.tag) in sent:
                    raise _err(s, i, f"{where} step {i}: tag {c.tag} reused to rank {c.peer}")
                to.add(c.peer)
                sent.add((c.peer, c.tag))
            else:
                if c.buf == "in":
                    raise _err(s, i, f"{where} step {i}: {c} writes the input buffer")
                if c.peer in frm:
                    raise _err(s, i, f"{where} step {i}: two Recvs from rank {c.peer}")
                if (c.peer, c.tag) in received:
                    raise _err(
                        s, i, f"{where} step {i}: tag {c.tag} reused from rank {c.peer}")
                frm.add(c.peer)
                received.add((c.peer, c.tag))
            if c.hi > c.lo:
                spans.append((c.buf, c.lo, c.hi, isinstance(c, Recv), c))
        # Sweep per buffer: a Recv may overlap nothing; Sends may overlap each other.
        spans.sort(key=lambda t: (t[0], t[1]))
        prev_buf, max_hi, max_recv_hi = "", 0, 0
        for buf, lo, hi, is_recv, op in spans:
            if buf != prev_buf:
                prev_buf, max_hi, max_recv_hi = buf, 0, 0
            if lo < (max_hi if is_recv else max_recv_hi):
                raise _err(s, i, f"{where} step {i}: {op} overlaps another message's "
                           f"region of {buf!r}")
            max_hi = max(max_hi, hi)
            if is_recv:
                max_recv_hi = max(max_recv_hi, hi)
        for op in st.compute:
            if isinstance(op, Reduce):
                region(i, op, op.dst, op.dst_lo, op.dst_lo + op.n)
                region(i, op, op.a, op.a_lo, op.a_lo + op.n)
                region(i, op, op.b, op.b_lo, op.b_lo + op.n)
                srcs = ((op.a, op.a_lo), (op.b, op.b_lo))
                for buf, lo in srcs:
                    if (op.n > 0 and buf == op.dst and lo != op.dst_lo
                            and abs(lo - op.dst_lo) < op.n):
                        raise _err(s, i, f"{where} step {i}: {op} destination partly "
                                   "overlaps an operand")
                dst_name = op.dst
            elif isinstance(op, Copy):
                region(i, op, op.dst, op.dst_lo, op.dst_lo + op.n)
                region(i, op, op.src, op.src_lo, op.src_lo + op.n)
                if op.n > 0 and op.src == op.dst and abs(op.src_lo - op.dst_lo) < op.n:
                    raise _err(s, i, f"{where} step {i}: {op} source and destination overlap")
                dst_name = op.dst
            else:
                raise _err(s, i, f"{where} step {i}: {op!r} is not a Reduce or Copy")
            if op.n < 0:
                raise _err(s, i, f"{where} step {i}: negative length in {op}")
            if dst_name == "in":
                raise _err(s, i, f"{where} step {i}: {op} writes the input buffer")


def stats(schedule: Schedule, itemsize: int = 1) -> dict[str, int]:
    """Count what one rank does in ``schedule``; bytes assume ``itemsize`` bytes/element.

    Keys: ``steps`` (all steps), ``rounds`` (steps that communicate: the latency term,
    alpha), ``sends``/``recvs`` (messages), ``elems_sent``/``elems_recv`` and
    ``bytes_sent``/``bytes_recv`` (the bandwidth term, beta), ``reduced`` and ``copied``
    (elements combined or copied locally: the compute term, gamma), ``peers`` (distinct
    ranks talked to: connections needed) and ``tmp_size``.
    """
    out = dict.fromkeys(("steps", "rounds", "sends", "recvs", "elems_sent", "elems_recv",
                         "reduced", "copied"), 0)
    peers: set[int] = set()
    for st in schedule.steps:
        out["steps"] += 1
        out["rounds"] += 1 if st.comms else 0
        for c in st.comms:
            peers.add(c.peer)
            if isinstance(c, Send):
                out["sends"] += 1
                out["elems_sent"] += c.hi - c.lo
            else:
                out["recvs"] += 1
                out["elems_recv"] += c.hi - c.lo
        for op in st.compute:
            out["reduced" if isinstance(op, Reduce) else "copied"] += op.n
    out["bytes_sent"] = out["elems_sent"] * itemsize
    out["bytes_recv"] = out["elems_recv"] * itemsize
    out["peers"] = len(peers)
    out["tmp_size"] = schedule.tmp_size
    return out
