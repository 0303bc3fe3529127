"""What planning hands on: the records of planned calls and minidist's own message tags.

A :class:`Call` is what one collective call looks like on this rank (frames carry it); a
:class:`Prepared` collective or a :class:`P2P` message is what the
:class:`~minidist.plan.Planner` returns, the door starts and the session executes. Pure:
no socket, no event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import algorithms, ops, wire
from .algorithms.schedule import Schedule
from .group import Group
from .ops import ReduceOp


class Call(NamedTuple):
    """What one collective call looks like on this rank; frames carry it so that ranks
    that called different things find out from the first frame. (A named tuple: as
    immutable as a frozen dataclass, and made in a seventh of the time, once per call.)"""

    kind: wire.Kind
    group: Group
    seq: int
    dtype: int
    op: int
    algorithm: int
    algorithm_name: str
    root: int  # global rank, -1 if none
    count: int
    shape: int

    @property
    def name(self) -> str:
        return self.kind.name.lower()

    def describe(self, h: wire.Header | None = None) -> str:
        """The call as a user would write it (or as the frame ``h`` says its sender did)."""
        if h is None:
            kind, dtype, op, root, count, algo = (self.kind, self.dtype, self.op, self.root,
                                                  self.count, self.algorithm)
        else:
            kind, dtype, op, root, count, algo = h.kind, h.dtype, h.op, h.root, h.count, \
                h.algorithm
        try:
            dt = str(ops.dtype_from_code(dtype))
        except ValueError:
            dt = f"code {dtype}"
        name = wire.Kind(kind).name.lower()
        parts = [f"count={count}", f"dtype={dt}"]
        if kind in (wire.Kind.ALL_REDUCE, wire.Kind.REDUCE, wire.Kind.REDUCE_SCATTER):
            parts.append(f"op={ReduceOp(op).name}")
        if root >= 0:
            parts.append(f"root={root}")
        if kind != wire.Kind.P2P:
            algo_name = self.algorithm_name if h is None and algo == FAST_INDEX \
                else algorithms.name_of(name, algo)
            parts.append(f"algorithm={algo_name!r}" if algo_name is not None
                         else f"an algorithm not registered here (wire index {algo})")
        return f"{name}({', '.join(parts)})"


@dataclass(eq=False)
class Prepared:
    """A validated call, numbered and scheduled, ready to execute."""

    call: Call | None  # None: nothing to communicate (a group of one)
    schedule: Schedule | None
    bufs: dict[str, np.ndarray]
    op: ReduceOp
    user: np.ndarray | None = None  # the caller's array when ``bufs`` hold a copy
    finish: bool = False
    sent: frozenset[int] = frozenset()  # first-step sends done from the caller's thread
    fast: int = -1  # a fast call (minidist.shm.fast_slots): its number among the group's, else -1
    fast_numbers: int = 1  # ... and how many of the group's fast-call numbers it uses
    reads: bool = False  # ... and whether it reads its peers' vectors (shm.fast_slots.reads_peers)


P2P_TAG_LIMIT = 1 << 31  # tags from 2**31 up are minidist's own
SHM_TAG = P2P_TAG_LIMIT + 1  # setting up a group's shared-memory segment
FAST_TAG = P2P_TAG_LIMIT + 2  # setting up a group's fast slots
FAST_INDEX = 254  # the "algorithm" of a fast call (no frames carry it)


@dataclass(eq=False)
class P2P:
    """A prepared point-to-point message: to or from ``peer`` (a global rank)."""

    group: Group
    peer: int
    tag: int
    seq: int
    flat: np.ndarray | None  # None: an object of any size
    shape: int
    is_object: bool
    user: np.ndarray | None = None  # the caller's array when ``flat`` is a copy
    sending: bool = False
    source: int = -1  # a receive's sender, once it is done (``peer`` is -1: any source)
