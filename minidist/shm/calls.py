"""Running fast calls (:mod:`minidist.shm.fast_slots`, :mod:`minidist.shm.rooted_area`) on the
caller's thread, never the loop's.

A group's fast calls run one at a time, in the order they were planned (each takes its
turn by its fast-call number, :attr:`Prepared.fast`). A blocking caller runs its call on
its own thread; a call from the loop (``async_op``, :mod:`minidist.aio`) runs on a
thread of a pool. A call its group's segment has no room for runs over sockets on the
loop instead, as every rank of the group does. This is the per-call path of the fast
path: every Python call here is paid on every fast call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import ops, wire
from ..errors import DistError, DistTimeoutError
from ..prepared import Prepared
from . import fast_slots, rooted_area
from .group_segments import FastSegments

if TYPE_CHECKING:
    from ..runtime import Runtime

POOL_THREADS = 32  # calls from the loop in flight: each waits for its turn on its own


class _FastHooks:
    """What a fast call asks the session while it waits (:class:`fast_slots.Hooks`), from
    the caller's thread; the loop's part is handed to ``loop``."""

    __slots__ = ("calls", "engine", "gone", "loop")

    def __init__(self, calls: FastCalls, loop: asyncio.AbstractEventLoop) -> None:
        self.calls = calls
        self.engine = calls.engine
        self.gone = calls.session.gone  # (group, rank) -> DistError | None
        self.loop = loop

    def broken(self, call) -> DistError | None:
        return self.engine.refusal(call, consume=False)

    def anyone_gone(self) -> bool:
        engine = self.engine
        return bool(engine.lost or engine.left or engine.died)

    def stalled(self, call) -> None:
        self.loop.call_soon_threadsafe(self.engine.report_stall, call)

    def timed_out(self, call, waiting: list[int]) -> DistError:
        return self.calls.timeout_error(call, waiting, self.loop)


class FastCalls:
    """The fast calls of ``session`` (the :class:`~minidist.session.Session` they are
    part of, which imports this module); ``segments`` sets up their groups' segments."""

    def __init__(self, session: Any, segments: FastSegments) -> None:
        self.session = session
        self.segments = segments
        self.engine = session.engine
        self.plan = session.plan
        self.rank = session.rank
        # read per call, so kept here: the same dict and method as the session's
        self.timeout_of = session.timeout_of
        self.slots = segments.slots
        self._fits = segments.fits
        self.turns: dict[int, int] = {}  # per group: the fast call whose turn it is
        self._cond = threading.Condition(threading.Lock())
        self.waiting = 0  # threads waiting for their fast call's turn (see turn_done)
        self._hooks: _FastHooks | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def blocking(self, p: Prepared, runtime: Runtime) -> None:
        """A fast call from a blocking caller: set up on the loop if needed, then run on
        the caller's thread."""
        if p.call.group.id not in self.slots:
            try:
                runtime.call(self.segments.setup(p))
            except DistError as e:
                runtime.loop.call_soon_threadsafe(self.engine.fast_failed, p.call, e)
                raise
        if self.engine.tracer is None:
            self.run(p, runtime.loop)
        else:
            self.run_traced(p, runtime.loop)

    async def on_loop(self, p: Prepared) -> None:
        """A fast call from the loop: set up on the loop if needed, then run on a thread
        of this session's pool."""
        try:
            await self.segments.setup(p)
        except DistError as e:
            self.engine.fast_failed(p.call, e)
            raise
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                POOL_THREADS, thread_name_prefix="minidist-fast")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self.run if self.engine.tracer is None
                                   else self.run_traced, p, loop)

    def run(self, p: Prepared, loop: asyncio.AbstractEventLoop) -> None:
        """Run a fast call on this thread (never the loop's): the group's fast calls run
        one at a time, in the order they were planned."""
        call = p.call
        g = call.group
        engine = self.engine
        deadline, hooks = self._begin(call, p.fast, loop)
        try:
            refused = engine.refusal(call, consume=False)
            if refused is not None:
                raise refused
            out = p.bufs["out"]
            if call.kind == wire.Kind.BROADCAST:
                src = out if call.root == self.rank else out[:0]
            elif call.kind == wire.Kind.ALL_REDUCE or call.kind in rooted_area.KINDS:
                src = p.bufs["in"]
            else:
                src = out[:0]
            slots = self.slots[g.id]
            if slots is not None and (out.nbytes <= fast_slots.SLOT_BYTES and not p.reads
                                      or self._fits(p)):  # (small calls: at once)
                slots.run(p.fast, call, out, src, p.op, deadline, hooks, p.reads)
            else:  # no shared memory for it: over sockets, on the loop
                asyncio.run_coroutine_threadsafe(self.instead(p), loop).result()
            if p.finish:
                ops.finish(p.op, out, g.size)
            if p.user is not None:
                np.copyto(p.user, out.reshape(p.user.shape))
        except DistError as e:
            self.failed(call, e, loop)
            raise
        finally:
            self.turn_done(g.id, p.fast + p.fast_numbers)

    def _begin(self, call, f: int, loop: asyncio.AbstractEventLoop) -> tuple:
        """(deadline, hooks) of fast call ``f`` once it is its turn on its group (an
        earlier call on the group may still run on another thread)."""
        deadline = time.monotonic() + self.timeout_of(call.group)
        if self.turns.get(call.group.id, 0) != f:
            self._wait_turn(call, f, deadline)
        return deadline, self.hooks(loop)

    def _wait_turn(self, call, f: int, deadline: float) -> None:
        """Until it is fast call ``f``'s turn on its group (DistTimeoutError at the
        deadline)."""
        g, turns = call.group, self.turns
        with self._cond:
            self.waiting += 1
            try:
                ok = self._cond.wait_for(lambda: turns.get(g.id, 0) == f,
                                         max(0.0, deadline - time.monotonic()))
            finally:
                self.waiting -= 1
        if not ok:
            raise DistTimeoutError(f"{call.name} on {g!r} (call #{call.seq}) timed out "
                                   "behind this rank's earlier calls on the group",
                                   collective=call.name, group=g)

    def run_rooted(self, call, f: int, out: np.ndarray, src: np.ndarray,
                   loop: asyncio.AbstractEventLoop, key: bytes | None = None) -> None:
        """:meth:`run` for a scatter or gather planned once (:mod:`minidist.shm.repeat`)
        on a group whose segment has its rooted area: the same turn, refusal, deadline
        and error handling, without a :class:`Prepared` (``key``: its signature)."""
        g = call.group
        deadline, hooks = self._begin(call, f, loop)
        try:
            refused = self.engine.refusal(call, consume=False)
            if refused is not None:
                raise refused
            self.slots[g.id].rooted.run(f, call, out, src, deadline, hooks, key)
        except DistError as e:
            self.failed(call, e, loop)
            raise
        finally:
            self.turn_done(g.id, f + 1)

    def hooks(self, loop: asyncio.AbstractEventLoop) -> _FastHooks:
        """What a fast call of this thread asks the session while it waits."""
        hooks = self._hooks
        if hooks is None or hooks.loop is not loop:
            hooks = self._hooks = _FastHooks(self, loop)
        return hooks

    def failed(self, call, exc: DistError, loop: asyncio.AbstractEventLoop) -> None:
        """A fast call failed on this rank: its group is unusable (on the loop)."""
        loop.call_soon_threadsafe(self.engine.fast_failed, call, exc)

    def turn_done(self, gid: int, turn: int) -> None:
        """A fast call of group ``gid`` ended: the next one's turn is ``turn``."""
        # the turn is stored before the count of waiters is read, and a waiter counts
        # itself before it reads the turn: one of them sees the other
        self.turns[gid] = turn
        if self.waiting:
            with self._cond:
                self._cond.notify_all()

    def repeatable(self, p: Prepared) -> bool:
        """Whether a call like ``p`` (a scatter or gather that ran on the fast path) may
        be planned once and run by :meth:`run_rooted` from now on: its group's segment
        has the rooted area and nothing is traced."""
        return (p.call.kind in rooted_area.KINDS and self.engine.tracer is None
                and self.slots.get(p.call.group.id) is not None)

    def run_traced(self, p: Prepared, loop: asyncio.AbstractEventLoop) -> None:
        """:meth:`run`, recorded as one slice (MINIDIST_TRACE)."""
        tr = self.engine.tracer
        call = p.call
        start = tr.now()
        args = {"collective": call.name, "algorithm": call.algorithm_name,
                "group": f"{call.group.id:#x}", "ranks": call.group.size, "call": call.seq,
                "bytes": call.count * p.bufs["out"].itemsize, "count": call.count,
                "dtype": str(p.bufs["out"].dtype), "path": "fast path"}
        if call.root >= 0:
            args["root"] = call.root
        try:
            self.run(p, loop)
        except BaseException as e:
            args["error"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            tr.span(f"{call.name} ({call.algorithm_name})", "collective", tr.tid(call.group),
                    start, tr.now(), args)

    async def instead(self, p: Prepared) -> None:
        """Run fast call ``p`` over sockets, as the socket path would have (every rank of
        its group does, see :meth:`FastSegments.fits`); on the loop."""
        sched = self.plan.socket_schedule(p.call, p.bufs)
        scratch = self.session.scratch
        p.bufs["tmp"] = scratch.take(p.bufs["out"].dtype, sched.tmp_size)
        try:
            await self.engine.run(p.call, sched, p.bufs, p.op, self.timeout_of(p.call.group))
        finally:
            scratch.give(p.bufs.pop("tmp", None))

    def timeout_error(self, call, waiting: list[int],
                      loop: asyncio.AbstractEventLoop) -> DistError:
        """The error of a fast call past its deadline, as the loop's calls make it (the
        rendezvous says which ranks never arrived); from the caller's thread."""
        timeout = self.timeout_of(call.group)
        try:
            return asyncio.run_coroutine_threadsafe(
                self.engine.timeout_error(call, timeout, set(waiting)), loop).result(10)
        except Exception:  # noqa: BLE001 - the loop is gone: say what this rank saw
            return DistTimeoutError(
                f"{call.name} on {call.group!r} (call #{call.seq}) timed out after "
                f"{timeout:g} s on rank {self.rank}; still waiting on ranks {waiting}",
                collective=call.name, group=call.group, missing=waiting)

    def close(self) -> None:
        """Stop the pool's threads (calls not yet started are cancelled)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
