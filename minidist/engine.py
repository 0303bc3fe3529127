"""Runs a schedule over the transport: posts receives, sends frames, reduces in place."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from . import ops, wire
from .algorithms.schedule import Copy, Recv, Reduce, Schedule, Send
from .errors import CollectiveMismatchError, DistTimeoutError, PeerLostError
from .group import Group
from .ops import ReduceOp
from .rendezvous.client import RendezvousClient
from .transport.endpoint import Connection, Endpoint
from .transport.mailbox import Key, Mailbox

log = logging.getLogger("minidist.engine")

FLAG_OBJECT = 1  # a point-to-point frame that carries a pickled object
OBJECT_DTYPE = 255

# seconds a broken connection waits for the rendezvous to say which rank died first
ROOT_CAUSE_GRACE = 0.25


@dataclass(frozen=True, slots=True)
class Call:
    """What one collective call looks like on this rank; frames carry it so that ranks
    that called different things find out from the first frame."""

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

    def describe(self, h: wire.Header | None = None) -> str:
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
        parts.append(f"algorithm#{algo}")
        return f"{name}({', '.join(parts)})"


@dataclass(eq=False)
class _Active:
    call: Call
    keys: list[Key] = field(default_factory=list)
    error: BaseException | None = None


class Engine:
    """Executes collectives for one rank. Runs on the runtime's event loop."""

    def __init__(self, rank: int, endpoint: Endpoint | None, mailbox: Mailbox,
                 client: RendezvousClient | None) -> None:
        self.rank = rank
        self.endpoint = endpoint
        self.mailbox = mailbox
        self.client = client
        self.entered: dict[int, int] = defaultdict(int)
        self.lost: dict[int, str] = {}
        self._active: set[_Active] = set()
        self._aborted: dict[tuple[int, int], str] = {}
        self._p2p_seq: dict[tuple[int, int, int, bool], int] = {}
        mailbox.on_mismatch = self._frame_mismatch

    # ------------------------------------------------------------------ bookkeeping

    def next_seq(self, group: Group) -> int:
        """Number the next collective on ``group`` (called in submission order)."""
        seq = self.entered[group.id]
        self.entered[group.id] = seq + 1
        return seq

    def next_p2p_seq(self, group: Group, peer: int, tag: int, sending: bool) -> int:
        """Number the next message to (or from) ``peer`` with ``tag`` on ``group``."""
        key = (group.id, peer, tag, sending)
        seq = self._p2p_seq.get(key, 0)
        self._p2p_seq[key] = seq + 1
        return seq

    def _give_back_p2p_seq(self, p) -> None:
        """An abandoned receive does not consume the next message: if it was the last
        one numbered on its (peer, tag), its number goes to the next receive."""
        key = (p.group.id, p.peer, p.tag, False)
        if self._p2p_seq.get(key) == p.seq + 1:
            self._p2p_seq[key] = p.seq

    def send_p2p_now(self, p, loop: asyncio.AbstractEventLoop) -> bool:
        """From the caller's thread: write a small message to a peer already connected
        over a Unix socket, without the loop. False (nothing written): use
        :meth:`send_p2p`."""
        conn = self._direct(p.peer)
        return conn is not None and conn.send_now(loop, *self._p2p_frame(p))

    def _direct(self, dst: int) -> Connection | None:
        """The connection a frame to ``dst`` may be written on from the caller's thread:
        open, over a Unix socket, to a peer not lost."""
        conn = None if self.endpoint is None else self.endpoint.connected(dst)
        return conn if conn is not None and conn.unix and dst not in self.lost else None

    def _p2p_frame(self, p) -> tuple[bytes, memoryview | None]:
        nbytes = p.flat.nbytes
        header = wire.encode_header(wire.Header(
            wire.Kind.P2P, OBJECT_DTYPE if p.is_object else ops.dtype_code(p.flat.dtype), 0,
            0, p.group.id, p.seq, self.rank, -1, p.tag, p.shape, p.flat.size, nbytes,
            FLAG_OBJECT if p.is_object else 0))
        return header, _bytes(p.flat) if nbytes else None

    async def send_p2p(self, p, timeout: float) -> None:
        """Send one point-to-point message (done once the kernel has taken it)."""
        if p.peer in self.lost:
            raise PeerLostError(f"send to rank {p.peer}: it was lost earlier "
                                f"({self.lost[p.peer]})", ranks=[p.peer])
        try:
            async with asyncio.timeout(timeout):
                await self.endpoint.send(p.peer, *self._p2p_frame(p))
        except TimeoutError:
            raise DistTimeoutError(f"send to rank {p.peer} (tag {p.tag}) did not finish "
                                   f"within {timeout:g} s", collective="send",
                                   group=p.group, missing=[p.peer]) from None

    async def recv_p2p(self, p, timeout: float) -> bytes | None:
        """Receive one point-to-point message into ``p.flat`` (or, for an object, return
        its bytes). CollectiveMismatchError, with the buffer untouched, if the message
        does not fit."""
        key = (p.peer, p.group.id, p.seq, p.tag, True)
        me = self.rank

        def check(h: wire.Header) -> Exception | None:
            obj = bool(h.flags & FLAG_OBJECT)
            if obj != p.is_object:
                return CollectiveMismatchError(
                    f"recv on rank {me} from rank {h.src} (tag {p.tag}): rank {h.src} sent "
                    f"{'an object' if obj else 'an array'} but this rank expects "
                    f"{'an object' if p.is_object else 'an array'}")
            if obj or (h.dtype == ops.dtype_code(p.flat.dtype) and h.count == p.flat.size
                       and h.shape == p.shape):
                return None
            theirs = Call(wire.Kind.P2P, p.group, p.seq, h.dtype, 0, 0, "", -1, h.count,
                          h.shape)
            return CollectiveMismatchError(
                f"recv on rank {me} from rank {h.src} (tag {p.tag}): the message does not "
                f"fit the buffer: sent {theirs.describe(h)[4:]}, buffer is "
                f"count={p.flat.size}, dtype={p.flat.dtype} (shape digest "
                f"{'differs' if h.shape != p.shape else 'equal'}); the buffer is unchanged")

        view = None if p.flat is None else _bytes(p.flat)
        fut = self.mailbox.post(key, view, check)
        try:
            async with asyncio.timeout(timeout):
                result = await fut
        except TimeoutError:
            self.mailbox.cancel(key)
            self._give_back_p2p_seq(p)
            raise DistTimeoutError(f"recv on rank {me} from rank {p.peer} (tag {p.tag}) "
                                   f"timed out after {timeout:g} s: no matching send",
                                   collective="recv", group=p.group,
                                   missing=[p.peer]) from None
        except BaseException:
            self.mailbox.cancel(key)
            raise
        return result[1] if view is None else None

    def peer_lost(self, rank: int, reason: str) -> None:
        """The rendezvous says ``rank`` is gone: fail everything that needs it."""
        if rank < 0:
            exc = PeerLostError(f"rank {self.rank} lost the rendezvous: {reason}")
            for a in list(self._active):
                self._fail(a, exc)
            return
        self.lost[rank] = reason
        exc = PeerLostError(f"rank {rank} was lost: {reason}", ranks=[rank])
        # a lost rank's own error also names it; receives from it can never complete
        self.mailbox.peer_dead(rank, exc)
        for a in list(self._active):
            if rank in a.call.group:
                self._fail(a, PeerLostError(
                    f"{a.call.kind.name.lower()} on {a.call.group!r} failed on rank "
                    f"{self.rank}: rank {rank} was lost ({reason})", ranks=[rank],
                    collective=a.call.kind.name.lower(), group=a.call.group))

    def connection_lost(self, rank: int, reason: str) -> None:
        """A direct connection to ``rank`` broke: receives from it can never complete.

        The error waits a moment for the rendezvous' news, so that it can name the rank
        that was lost first (the root cause) when ``rank`` only left because of it.
        """
        asyncio.get_running_loop().call_later(ROOT_CAUSE_GRACE, self._connection_gone, rank,
                                              reason)

    def _connection_gone(self, rank: int, reason: str) -> None:
        if rank in self.lost:
            return  # already failed with the rendezvous' reason
        earlier = {r: why for r, why in self.lost.items() if r != rank}
        msg = f"rank {rank} was lost (connection: {reason})"
        if earlier:
            msg += "; before it, " + "; ".join(f"rank {r} was lost ({why})"
                                               for r, why in sorted(earlier.items()))
        self.mailbox.peer_dead(rank, PeerLostError(msg, ranks=[rank, *earlier]))

    def abort_received(self, body: dict) -> None:
        key = (body["group"], body["seq"])
        reason = body["reason"]
        for a in list(self._active):
            if (a.call.group.id, a.call.seq) == key:
                self._fail(a, CollectiveMismatchError(reason))
                return
        self._aborted[key] = reason

    def _frame_mismatch(self, group: int, seq: int, err: Exception) -> None:
        """A frame of a running collective, not yet asked for, does not fit the call."""
        for a in list(self._active):
            if (a.call.group.id, a.call.seq) == (group, seq) and a.error is None:
                self._broadcast_abort(a.call, str(err))
                self._fail(a, err)

    def _fail(self, a: _Active, exc: BaseException) -> None:
        if a.error is None:
            a.error = exc
        self.mailbox.fail_group(a.call.group.id, a.call.seq, exc)

    # ------------------------------------------------------------------ execution

    def send_first(self, call: Call, schedule: Schedule, bufs: dict[str, np.ndarray],
                   loop: asyncio.AbstractEventLoop) -> frozenset[int]:
        """From the caller's thread, before :meth:`run`: write the first step's small
        frames to peers already connected over Unix sockets, so that they need not wait
        for the loop to wake up. Returns the indexes (in the first step's comms) of the
        sends done; :meth:`run` skips them."""
        if not schedule.steps:
            return frozenset()
        ranks = call.group.ranks
        itemsize = next(iter(bufs.values())).itemsize
        done = []
        for i, c in enumerate(schedule.steps[0].comms):
            if isinstance(c, Send):
                conn = self._direct(ranks[c.peer])
                frame = None if conn is None else self._frame(call, c, bufs, itemsize)
                if frame is not None and conn.send_now(loop, *frame):
                    done.append(i)
        return frozenset(done)

    async def run(self, call: Call, schedule: Schedule, bufs: dict[str, np.ndarray],
                  op: ReduceOp, timeout: float, sent: frozenset[int] = frozenset()) -> None:
        """Execute ``schedule`` on ``bufs`` (flat arrays by name), with a deadline;
        ``sent``: the first step's sends that :meth:`send_first` did."""
        group = call.group
        lost = [r for r in group.ranks if r in self.lost]
        if lost:
            raise PeerLostError(f"{call.kind.name.lower()} on {group!r}: rank(s) {lost} "
                                f"were lost earlier ({self.lost[lost[0]]})", ranks=lost,
                                collective=call.kind.name.lower(), group=group)
        reason = self._aborted.pop((group.id, call.seq), None)
        if reason is not None:
            raise CollectiveMismatchError(reason)
        active = _Active(call)
        self._active.add(active)
        waiting: set[int] = set()
        try:
            early = self.mailbox.expect(group.id, call.seq, self._checker(call, -1))
            if early is not None:
                raise early
            async with asyncio.timeout(timeout):
                await self._execute(active, schedule, bufs, op, waiting, sent)
        except TimeoutError:
            raise await self._timeout_error(call, timeout, waiting) from None
        except CollectiveMismatchError as e:
            if active.error is None:  # found here: tell the others
                self._broadcast_abort(call, str(e))
            raise
        finally:
            self.mailbox.unexpect(group.id, call.seq)
            self._active.discard(active)
            for key in active.keys:
                self.mailbox.cancel(key)
            if active.error is not None:
                self.mailbox.drop_early(group.id, call.seq)

    async def _execute(self, active: _Active, schedule: Schedule, bufs: dict[str, np.ndarray],
                       op: ReduceOp, waiting: set[int], sent: frozenset[int]) -> None:
        call = active.call
        ranks = call.group.ranks
        itemsize = next(iter(bufs.values())).itemsize
        for step in schedule.steps:
            if active.error is not None:
                raise active.error
            recvs = []
            sends = []
            for i, c in enumerate(step.comms):
                src = ranks[c.peer]
                if isinstance(c, Recv):
                    key = (src, call.group.id, call.seq, c.tag, False)
                    view = _bytes(bufs[c.buf][c.lo:c.hi])
                    active.keys.append(key)
                    recvs.append((src, self.mailbox.post(
                        key, view, self._checker(call, (c.hi - c.lo) * itemsize))))
                elif i not in sent:
                    sends.append(c)
            sent = frozenset()  # only the first step's
            for s in sends:
                await self._send(call, ranks[s.peer], s, bufs, itemsize)
            for src, fut in recvs:
                waiting.add(src)
                await fut
                waiting.discard(src)
            active.keys.clear()
            for c in step.compute:
                if isinstance(c, Reduce):
                    ops.reduce_into(op, bufs[c.dst][c.dst_lo:c.dst_lo + c.n],
                                    bufs[c.a][c.a_lo:c.a_lo + c.n],
                                    bufs[c.b][c.b_lo:c.b_lo + c.n])
                elif isinstance(c, Copy):
                    np.copyto(bufs[c.dst][c.dst_lo:c.dst_lo + c.n],
                              bufs[c.src][c.src_lo:c.src_lo + c.n])

    async def _send(self, call: Call, dst: int, s: Send, bufs: dict[str, np.ndarray],
                    itemsize: int) -> None:
        await self.endpoint.send(dst, *self._frame(call, s, bufs, itemsize))

    def _frame(self, call: Call, s: Send, bufs: dict[str, np.ndarray],
               itemsize: int) -> tuple[bytes, memoryview | None]:
        payload = bufs[s.buf][s.lo:s.hi]
        header = wire.encode_header(wire.Header(
            call.kind, call.dtype, call.op, call.algorithm, call.group.id, call.seq,
            self.rank, call.root, s.tag, call.shape, call.count, payload.size * itemsize))
        return header, _bytes(payload) if payload.size else None

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

    def _broadcast_abort(self, call: Call, reason: str) -> None:
        if self.client is None:
            return
        try:
            self.client.notify({"t": "abort", "ranks": list(call.group.ranks),
                                "group": call.group.id, "seq": call.seq, "reason": reason})
        except Exception as e:  # the job is already failing; the local error still raises
            log.debug("could not broadcast abort: %s", e)

    async def _timeout_error(self, call: Call, timeout: float,
                             waiting: set[int]) -> DistTimeoutError:
        name = call.kind.name.lower()
        missing: list[int] = []
        if self.client is not None:
            try:
                reply = await self.client.request(
                    {"t": "progress", "group": call.group.id, "ranks": list(call.group.ranks)},
                    timeout=5.0)
                entered = reply.body.get("entered", {})
                missing = sorted(r for r in call.group.ranks if r != self.rank and (
                    str(r) not in entered or entered[str(r)] is None
                    or entered[str(r)] <= call.seq))
            except Exception as e:
                log.debug("progress query failed: %s", e)
        detail = (f"ranks that never arrived: {missing}" if missing else
                  f"every rank arrived; still waiting on data from ranks {sorted(waiting)}")
        return DistTimeoutError(
            f"{name} on {call.group!r} (call #{call.seq}) timed out after {timeout:g} s on "
            f"rank {self.rank}; {detail}", collective=name, group=call.group,
            missing=missing or sorted(waiting))


def _bytes(a: np.ndarray) -> memoryview:
    return memoryview(a).cast("B")
