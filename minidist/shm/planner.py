"""Planning the calls that take the fast path: small collectives of a group on one node,
through its shared slots (:mod:`minidist.shm.fast_slots`, :mod:`minidist.shm.rooted_area`), run by
the caller's thread. Pure: no socket, no event loop."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from .. import ops, wire
from ..group import Group
from ..ops import ReduceOp
from ..placement import Placement
from ..prepared import FAST_INDEX, Call, Prepared
from . import fast_slots, rooted_area

log = logging.getLogger("minidist.plan")


class FastPlanner:
    """Whether a call takes the fast path (:meth:`plan`) and its prepared form
    (:meth:`prepare`). ``number(group)`` hands out call numbers (the engine's counter);
    ``forced``: the job's algorithm overrides (a collective it forces onto an algorithm
    never takes the fast path; the dict is read, so later changes count)."""

    def __init__(self, placement: Placement, number: Callable[[Group], int],
                 forced: dict[str, str]) -> None:
        self.placement = placement
        self._number = number
        self.forced = forced
        self._numbers: dict[int, int] = {}  # per group: its next fast-call number

    def plan(self, kind: wire.Kind, g: Group, dtype: np.dtype, count: int,
             shape: tuple[int, ...]) -> tuple:
        """How a call takes the fast path, ``(dtype code, shape digest, reads, numbers
        used, algorithm name)``, or ``()`` when it does not (the same for every call
        of this kind, group, dtype, count and shape)."""
        collective = kind.name.lower()
        nbytes = count * dtype.itemsize
        placement = self.placement
        direct = placement.can_read(g)
        rooted = rooted_area.takes(collective, g.size, nbytes)
        if not ((rooted or fast_slots.takes(collective, g.size, nbytes, direct))
                and collective not in self.forced
                and (placement.one_node or len(set(placement.layout(g))) == 1)):
            return ()
        digest = wire.shape_digest(shape)
        reads = fast_slots.reads_peers(collective, nbytes, direct, g.size)
        uses = 1 if rooted else fast_slots.numbers(nbytes, dtype.itemsize, reads, g.size,
                                                 collective)
        name = "single_copy" if reads else "shared_slots"
        return ops.dtype_code(dtype), digest, reads, uses, name

    @property
    def numbers(self) -> dict[int, int]:
        """The next fast-call number of each group, by group id (the table :meth:`take`
        counts in; the compiled core's steps count there too)."""
        return self._numbers

    def numbers_calls_by(self, number: Callable[[Group], int]) -> bool:
        """Whether calls are numbered by ``number`` (the engine's ``next_seq``)."""
        return self._number == number

    def take(self, g: Group) -> tuple[int, int]:
        """Number one more fast call of ``g`` that uses one fast-call number (a rooted
        call planned once, :mod:`minidist.shm.repeat`): (its fast-call number, its call
        number), as :meth:`prepare` numbers it."""
        f = self._numbers.get(g.id, 0)
        self._numbers[g.id] = f + 1
        return f, self._number(g)

    def prepare(self, kind: wire.Kind, g: Group, bufs: dict[str, np.ndarray],
                op: ReduceOp, root: int, count: int, copied: np.ndarray | None,
                finish: bool, fast: tuple) -> Prepared:
        """A call on one node through the group's shared slots, by the caller's thread
        (:mod:`minidist.shm.fast_slots`), numbered among the group's fast calls; ``fast``:
        what :meth:`plan` said of it."""
        code, digest, reads, uses, name = fast
        f = self._numbers.get(g.id, 0)
        self._numbers[g.id] = f + uses
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s on %r: %s (%d elements of %s)", kind.name.lower(), g, name,
                      count, bufs["out"].dtype)
        call = Call(kind, g, self._number(g), code, int(op), FAST_INDEX, name, root, count,
                    digest)
        return Prepared(call, None, bufs, op, copied, finish, fast=f, fast_numbers=uses,
                        reads=reads)
