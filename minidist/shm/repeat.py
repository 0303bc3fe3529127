"""Small scatters and gathers that a blocking caller repeats, planned once.

An RL learner scatters actions to its env workers and gathers their observations, the
same two calls with the same arrays, thousands of times a second; on a crowded node
the Python run per call, not the shared memory, is what such a step costs (a rank's
caches are cold after every switch, so each Python call of a layer costs microseconds).
After a call took the fast path (:mod:`minidist.shm.rooted_area`) the blocking API
remembers it, one per kind and thread, as a :class:`Repeat`; the next call with the
same group, root, dtype and shape (and C-contiguous, writable arrays) is numbered at
once and, when nothing is unusual, runs its role of the rooted area
(:meth:`~minidist.shm.rooted_area.Rooted.scatter_recv` and the others) straight from here,
with views of its pieces typed and shaped like the caller's arrays, made once. Anything
unusual (another call's turn, an error or abort known on this rank, an earlier call that
ended early, an area still being read, a scatter not yet settled) sends the numbered
call through :meth:`minidist.shm.calls.FastCalls.run_rooted`, the general run, which
waits or raises as any fast call does. The same turns, refusals, deadlines, signature
checks and errors apply: only the work that would give the same answer again is
skipped. Any other call takes the general path, which raises what is wrong with it.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import numpy as np

from ..errors import DistError
from ..prepared import FAST_INDEX, Call, Prepared
from ..wire import Kind
from . import core
from .fast_slots import SLICE
from .rooted_area import signature

here = threading.local()  # this thread's remembered calls: .scatter, .gather
_all: weakref.WeakSet = weakref.WeakSet()  # every Repeat made, to forget at close
_GONE = object()  # the door of a Repeat forgotten: no door is it
_DIFFER, _WAIT_MORE = 1, 2  # minidist.shm._core's answers
_STEP = getattr(core.compiled, "Step", None)  # a worker's call in one C call (None: none)


class Repeat:
    """What a fast scatter or gather ``p`` planned once keeps, made by :func:`remember`;
    ``group`` is the caller's group argument (None: the default group, which is checked
    to be the same group again)."""

    __slots__ = ("door", "group", "g", "gid", "root", "kind", "dtype", "out_shape",
                 "in_shape", "code", "count", "digest", "name", "take", "calls", "loop",
                 "planner", "is_root", "key", "scatter", "fast", "rooted", "heads",
                 "rows", "mine", "engine", "turns", "timeout", "groot", "hooks", "slots",
                 "core", "nb", "nap", "step", "__weakref__")

    def __init__(self, door: Any, p: Prepared, group: object, out_shape: tuple | None,
                 in_shape: tuple | None) -> None:
        call = p.call
        self.door, self.group, self.g, self.root = door, group, call.group, call.root
        self.gid = call.group.id
        self.kind, self.code, self.count = call.kind, call.dtype, call.count
        self.digest, self.name = call.shape, call.algorithm_name
        self.dtype = (p.bufs["in"] if in_shape is not None else p.bufs["out"]).dtype
        self.out_shape, self.in_shape = out_shape, in_shape
        self.is_root = call.root == door.rank
        self.planner = door.plan
        self.take = door.plan.fast_planner.take
        self.calls = door.fast_calls
        self.engine = door.fast_calls.engine
        self.turns = door.fast_calls.turns
        self.timeout = door.fast_calls.timeout_of(call.group)  # (a group's is fixed)
        self.loop = door.runtime.loop
        self.hooks = door.fast_calls.hooks(self.loop)
        self.slots = door.fast_calls.slots  # (this group's entry goes at close)
        root = call.group.rank_of(call.root)
        self.key = signature(call, root)
        self.scatter = call.kind == Kind.SCATTER
        self.fast = self.slots[self.gid]
        self.rooted = rooted = self.fast.rooted
        self.groot = root  # the root's group rank
        self.heads, self.rows, self.mine = self._views(rooted, root)
        self.core = rooted.core  # the compiled core's area (None: the pure core runs it)
        self.nb = self.count * self.dtype.itemsize
        self.nap = min(SLICE, self.timeout)
        self.step = self._compiled_step(door)
        _all.add(self)

    def _compiled_step(self, door: Any) -> Any:
        """The call as the compiled core's :class:`minidist.shm._core.Step` (its checks,
        numbering, unusual cases and role in one C call; a root's step has its two
        arrays' shapes and makes the call its scatter leaves pending); None on the pure
        core, or if the planner does not number calls as that step does."""
        planner = self.planner.fast_planner
        if _STEP is None or self.core is None or \
                not planner.numbers_calls_by(self.engine.next_seq):
            return None
        if self.is_root:
            first, extra = self.out_shape, ((self.in_shape, self._call),)
        else:
            first, extra = self.out_shape if self.scatter else self.in_shape, ()
        step = _STEP(self.core, self.scatter, self.scatter or self.is_root, self.root,
                     self.nb, self.nap, self.kind, self.group, self.g, self.planner,
                     np.ndarray, self.dtype, first, self.key, self.groot, self.gid,
                     planner.numbers, self.engine.entered, self.turns, self.engine,
                     self.fast, self.rooted, self.slots, self.calls, *extra)
        step.failed = _told(weakref.ref(self))
        return step

    def _views(self, rooted: Any, root: int) -> tuple:
        """Per parity: (the root's header, this rank's header) offsets, every rank's
        piece typed ``(size, count)``, and this rank's piece typed and shaped like the
        caller's array of it."""
        dt, count = self.dtype, self.count
        mine_shape = self.out_shape if self.scatter else self.in_shape
        heads, rows, mine = [], [], []
        for head, at, r, m in rooted.layout(self.kind, root, count * dt.itemsize):
            heads.append((head, at))
            rows.append(r.view(dt).reshape(rooted.size, count))
            mine.append(m.view(dt).reshape(mine_shape))
        return heads, rows, mine

    def fits(self, group: object, root: int, out: object, inp: object) -> bool:
        """Whether a call with these arguments is this one again."""
        if group is not self.group or root != self.root or (
                group is None and self.planner.default is not self.g):
            return False
        if self.out_shape is not None:
            if type(out) is not np.ndarray or out.dtype is not self.dtype or \
                    out.shape != self.out_shape:
                return False
            flags = out.flags
            if not (flags.c_contiguous and flags.writeable):
                return False
        if self.in_shape is not None:
            if type(inp) is not np.ndarray or inp.dtype is not self.dtype or \
                    inp.shape != self.in_shape or not inp.flags.c_contiguous:
                return False
        return True

    def number(self, out: np.ndarray | None, inp: np.ndarray | None) -> tuple:
        """The call again, numbered (to run by :meth:`go`, in the order numbered)."""
        f, seq = self.take(self.g)
        return f, seq, out, inp

    def go(self, job: tuple) -> None:
        """Run a call numbered by :meth:`number`, on the caller's thread: its role of
        the rooted area straight away when nothing is unusual, else the general run."""
        f, seq, out, inp = job
        rooted = self.rooted
        if self._unusual(f):
            self._general(self._call(seq), f, out, inp)
            return
        call = self._call(seq)
        parity = f & 1
        last = rooted.last[parity]
        rooted.behind = None
        head, at = self.heads[parity]
        try:
            if last is not None and not rooted.reused(last, self.kind, self.groot):
                rooted.wait_reused(last, self.kind, self.groot, (
                    time.monotonic() + self.timeout, self.hooks, call))
            rooted.last[parity] = (f, self.kind, self.groot)
            if self.scatter:
                if self.is_root:
                    rooted.scatter_root(f, head, self.key, call, self.rows[parity],
                                        inp.reshape(rooted.size, self.count), out,
                                        self.mine[parity])
                else:
                    rooted.scatter_recv(f, head, at, self.groot, self.key,
                                        time.monotonic() + self.timeout,
                                        self.hooks, call, out, self.mine[parity])
            elif self.is_root:
                rooted.gather_root(f, head, self.key, time.monotonic() + self.timeout,
                                   self.hooks, call, self.mine[parity], inp,
                                   out.reshape(rooted.size, self.count), self.rows[parity])
            else:
                rooted.gather_send(f, head, at, self.groot, self.key, call, self.mine[parity],
                                   inp)
        except BaseException as e:  # whatever ends a call early: this rank is done here
            self._failed(call, e, f)
            raise
        self.calls.turn_done(self.gid, f + 1)

    def _unusual(self, f: int) -> bool:
        """Whether fast call ``f`` must take the general run: another call's turn, an
        error or abort known on this rank, an earlier call that ended early, a scatter
        not yet settled (on its root, before another scatter; on any other rank), the
        group's segment gone."""
        return (self.turns.get(self.gid, 0) != f or self.engine.may_refuse()
                or self.fast.gave_up is not None
                or (self.rooted.pending is not None and (self.scatter or not self.is_root))
                or self.slots.get(self.gid) is not self.fast)

    def _call(self, seq: int) -> Call:
        """The call numbered ``seq`` (what errors and the general run name)."""
        return tuple.__new__(Call, (self.kind, self.g, seq, self.code, 0, FAST_INDEX,
                                    self.name, self.root, self.count, self.digest))

    def _worker(self, f: int, seq: int, out: np.ndarray | None,
                inp: np.ndarray | None) -> None:
        """:meth:`go` on a rank that is not the root, by the compiled core: the role in
        one call into it (a scatter's receive, a gather's send), the same steps as
        :meth:`~minidist.shm.rooted_area.Rooted.scatter_recv` and
        :meth:`~minidist.shm.rooted_area.Rooted.gather_send`; a wait past a slice, an area
        still being read or a mismatch go through those (the general steps)."""
        rooted, parity, kind, groot = self.rooted, f & 1, self.kind, self.groot
        last = rooted.last[parity]
        if last is not None and not rooted.reused(last, kind, groot):
            call = self._call(seq)
            try:
                rooted.wait_reused(last, kind, groot, (
                    time.monotonic() + self.timeout, self.hooks, call))
            except BaseException as e:
                self._failed(call, e, f)
                raise
        rooted.last[parity] = (f, kind, groot)
        try:
            if self.scatter:
                got = self.core.scatter_recv(f, groot, self.key, seq, out, self.nb, self.nap)
            else:
                got = self.core.gather_send(f, groot, self.key, seq, inp, self.nb)
        except BaseException as e:
            self._failed(self._call(seq), e, f)
            raise
        self._finish_worker(f, seq, out, got)

    def _finish_worker(self, f: int, seq: int, out: np.ndarray | None, got: int) -> None:
        """After the compiled core's role answered ``got`` for call ``f`` (numbered
        ``seq``): a scatter's longer wait (WAIT_MORE), the mismatch (DIFFER), and the
        turn of the group's next call."""
        rooted, groot = self.rooted, self.groot
        try:
            if got == _WAIT_MORE:  # the checks of a longer wait, then the rest
                head, _at = self.heads[f & 1]
                got = _DIFFER if rooted.core_scatter_recv(
                    f, head >> 2, groot, self.key,
                    time.monotonic() - self.nap + self.timeout, self.hooks,
                    self._call(seq), out, self.nb) else 0
            rooted.behind = (f, groot)
            if got == _DIFFER:
                raise rooted.mismatch(self._call(seq), groot, f & 1)
        except BaseException as e:
            self._failed(self._call(seq), e, f)
            raise
        self.turns[self.gid] = f + 1
        if self.calls.waiting:
            self.calls.turn_done(self.gid, f + 1)

    def ended(self, f: int, seq: int, e: BaseException) -> None:
        """Call ``f`` (numbered ``seq``) ended early on this rank with ``e``."""
        self._failed(self._call(seq), e, f)

    def _failed(self, call: Call, e: BaseException, f: int) -> None:
        """A call ended early on this rank: it is done here (see :meth:`go`)."""
        self.rooted.gave_up = e
        if isinstance(e, DistError):
            self.calls.failed(call, e, self.loop)
        self.calls.turn_done(self.gid, f + 1)

    def _general(self, call: Call, f: int, out: np.ndarray | None,
                 inp: np.ndarray | None) -> None:
        """The numbered call through the general run (it waits or raises)."""
        o = out.reshape(-1) if out is not None else inp[:0]
        i = inp.reshape(-1) if inp is not None else out[:0]
        self.calls.run_rooted(call, f, o, i, self.loop, self.key)

    def again(self, output: object, input: object, root: int, group: object) -> bool:
        """Number and run the call (a scatter's or gather's own arrays, as the blocking
        API takes them) if it is this one again (True); else nothing (False). This is the
        pure core's way; :func:`again` runs a compiled step itself."""
        if self.scatter:
            out, inp = output, input if self.is_root else None
        else:
            out, inp = output if self.is_root else None, input
        if not self.fits(group, root, out, inp):
            return False
        self.go(self.number(out, inp))
        return True

    def step_on(self, out: np.ndarray, inp: np.ndarray, got: tuple) -> None:
        """The rest of a call its step handed back numbered: a worker's (f, seq, how),
        on through :meth:`worker_run` (how < 0: nothing run yet) or
        :meth:`_finish_worker`; a root's (f, seq, how, bad), :meth:`_root_on`."""
        if self.is_root:
            self._root_on(out, inp, got)
            return
        f, seq, how = got
        arr = out if self.scatter else inp
        if how < 0:
            self.worker_run((f, seq), arr)
        else:
            self._finish_worker(f, seq, arr, how)

    def _root_on(self, out: np.ndarray, inp: np.ndarray,
                 got: tuple[int, int, int, int]) -> None:
        """The rest of a root's call its step handed back numbered: (f, seq, how, bad)
        (how < 0: nothing run yet; else the gather's root's first answer)."""
        f, seq, how, bad = got
        if how < 0:
            self.go((f, seq, out, inp))
            return
        call = self._call(seq)
        rooted = self.rooted
        try:
            rooted.core_gather_root(f, self.heads[f & 1][0], self.key,
                                    time.monotonic() - self.nap + self.timeout, self.hooks,
                                    call, inp, out.reshape(rooted.size, self.count), self.nb,
                                    first=(how, bad))
        except BaseException as e:
            self._failed(call, e, f)
            raise
        self.calls.turn_done(self.gid, f + 1)

    def worker_run(self, job: tuple, arr: np.ndarray) -> None:
        """Run a worker's call its step numbered (``job``: (f, seq)) and handed back
        with nothing run, as :meth:`go` does."""
        f, seq = job
        if self._unusual(f):
            out, inp = (arr, None) if self.scatter else (None, arr)
            self._general(self._call(seq), f, out, inp)
        else:
            self._worker(f, seq, arr, arr)

    def drop(self) -> None:
        """Never run again (its door closed): let go of the segment's views."""
        self.door = _GONE
        if self.step is not None:
            self.step.drop()
        self.rows = self.mine = self.fast = self.rooted = None


