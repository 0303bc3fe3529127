"""The roles of a group's rooted area (:mod:`minidist.shm.rooted_area`) that wait, run by
the compiled core (``minidist.shm._core.Area``, see :mod:`minidist.shm.core`): the core runs the
role in one call and comes back only when its wait lasted a slice (then
:meth:`~minidist.shm.waits.Waits._wait` does the checks of a longer wait) or when the
call needs the Python steps (a scatter to settle whose receivers are not all through
it, a mismatch to name)."""

from __future__ import annotations

import time

import numpy as np

from . import fast_slots
from .fast_slots import ARRIVED, DIFFERS, RELEASE, SLEEPING_RELEASE, Hooks

SETTLED_TAIL = ("; found at this rank's next call on the group (#{}), which did not run; "
                "the scatter's outputs hold the blocks the root sent")
_WAIT_MORE, _DIFFER, _SETTLE_LATE, _SETTLE_DIFFERS = 2, 1, 3, 4  # minidist.shm._core's answers


class CompiledRoles:
    """The waiting roles of :class:`minidist.shm.rooted_area.Rooted` by its compiled area
    (``core``)."""

    core: object
    size: int
    pending: tuple | None
    pieces: np.ndarray
    w: memoryview

    def core_scatter_recv(self, f: int, hw: int, root: int, key: bytes, deadline: float,
                           hooks: Hooks, call, out: np.ndarray, nb: int) -> bool:
        """:meth:`scatter_recv` by the compiled core (its done word stored too): whether
        the root's signature differs (then ``out`` is unchanged). A wait longer than a
        slice comes back here for the checks of :meth:`_wait`."""
        number = (f + 1) & 0x7FFFFFFF
        while True:
            got = self.core.scatter_recv(f, root, key, call.seq, out, nb,
                                         min(fast_slots.SLICE, deadline - time.monotonic()))
            if got != _WAIT_MORE:
                return got == _DIFFER
            self._wait(hw + RELEASE // 4, number, hw + SLEEPING_RELEASE // 4, root, f & 1,
                       number, deadline, hooks, call)

    def core_gather_root(self, f: int, head: int, key: bytes, deadline: float,
                          hooks: Hooks, call, src: np.ndarray, out: np.ndarray,
                          nb: int, first: tuple[int, int] | None = None) -> None:
        """:meth:`gather_root` by the compiled core, with this rank's pending scatter
        settled on the way; when the scatter's receivers were not all through it, the
        core leaves the call, its arrivals counted, to the Python steps after
        :meth:`_collect`'s wait, here. ``first``: the core's answer to a first try
        already made (by a :class:`minidist.shm._core.Step`), to go on from."""
        pending = self.pending
        pf, pkey = (pending[0], pending[1]) if pending is not None else (-1, b"")
        number, parity = (f + 1) & 0x7FFFFFFF, f & 1
        while True:
            if first is not None:
                (got, bad), first = first, None
            else:
                got, bad = self.core.gather_root(
                    f, key, call.seq, src, out, nb, pf, pkey,
                    min(fast_slots.SLICE, deadline - time.monotonic()))
            if got != _WAIT_MORE:
                break
            self._wait((head + ARRIVED) >> 2, self.size - 1, None, None, parity, number,
                       deadline, hooks, call)
        if got == _SETTLE_LATE:
            self._settle(deadline, hooks, call)
            bad = self._differing(parity, key)
            if bad >= 0:
                self.w[(head + DIFFERS) >> 2] = number
                self._finish(f)
                raise self.mismatch(call, bad, parity)
            out.view(np.uint8).reshape(self.size, nb)[...] = self.pieces[parity][:, :nb]
            self._finish(f)
            return
        self.pending = None
        if got == _SETTLE_DIFFERS:
            raise self.mismatch(pending[2], bad, pf & 1, tail=SETTLED_TAIL.format(call.seq))
        if got == _DIFFER:
            raise self.mismatch(call, bad, parity)
