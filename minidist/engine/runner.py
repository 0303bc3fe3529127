"""Runs a collective's schedule: the first sends from the caller's thread, then every
step's receives, sends and local work on the loop, traced when MINIDIST_TRACE is on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np

from .. import ops, wire
from ..algorithms.schedule import Recv, Reduce, Schedule, Send, apply_compute
from ..errors import CollectiveMismatchError, DistError, PeerLostError
from ..ops import ReduceOp
from ..plan import Call
from ..tracing import Tracer, flow_id
from .base import (
    FINISHED_KEPT,
    STALL_CHECK,
    Active,
    as_bytes,
)


class Runner:
    """Runs a collective's schedule: the first sends from the caller's thread, then every"""

    def send_first(self, call: Call, schedule: Schedule, bufs: dict[str, np.ndarray],
                   loop: asyncio.AbstractEventLoop) -> frozenset[int]:
        """From the caller's thread, before :meth:`run`: write the first step's small
        frames to peers already connected over Unix sockets, so that they need not wait
        for the loop to wake up. Returns the indexes (in the first step's comms) of the
        sends done; :meth:`run` skips them."""
        if not schedule.steps or call.group.id in self.broken or self.tracer is not None:
            return frozenset()  # (traced: every send on the loop, where it is timed)
        ranks = call.group.ranks
        itemsize = next(iter(bufs.values())).itemsize
        done = []
        for i, c in enumerate(schedule.steps[0].comms):
            if isinstance(c, Send) and c.buf in bufs:  # scratch comes later, on the loop
                conn = self._direct(ranks[c.peer])
                frame = None if conn is None else self._frame(call, c, bufs, itemsize)
                if frame is not None and conn.send_now(loop, *frame):
                    done.append(i)
        return frozenset(done)

    async def run(self, call: Call, schedule: Schedule, bufs: dict[str, np.ndarray],
                  op: ReduceOp, timeout: float, sent: frozenset[int] = frozenset(),
                  prologue: Callable[[], Awaitable[Schedule | None]] | None = None) -> None:
        """Execute ``schedule`` on ``bufs`` (flat arrays by name), with a deadline;
        ``sent``: the first step's sends that :meth:`send_first` did; ``prologue``: what
        must happen first, under the same deadline and checks (a shared-memory set-up),
        which may return the schedule to run instead (every rank of the call must do the
        same: a segment that could not be had).

        On any failure the call raises on this rank, the other ranks of the group hear
        of it (their same call fails too), and the group is unusable afterwards."""
        group = call.group
        key = (group.id, call.seq)
        refused = self.refusal(call)
        if refused is not None:
            self._done(key, None)
            self._break(call, refused, tell=not isinstance(refused, PeerLostError))
            raise refused
        active = self._enter(group, call)
        waiting: set[int] = set()
        ok = False
        stall = None if self.client is None else asyncio.get_running_loop().call_later(
            STALL_CHECK, self.report_stall, call)
        try:
            try:
                early = self.mailbox.expect(group.id, call.seq, self._checker(call, -1))
                if early is not None:
                    raise early
                async with asyncio.timeout(timeout):
                    if self.tracer is None:
                        if prologue is not None:  # it may give a schedule to run instead
                            schedule = await prologue() or schedule
                        await self._execute(active, schedule, bufs, op, waiting, sent)
                    else:
                        await self._execute_traced(self.tracer, active, schedule, bufs, op,
                                                   waiting, prologue)
                ok = True
            except (asyncio.CancelledError, DistError, TimeoutError) as e:
                err = self._outcome(active, e)
                if err is e:
                    raise
                if err is not None:
                    raise err from None
                raise await self.timeout_error(call, timeout, waiting) from None
        except DistError as e:
            self._break(call, e, tell=not active.quiet)
            raise
        finally:
            if stall is not None:
                stall.cancel()
            self._active.discard(active)
            self.mailbox.unexpect(group.id, call.seq)
            for k in active.keys:
                self.mailbox.cancel(k)
            self._done(key, call if ok else None)
            leftover = self.mailbox.drop_early(group.id, call.seq)
            if ok and leftover:  # sent for this call, yet it finished without them
                self._unexpected(leftover[0])

    def _done(self, key: tuple[int, int], call: Call | None) -> None:
        """Remember how a call ended (None: it failed), for frames that come late."""
        self._finished[key] = call
        if len(self._finished) > FINISHED_KEPT:
            self._finished.popitem(last=False)

    async def _execute(self, active: Active, schedule: Schedule, bufs: dict[str, np.ndarray],
                       op: ReduceOp, waiting: set[int], sent: frozenset[int],
                       tr: Tracer | None = None) -> None:
        """Run the schedule's steps. ``tr`` (MINIDIST_TRACE): record every step, send,
        arrival, reduction and copy; None costs one check per step and per message."""
        call = active.call
        group = call.group
        ranks = group.ranks
        itemsize = next(iter(bufs.values())).itemsize

        def combine(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
            ops.reduce_into(op, out, a, b)

        for si, step in enumerate(schedule.steps):
            if active.error is not None:
                raise active.error
            t_step = 0 if tr is None else tr.now()
            arrived: dict[int, int] = {}
            recvs = []
            sends = []
            for i, c in enumerate(step.comms):
                src = ranks[c.peer]
                if isinstance(c, Recv):
                    key = (src, group.id, call.seq, c.tag, False)
                    view = as_bytes(bufs[c.buf][c.lo:c.hi])
                    active.keys.append(key)
                    fut = self.mailbox.post(key, view,
                                            self._checker(call, (c.hi - c.lo) * itemsize))
                    if tr is not None:  # when the data arrived, not when it was awaited
                        j = len(recvs)
                        if fut.done():
                            arrived[j] = t_step
                        else:
                            fut.add_done_callback(
                                lambda _f, j=j, got=arrived, now=tr.now: got.setdefault(j, now()))
                    recvs.append((src, c, fut))
                elif i not in sent:
                    sends.append(c)
            sent = frozenset()  # only the first step's
            for c in sends:
                if tr is None:
                    await self._send(call, ranks[c.peer], c, bufs, itemsize)
                else:
                    await self._send_traced(tr, call, si, c, bufs, itemsize)
            for j, (src, c, fut) in enumerate(recvs):
                waiting.add(src)
                await fut
                waiting.discard(src)
                if tr is not None:
                    _trace_recv(tr, call, si, src, self.rank, c, itemsize,
                                arrived.get(j) or tr.now(), t_step)
            active.keys.clear()
            if step.compute:
                if tr is None:
                    apply_compute(step.compute, bufs, combine)
                else:
                    _compute_traced(tr, call, si, step.compute, bufs, combine, itemsize)
            if tr is not None:
                tr.span(f"step {si}", "step", tr.tid(group), t_step, tr.now(),
                        {"step": si, "sends": len(sends), "recvs": len(recvs),
                         "computes": len(step.compute)})

    async def _execute_traced(self, tr: Tracer, active: Active, schedule: Schedule,
                              bufs: dict[str, np.ndarray], op: ReduceOp, waiting: set[int],
                              prologue: Callable[[], Awaitable[Schedule | None]] | None
                              ) -> None:
        """:meth:`_execute`, recorded (MINIDIST_TRACE), within one slice for the whole
        call and one for a shared-memory set-up."""
        call = active.call
        group = call.group
        calls = tr.tid(group)
        values = next(iter(bufs.values()))
        start = tr.now()
        args: dict = {"collective": call.name, "algorithm": call.algorithm_name,
                      "group": f"{group.id:#x}", "ranks": len(group.ranks), "call": call.seq,
                      "bytes": call.count * values.itemsize, "count": call.count,
                      "dtype": str(values.dtype),
                      "path": "shm segment" if schedule.shared_tmp else "sockets",
                      "steps": len(schedule.steps)}
        if call.root >= 0:
            args["root"] = call.root
        try:
            if prologue is not None:
                schedule = await prologue() or schedule
                tr.span("shm set-up", "setup", calls, start, tr.now(), {"call": call.seq})
            await self._execute(active, schedule, bufs, op, waiting, frozenset(), tr)
        except BaseException as e:
            args["error"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            tr.span(f"{call.name} ({call.algorithm_name})", "collective", calls, start,
                    tr.now(), args)

    async def _send_traced(self, tr: Tracer, call: Call, si: int, s: Send,
                           bufs: dict[str, np.ndarray], itemsize: int) -> None:
        """:meth:`_send`, recorded: a slice from posting until the transport took it,
        and the start of the arrow to the receive."""
        group = call.group
        dst = group.ranks[s.peer]
        sends = tr.tid(group, "sends")
        t0 = tr.now()
        tr.flow(True, flow_id(group.id, call.seq, self.rank, dst, s.tag), sends, t0)
        await self._send(call, dst, s, bufs, itemsize)
        tr.span(f"send to {dst}", "send", sends, t0, tr.now(),
                {"step": si, "peer": dst, "tag": s.tag, "buf": s.buf,
                 "elements": [s.lo, s.hi], "bytes": (s.hi - s.lo) * itemsize,
                 "call": call.seq})

    async def _send(self, call: Call, dst: int, s: Send, bufs: dict[str, np.ndarray],
                    itemsize: int) -> None:
        try:
            await self.endpoint.send(dst, *self._frame(call, s, bufs, itemsize))
        except PeerLostError as e:
            err = await self._explain(dst, e)
            raise PeerLostError(f"{call.name} on {call.group!r} failed on rank {self.rank}: "
                                f"{err}", ranks=err.ranks, collective=call.name,
                                group=call.group, left=err.left) from None

    def _frame(self, call: Call, s: Send, bufs: dict[str, np.ndarray],
               itemsize: int) -> tuple[bytes, memoryview | None]:
        payload = bufs[s.buf][s.lo:s.hi]
        header = wire.encode_header(wire.Header(
            call.kind, call.dtype, call.op, call.algorithm, call.group.id, call.seq,
            self.rank, call.root, s.tag, call.shape, call.count, payload.size * itemsize))
        return header, as_bytes(payload) if payload.size else None

    def _checker(self, call: Call, nbytes: int):
        """A check of a frame's header against this rank's call (and the payload length
        the receive expects; -1 for any)."""
        def check(h: wire.Header) -> Exception | None:
            if (h.kind == call.kind and h.dtype == call.dtype and h.count == call.count
                    and h.root == call.root and h.op == call.op and h.shape == call.shape
                    and h.algorithm == call.algorithm and nbytes in (-1, h.nbytes)):
                return None
            return CollectiveMismatchError(
                f"collective mismatch on {call.group!r} (call #{call.seq}): rank {h.src} "
                f"called {call.describe(h)} where rank {self.rank} called {call.describe()}")
        return check




def _trace_recv(tr: Tracer, call: Call, si: int, src: int, me: int, c: Recv, itemsize: int,
                t: int, t_step: int) -> None:
    """A receive's arrival, and the end of the arrow from its send (MINIDIST_TRACE)."""
    calls = tr.tid(call.group)
    tr.instant(f"recv from {src}", "recv", calls, t,
               {"step": si, "peer": src, "tag": c.tag, "buf": c.buf,
                "elements": [c.lo, c.hi], "bytes": (c.hi - c.lo) * itemsize,
                "waited_us": (t - t_step) / 1e3, "call": call.seq})
    tr.flow(False, flow_id(call.group.id, call.seq, src, me, c.tag), calls, t)


def _compute_traced(tr: Tracer, call: Call, si: int, compute: tuple, bufs: dict,
                    combine: Callable, itemsize: int) -> None:
    """A step's reductions and copies, each recorded as a slice (MINIDIST_TRACE)."""
    calls = tr.tid(call.group)
    for c in compute:
        t0 = tr.now()
        apply_compute((c,), bufs, combine)
        if isinstance(c, Reduce):
            tr.span("reduce", "reduce", calls, t0, tr.now(),
                    {"step": si, "dst": [c.dst, c.dst_lo], "a": [c.a, c.a_lo],
                     "b": [c.b, c.b_lo], "elements": c.n, "bytes": c.n * itemsize})
        else:
            tr.span("copy", "copy", calls, t0, tr.now(),
                    {"step": si, "dst": [c.dst, c.dst_lo], "src": [c.src, c.src_lo],
                     "elements": c.n, "bytes": c.n * itemsize})
