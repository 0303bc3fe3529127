"""Schedules: the pure data every collective algorithm produces.

A :class:`Schedule` is what one rank does in one collective: a sequence of
:class:`Step` s. In a step, every communication (:class:`Send`, :class:`Recv`) runs
concurrently; when all of them are done, the step's local computations
(:class:`Reduce`, :class:`Copy`) run in order. Steps run one after another.

Buffers are named, never held: ``"in"`` is the caller's input, ``"out"`` the caller's
output (the same array as ``"in"`` for in-place collectives such as all_reduce and
broadcast), ``"tmp"`` a scratch area of ``Schedule.tmp_size`` elements that the executor
provides. Offsets and lengths count elements, not bytes.

Peers and roots are ranks *within the group* (0 .. size-1). ``tag`` identifies a message
between one (sender, receiver) pair within one collective: a Send and the Recv it
matches carry the same tag, and no two messages from one sender to one receiver in one
collective share a tag.

Contract shared by every algorithm (tests check it in the simulator):
* within a step, no Recv writes a region that another op of that step reads or writes;
* for reducing collectives, "out" is written only after the rank has received data that
  depends on every rank's input, so a mismatch detected from frame headers leaves the
  caller's array untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Buf = Literal["in", "out", "tmp"]


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``buf[lo:hi]`` to group rank ``peer``."""

    peer: int
    tag: int
    buf: Buf
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class Recv:
    """Receive ``hi - lo`` elements from group rank ``peer`` into ``buf[lo:hi]``."""

    peer: int
    tag: int
    buf: Buf
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class Reduce:
    """``dst[dst_lo:dst_lo+n] = op(a[a_lo:a_lo+n], b[b_lo:b_lo+n])``."""

    dst: Buf
    dst_lo: int
    a: Buf
    a_lo: int
    b: Buf
    b_lo: int
    n: int


@dataclass(frozen=True, slots=True)
class Copy:
    """``dst[dst_lo:dst_lo+n] = src[src_lo:src_lo+n]``."""

    dst: Buf
    dst_lo: int
    src: Buf
    src_lo: int
    n: int


Comm = Send | Recv
Compute = Reduce | Copy


@dataclass(frozen=True, slots=True)
class Step:
    """Communications that run concurrently, then computations that run in order."""

    comms: tuple[Comm, ...] = ()
    compute: tuple[Compute, ...] = ()


@dataclass(frozen=True, slots=True)
class Schedule:
    """Everything one rank does in one collective."""

    collective: str
    algorithm: str
    rank: int
    size: int
    count: int
    root: int
    tmp_size: int
    steps: tuple[Step, ...]
    # Element counts the executor must give the "in" and "out" buffers.
    in_size: int = 0
    out_size: int = 0
    # True: "tmp" is one area shared by every rank of the group (shared memory on a
    # node), and the schedule's messages order the ranks' accesses to it.
    shared_tmp: bool = False

    @property
    def operations(self) -> int:
        """How many messages and local operations (copies, reductions) it holds."""
        return sum(len(st.comms) + len(st.compute) for st in self.steps)


def apply_compute(compute: Sequence[Reduce | Copy], bufs: Mapping[str, Any],
                  combine: Callable[[Any, Any, Any], None]) -> None:
    """Run a step's local work on ``bufs`` (1-D arrays by name): ``combine(out, a, b)``
    for each Reduce, a slice copy for each Copy. The one interpreter of this work,
    shared by the engine and the simulator."""
    for c in compute:
        if c.n == 0:
            continue
        if isinstance(c, Reduce):
            combine(bufs[c.dst][c.dst_lo:c.dst_lo + c.n], bufs[c.a][c.a_lo:c.a_lo + c.n],
                    bufs[c.b][c.b_lo:c.b_lo + c.n])
        else:
            bufs[c.dst][c.dst_lo:c.dst_lo + c.n] = bufs[c.src][c.src_lo:c.src_lo + c.n]