def forget(door: Any) -> None:
    """Forget every call remembered on ``door`` (it is closing): their views of its
    segments go, so the segments can be unmapped."""
    for r in list(_all):
        if r.door is door:
            r.drop()


def again(door: Any, kind: str, output: object, input: object, root: int,
          group: object) -> bool:
    """Run the remembered ``kind`` call (``"scatter"`` or ``"gather"``) on ``door`` if
    this one is it again (True); else nothing (False). On the compiled core, this and
    one call into it are all the Python a repeated call runs."""
    r = getattr(here, kind, None)
    if r is None or r.door is not door:
        return False
    step = r.step
    if step is None:
        return r.again(output, input, root, group)
    got = step.run(output, input, root, group)
    if got is None:
        return False
    if got is not True:
        r.step_on(output, input, got)
    return True


def _told(ref: weakref.ref) -> Any:
    """What a :class:`Repeat`'s compiled step tells when a call it numbered raised: the
    call ended early on this rank (:meth:`Repeat._failed`). It holds the Repeat weakly
    (the step is the Repeat's)."""
    def failed(f: int, seq: int, e: BaseException) -> None:
        r = ref()
        if r is not None:
            r.ended(f, seq, e)
    return failed


def remember(door: Any, p: Prepared, group: object, output: object,
             input: object) -> None:
    """After the blocking call ``p`` ran to its end: remember it if it is a scatter or
    gather that took the fast path with the caller's own arrays (no copies)."""
    if p.fast < 0 or p.user is not None or not door.fast_calls.repeatable(p):
        return
    call = p.call
    rooted = call.root == door.rank
    kind = call.kind.name.lower()
    if kind == "scatter":
        out_shape, in_shape = _shape(output), _shape(input) if rooted else None
        if out_shape is None or (rooted and in_shape is None):
            return
    else:
        in_shape, out_shape = _shape(input), _shape(output) if rooted else None
        if in_shape is None or (rooted and out_shape is None):
            return
    setattr(here, kind, Repeat(door, p, group, out_shape, in_shape))


def _shape(a: object) -> tuple | None:
    """The shape of a C-contiguous numpy array that the fast path used in place."""
    if type(a) is not np.ndarray or not a.flags.c_contiguous:
        return None
    return a.shape


def remembered(kind: str) -> Repeat | None:
    """This thread's remembered ``"scatter"`` or ``"gather"`` (None: none yet)."""
    return getattr(here, kind, None)
