"""Small scatters and gathers that a blocking caller repeats, planned once.

An RL learner scatters actions to its env workers and gathers their observations, the
same two calls with the same arrays, thousands of times a second; on a crowded node
the Python run per call, not the shared memory, is what such a step costs. After a
call took the fast path (:mod:`minidist.fast_rooted`) the blocking API remembers it,
one per kind and thread, as a :class:`Repeat`; the next call with the same group, root,
dtype and shape (and C-contiguous, writable arrays) is numbered and run through
:meth:`minidist.fast_calls.FastCalls.run_rooted` at once, without planning, checking
or preparing it again. The same turns, refusals, deadlines, signature checks and
errors apply: only the work that would give the same answer again is skipped. Any
other call takes the general path, which raises what is wrong with it.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .fast_rooted import signature
from .prepared import FAST_INDEX, Call, Prepared
from .wire import Kind

_local = threading.local()


class Repeat:
    """What a fast scatter or gather ``p`` planned once keeps, made by :func:`remember`;
    ``group`` is the caller's group argument (None: the default group, which is checked
    to be the same group again)."""

    __slots__ = ("door", "group", "g", "root", "kind", "dtype", "out_shape", "in_shape",
                 "code", "count", "digest", "name", "take", "run_rooted", "loop", "planner",
                 "is_root", "key", "scatter")

    def __init__(self, door: Any, p: Prepared, group: object, out_shape: tuple | None,
                 in_shape: tuple | None) -> None:
        call = p.call
        self.door, self.group, self.g, self.root = door, group, call.group, call.root
        self.kind, self.code, self.count = call.kind, call.dtype, call.count
        self.digest, self.name = call.shape, call.algorithm_name
        self.dtype = (p.bufs["in"] if in_shape is not None else p.bufs["out"]).dtype
        self.out_shape, self.in_shape = out_shape, in_shape
        self.is_root = call.root == door.rank
        self.planner = door.plan
        self.take = door.plan.fast_planner.take
        self.run_rooted = door.fast_calls.run_rooted
        self.loop = door.runtime.loop
        self.key = signature(call, call.group.rank_of(call.root))
        self.scatter = call.kind == Kind.SCATTER

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
        g = self.g
        f, seq = self.take(g)
        call = Call(self.kind, g, seq, self.code, 0, FAST_INDEX, self.name, self.root,
                    self.count, self.digest)
        return (call, f, out.reshape(-1) if out is not None else inp[:0],
                inp.reshape(-1) if inp is not None else out[:0])

    def go(self, job: tuple) -> None:
        """Run a call numbered by :meth:`number`, on the caller's thread."""
        call, f, o, i = job
        self.run_rooted(call, f, o, i, self.loop, self.key)

    def again(self, output: object, input: object, root: int, group: object) -> bool:
        """Number and run the call (a scatter's or gather's own arrays, as the blocking
        API takes them) if it is this one again (True); else nothing (False)."""
        if self.scatter:
            out, inp = output, input if self.is_root else None
        else:
            out, inp = output if self.is_root else None, input
        if not self.fits(group, root, out, inp):
            return False
        self.go(self.number(out, inp))
        return True


def again(door: Any, kind: str, output: object, input: object, root: int,
          group: object) -> bool:
    """Run the remembered ``kind`` call (``"scatter"`` or ``"gather"``) on ``door`` if
    this one is it again (True); else nothing (False)."""
    r = getattr(_local, kind, None)
    return r is not None and r.door is door and r.again(output, input, root, group)


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
    setattr(_local, kind, Repeat(door, p, group, out_shape, in_shape))


def _shape(a: object) -> tuple | None:
    """The shape of a C-contiguous numpy array that the fast path used in place."""
    if type(a) is not np.ndarray or not a.flags.c_contiguous:
        return None
    return a.shape


def remembered(kind: str) -> Repeat | None:
    """This thread's remembered ``"scatter"`` or ``"gather"`` (None: none yet)."""
    return getattr(_local, kind, None)
