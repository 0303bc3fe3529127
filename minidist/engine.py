"""Runs a schedule over the transport: posts receives, sends frames, reduces in place.

The engine is also where this rank keeps what it knows of the others: which ranks died,
which left, whether the rendezvous is still there, and which groups are unusable after
a failed call. Every call it runs is registered while it runs, so that news of a lost
peer, an abort from another rank or a mismatched frame ends it at once, whatever it is
waiting on (a receive, a send, a connection attempt, a shared-memory set-up).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from . import ops, wire
from .algorithms.schedule import Recv, Reduce, Schedule, Send, apply_compute
from .errors import CollectiveMismatchError, DistError, DistTimeoutError, PeerLostError, again
from .group import Group
from .ops import ReduceOp
from .plan import Call
from .tracing import Tracer, flow_id
from .transport.endpoint import Connection, Endpoint
from .transport.mailbox import Key, Mailbox

log = logging.getLogger("minidist.engine")

FLAG_OBJECT = 1  # a point-to-point frame that carries a pickled object
OBJECT_DTYPE = 255
INTERNAL_TAGS = 1 << 31  # point-to-point tags from here up are minidist's own

# seconds a broken connection (or a failed send) waits for the rendezvous to say why
# its peer is gone: left normally, died, or died because another rank died first
NEWS_GRACE = 2.0
FINISHED_KEPT = 4096  # collectives per rank whose outcome is remembered for late frames
# seconds a collective may wait before this rank tells the rendezvous what it called, so
# that ranks stuck in calls that disagree (roots, for one) find out without a frame
STALL_CHECK = 1.0
LEFT = "it called destroy() or its script ended"


class Control(Protocol):
    """What the engine needs from the job's control plane (the rendezvous client): tell
    the other ranks something, and ask a question with a deadline."""

    def notify(self, body: dict[str, Any]) -> None: ...

    async def request(self, body: dict[str, Any], blob: bytes = b"",
                      timeout: float = 300.0) -> Any: ...


def tag_name(tag: int) -> str:
    """A point-to-point tag as users know it (minidist's own tags have no number)."""
    return f"tag {tag}" if tag < INTERNAL_TAGS else "an internal message"


@dataclass(eq=False)
class _Active:
    """A call running on the loop: a collective (``call``) or one message to or from
    ``peer``."""

    group: Group
    call: Call | None = None
    peer: int = -1
    task: asyncio.Task | None = None
    keys: list[Key] = field(default_factory=list)
    error: BaseException | None = None
    quiet: bool = False  # its error came from another rank: do not tell the others again

    def needs(self, rank: int) -> bool:
        return rank in self.group if self.call is not None else rank == self.peer


class Engine:
    """Executes collectives and messages for one rank, on the runtime's event loop
    (except :meth:`next_seq`, :meth:`next_p2p_seq`, :meth:`send_first` and
    :meth:`send_p2p_now`, which the caller's thread runs in call order)."""

    def __init__(self, rank: int, mailbox: Mailbox) -> None:
        self.rank = rank
        self.endpoint: Endpoint | None = None
        self.mailbox = mailbox
        self.client: Control | None = None
        self.entered: dict[int, int] = defaultdict(int)
        self.lost: dict[int, str] = {}  # ranks that died -> why
        self.left: dict[int, str] = {}  # ranks that left normally -> how
        # ranks whose earlier process died and that were started again (minidist.elastic)
        self.died: dict[int, str] = {}  # -> why the last earlier process ended
        self.incarnation_of: dict[int, int] = {}  # -> the current process's incarnation
        self.rendezvous_lost: str | None = None
        self.rendezvous_host: int | None = None  # the rank whose process hosts it, if one
        self.broken: dict[int, DistError] = {}  # group id -> the failure that broke it
        self._active: set[_Active] = set()
        self._cancelled: set[asyncio.Task] = set()
        self._aborted: OrderedDict[tuple[int, int], DistError] = OrderedDict()
        self._finished: OrderedDict[tuple[int, int], Call | None] = OrderedDict()
        self._news: dict[int, asyncio.Future] = {}
        self._p2p_seq: dict[tuple[int, int, int, bool], int] = {}
        # MINIDIST_TRACE: records every collective's steps (minidist.tracing); None: off
        self.tracer: Tracer | None = None
        mailbox.on_mismatch = self._frame_mismatch
        mailbox.on_unexpected = self._unexpected
        # called on the loop before a point-to-point receive or probe waits here
        self.before_receive: Callable[[], None] = lambda: None

    def attach(self, endpoint: Endpoint, control: Control) -> None:
        """Connect the engine to this rank's endpoint and the job's control plane (a
        world of one has neither)."""
        self.endpoint = endpoint
        self.client = control

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

    def _enter(self, group: Group, call: Call | None = None, peer: int = -1) -> _Active:
        a = _Active(group, call, peer, asyncio.current_task())
        self._active.add(a)
        return a

    def _leave(self, a: _Active, exc: BaseException) -> BaseException:
        """The error a call ends with: its own recorded error if the engine interrupted
        it (the interruption undone), else ``exc``."""
        self._active.discard(a)
        if a.error is not None and a.task in self._cancelled:
            self._cancelled.discard(a.task)
            a.task.uncancel()
            return a.error
        if a.error is not None and isinstance(exc, TimeoutError) and \
                not isinstance(exc, DistError):
            return a.error  # its deadline and its failure came together: the failure
        return exc

    def _fail(self, a: _Active, exc: BaseException) -> None:
        """End a running call with ``exc``, whatever it is waiting on."""
        if a.error is not None:
            return
        a.error = exc
        if a.call is not None:
            self.mailbox.fail_group(a.call.group.id, a.call.seq, exc)
        t = a.task
        if t is not None and not t.done() and t is not asyncio.current_task() \
                and t not in self._cancelled:
            self._cancelled.add(t)
            t.cancel()

    # ------------------------------------------------------------------ news of peers

    def peer_lost(self, rank: int, reason: str) -> None:
        """The rendezvous says ``rank`` died (or, for ``rank`` -1, that the rendezvous
        itself is gone): fail everything that needs it, now and later."""
        if rank < 0:
            self._rendezvous_gone(reason)
            return
        if rank in self.lost:
            return
        self.left.pop(rank, None)
        self.lost[rank] = reason
        exc = PeerLostError(f"rank {rank} died ({reason})", ranks=[rank])
        self.mailbox.peer_dead(rank, exc)
        if self.endpoint is not None:
            self.endpoint.forbid(rank, exc)
        self._heard(rank)
        for a in list(self._active):
            if a.call is None and a.peer < 0:
                self._check_anyone(a)
            elif a.needs(rank):
                what = a.call.name if a.call is not None else "send/recv"
                self._fail(a, PeerLostError(
                    f"{what} on {a.group!r} failed on rank {self.rank}: rank {rank} died "
                    f"({reason})", ranks=[rank], collective=what, group=a.group))

    def peers_left(self, ranks: list[int]) -> None:
        """The rendezvous says these ranks left the job normally. Nothing more will come
        from them once what they sent has been read; nobody connects to them again. A
        call that waits on one of them fails; the others go on."""
        for rank in ranks:
            if rank in self.left or rank in self.lost or rank == self.rank:
                continue
            self.left[rank] = LEFT
            exc = PeerLostError(f"rank {rank} left the job ({LEFT})", ranks=[rank],
                                left=True)
            if self.endpoint is not None:
                self.endpoint.forbid(rank, exc)
            if self.endpoint is None or not self.endpoint.has_connection(rank):
                self.mailbox.peer_dead(rank, exc)
            # else: its connection's end, right behind its last frames, says so
            self._heard(rank)
        for a in list(self._active):
            if a.call is None and a.peer < 0:
                self._check_anyone(a)

    def peer_back(self, rank: int, incarnation: int) -> None:
        """``rank`` died and is back as a new process, its ``incarnation`` (the
        rendezvous admitted it again): it may be talked to again; messages to and from it
        are numbered afresh. Groups made before, with its earlier process, stay refused
        (see :meth:`stale`)."""
        self.died[rank] = self.lost.get(rank) or self.left.get(rank) or "it died"
        self.incarnation_of[rank] = incarnation
        self.lost.pop(rank, None)
        self.left.pop(rank, None)
        self._news.pop(rank, None)
        self.mailbox.revive(rank)
        for key in [k for k in self._p2p_seq if k[1] == rank]:
            del self._p2p_seq[key]

    def stale(self, g: Group) -> list[int]:
        """The members of ``g`` whose process, the one ``g`` was made with, died (they
        were restarted since: ``g`` can never run again)."""
        incs = g.incarnations
        return [r for i, r in enumerate(g.ranks) if r in self.died
                and (incs[i] if incs else 0) != self.incarnation_of.get(r, 0)]

    def _rendezvous_gone(self, reason: str) -> None:
        if self.rendezvous_lost is not None:
            return
        self.rendezvous_lost = reason
        for fut in self._news.values():
            if not fut.done():
                fut.set_result(None)
        for a in list(self._active):
            self._fail(a, self._no_rendezvous(a.call.name if a.call is not None
                                              else "send/recv"))

    def _no_rendezvous(self, what: str) -> PeerLostError:
        host = self.rendezvous_host
        if host is not None and host != self.rank:
            return PeerLostError(f"{what} on rank {self.rank} failed: rank {host}, whose "
                                 f"process hosts the rendezvous, is gone "
                                 f"({self.rendezvous_lost})", ranks=[host])
        return PeerLostError(f"{what} on rank {self.rank} failed: the rendezvous is gone "
                             f"({self.rendezvous_lost}): the launcher or this node's agent "
                             "stopped, and no failure can be told to the job any more")

    def _heard(self, rank: int) -> None:
        fut = self._news.get(rank)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _news_of(self, rank: int) -> asyncio.Future:
        """A future done once the rendezvous has said why ``rank`` is gone, or after
        NEWS_GRACE seconds without a word."""
        fut = self._news.get(rank)
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self._news[rank] = loop.create_future()
            if rank in self.lost or rank in self.left or self.rendezvous_lost is not None:
                fut.set_result(None)
            else:
                timer = loop.call_later(NEWS_GRACE, lambda: fut.done() or fut.set_result(None))
                fut.add_done_callback(lambda _f: timer.cancel())
        return fut

    def connection_lost(self, rank: int, reason: str) -> None:
        """Every connection with ``rank`` ended (all it sent has been read): receives
        from it can never complete. The error waits for the rendezvous' word on why,
        so that it says whether ``rank`` left or died, and names a rank that died first."""
        self._news_of(rank).add_done_callback(lambda _f: self._connection_gone(rank, reason))

    def _gone_error(self, rank: int, detail: str) -> PeerLostError:
        """Why nothing more can come from ``rank``, as far as this rank knows."""
        earlier = {r: why for r, why in self.lost.items() if r != rank}
        if rank in self.lost:
            msg, left = f"rank {rank} died ({self.lost[rank]})", False
        elif rank in self.left:
            msg, left = f"rank {rank} left the job ({self.left[rank]})", True
        elif self.rendezvous_lost is not None:
            return self._no_rendezvous(f"talking to rank {rank}")
        else:
            msg, left = (f"rank {rank} closed its connection ({detail}) and the rendezvous "
                         f"has not said why"), False
        if earlier:
            msg += "; before it, " + "; ".join(f"rank {r} died ({why})"
                                               for r, why in sorted(earlier.items()))
        return PeerLostError(msg, ranks=[rank, *earlier], left=left and not earlier)

    def _connection_gone(self, rank: int, reason: str) -> None:
        exc = self._gone_error(rank, reason)
        self.mailbox.peer_dead(rank, exc)
        if self.endpoint is not None:
            self.endpoint.forbid(rank, exc)
        for a in list(self._active):
            if a.call is None and a.peer < 0:
                self._check_anyone(a)

    async def _explain(self, rank: int, exc: PeerLostError) -> PeerLostError:
        """A send to ``rank`` failed: say why, once the rendezvous has had its word."""
        await asyncio.shield(self._news_of(rank))
        if rank in self.lost or rank in self.left or self.rendezvous_lost is not None:
            return self._gone_error(rank, str(exc))
        return exc

    # ------------------------------------------------------------------ aborts

    def abort_received(self, body: dict) -> None:
        """Another rank's call ``(group, seq)`` failed: the same call fails here, and the
        group is unusable from now on (every later call on it raises at once)."""
        gid, seq = body["group"], body["seq"]
        exc = _abort_error(body)
        log.info("rank %s aborted call #%d of group %#x: %s", body.get("by"), seq, gid,
                 body["reason"])
        self.broken.setdefault(gid, exc)
        for a in list(self._active):
            if a.call is not None and a.call.group.id == gid:
                a.quiet = True
                self._fail(a, exc)
        if (gid, seq) not in self._finished:
            self._aborted[(gid, seq)] = exc
            while len(self._aborted) > FINISHED_KEPT:
                self._aborted.popitem(last=False)

    def _frame_mismatch(self, group: int, seq: int, err: Exception) -> None:
        """A frame of a running collective, not yet asked for, does not fit the call."""
        for a in list(self._active):
            if a.call is not None and (a.call.group.id, a.call.seq) == (group, seq):
                self._fail(a, err)

    def _unexpected(self, h: wire.Header) -> bool:
        """A collective's frame arrived that no running call expects. If its call is
        over here, drop it; had that call succeeded, the ranks disagreed on it (roots,
        algorithms, sizes), and the group is broken on every rank."""
        key = (h.group, h.seq)
        if key not in self._finished:
            return False  # its call has not started yet
        call = self._finished[key]
        if call is not None and call.group.id not in self.broken:
            err = self._checker(call, -1)(h) or CollectiveMismatchError(
                f"collective mismatch on {call.group!r} (call #{call.seq}): rank {h.src} "
                f"sent data for {call.describe(h)} that rank {self.rank} did not need for "
                f"its {call.describe()}")
            self._break(call, err, tell=True)
        return True

    def _break(self, call: Call, exc: DistError, tell: bool) -> None:
        """A call on this rank failed: its group is unusable from now on; the first time,
        with ``tell``, the other ranks of the group hear of it."""
        gid = call.group.id
        if gid in self.broken:
            return
        self.broken[gid] = exc
        if tell:
            self._broadcast_abort(call, exc)

    def fast_failed(self, call: Call, exc: DistError) -> None:
        """A fast call (run on another thread) failed on this rank: as for any call, its
        group is unusable and the other ranks hear of it."""
        self._done((call.group.id, call.seq), None)
        self._break(call, exc, tell=True)

    def _refusal(self, call: Call, consume: bool = True) -> DistError | None:
        """Why a collective cannot even start (or go on), or None. Without ``consume``
        nothing is changed (safe to call from another thread)."""
        g = call.group
        if self.rendezvous_lost is not None:
            return self._no_rendezvous(call.name)
        aborted = (self._aborted.pop if consume else self._aborted.get)((g.id, call.seq), None)
        if aborted is not None:
            return aborted
        broken = self.broken.get(g.id)
        if broken is not None:
            return again(broken, f"{call.name} on {g!r} (call #{call.seq}) refused on rank "
                          f"{self.rank}: the group is unusable since a call on it failed")
        if self.lost:
            lost = [r for r in g.ranks if r in self.lost]
            if lost:
                return PeerLostError(
                    f"{call.name} on {g!r}: rank(s) {lost} died earlier "
                    f"({self.lost[lost[0]]})", ranks=lost, collective=call.name, group=g)
        if self.died:
            stale = self.stale(g)
            if stale:
                return PeerLostError(
                    f"{call.name} on {g!r}: rank(s) {stale} died earlier "
                    f"({self.died[stale[0]]}); the group was made with the process that "
                    "died (make a new group with the restarted rank)", ranks=stale,
                    collective=call.name, group=g)
        return None

    # ------------------------------------------------------------------ point-to-point

    def send_p2p_now(self, p, loop: asyncio.AbstractEventLoop) -> bool:
        """From the caller's thread: write a small message to a peer already connected
        over a Unix socket, without the loop. False (nothing written): use
        :meth:`send_p2p`."""
        conn = self._direct(p.peer)
        return conn is not None and conn.send_now(loop, *self._p2p_frame(p))

    def _direct(self, dst: int) -> Connection | None:
        """The connection a frame to ``dst`` may be written on from the caller's thread:
        open, over a Unix socket, to a peer not gone."""
        conn = None if self.endpoint is None else self.endpoint.connected(dst)
        return conn if conn is not None and conn.unix and dst not in self.lost \
            and dst not in self.left and self.rendezvous_lost is None else None

    def _p2p_frame(self, p) -> tuple[bytes, memoryview | None]:
        nbytes = p.flat.nbytes
        header = wire.encode_header(wire.Header(
            wire.Kind.P2P, OBJECT_DTYPE if p.is_object else ops.dtype_code(p.flat.dtype), 0,
            0, p.group.id, p.seq, self.rank, -1, p.tag, p.shape, p.flat.size, nbytes,
            FLAG_OBJECT if p.is_object else 0))
        return header, _bytes(p.flat) if nbytes else None

    async def send_p2p(self, p, timeout: float) -> None:
        """Send one point-to-point message (done once the kernel has taken it)."""
        if self.rendezvous_lost is not None:
            raise self._no_rendezvous("send")
        a = self._enter(p.group, peer=p.peer)
        try:
            try:
                async with asyncio.timeout(timeout):
                    await self.endpoint.send(p.peer, *self._p2p_frame(p))
            except PeerLostError as e:
                raise await self._explain(p.peer, e) from None
        except asyncio.CancelledError as e:
            err = self._leave(a, e)
            if err is e:
                raise
            raise err from None
        except DistError as e:
            raise self._leave(a, e) from None
        except TimeoutError as e:
            err = self._leave(a, e)
            if err is not e:
                raise err from None
            raise DistTimeoutError(f"send to rank {p.peer} ({tag_name(p.tag)}) did not finish "
                                   f"within {timeout:g} s", collective="send",
                                   group=p.group, missing=[p.peer]) from None
        finally:
            self._active.discard(a)

    def p2p_check(self, p, h: wire.Header) -> Exception | None:
        """The error a receive ``p`` gets for the message with header ``h`` (it does not
        fit), or None."""
        me = self.rank
        obj = bool(h.flags & FLAG_OBJECT)
        if obj != p.is_object:
            return CollectiveMismatchError(
                f"recv on rank {me} from rank {h.src} ({tag_name(p.tag)}): rank {h.src} "
                f"sent {'an object' if obj else 'an array'} but this rank expects "
                f"{'an object' if p.is_object else 'an array'}")
        if obj or (h.dtype == ops.dtype_code(p.flat.dtype) and h.count == p.flat.size
                   and h.shape == p.shape):
            return None
        theirs = Call(wire.Kind.P2P, p.group, p.seq, h.dtype, 0, 0, "", -1, h.count,
                      h.shape)
        return CollectiveMismatchError(
            f"recv on rank {me} from rank {h.src} ({tag_name(p.tag)}): the message does "
            f"not fit the buffer: sent {theirs.describe(h)[4:]}, buffer is "
            f"count={p.flat.size}, dtype={p.flat.dtype} (shape digest "
            f"{'differs' if h.shape != p.shape else 'equal'}); the buffer is unchanged")

    async def recv_p2p(self, p, timeout: float) -> bytes | None:
        """Receive one point-to-point message into ``p.flat`` (or, for an object, return
        its bytes); ``p.source`` is then its sender. ``p.peer`` -1: from any rank of the
        group, the first message to arrive. CollectiveMismatchError, with the buffer
        untouched, if the message does not fit."""
        if self.rendezvous_lost is not None:
            raise self._no_rendezvous("recv")
        self.before_receive()
        me = self.rank
        anyone = p.peer < 0
        where = "any rank" if anyone else f"rank {p.peer}"

        check = functools.partial(self.p2p_check, p)
        view = None if p.flat is None else _bytes(p.flat)
        a = self._enter(p.group, peer=p.peer)
        if anyone:
            gid, tag = p.group.id, p.tag

            def expected(src: int) -> int:
                return self._p2p_seq.get((gid, src, tag, False), 0)

            def taken(src: int) -> None:
                self._p2p_seq[(gid, src, tag, False)] = expected(src) + 1

            fut = self.mailbox.post_any(gid, tag, view, check, expected, taken)
            forget = lambda: self.mailbox.cancel_any(fut)  # noqa: E731
            if not fut.done():
                self._check_anyone(a)
                if a.error is not None:
                    forget()
                    self._active.discard(a)
                    raise a.error
        else:
            key = (p.peer, p.group.id, p.seq, p.tag, True)
            fut = self.mailbox.post(key, view, check)
            forget = lambda: self.mailbox.cancel(key)  # noqa: E731
        try:
            async with asyncio.timeout(timeout):
                result = await fut
        except asyncio.CancelledError as e:
            forget()
            err = self._leave(a, e)
            if err is e:
                raise
            raise err from None
        except DistError as e:
            forget()
            raise self._leave(a, e) from None
        except TimeoutError as e:
            forget()
            err = self._leave(a, e)
            if err is not e:
                raise err from None
            if not anyone:
                self._give_back_p2p_seq(p)
            raise DistTimeoutError(f"recv on rank {me} from {where} ({tag_name(p.tag)}) "
                                   f"timed out after {timeout:g} s: no matching send",
                                   collective="recv", group=p.group,
                                   missing=[] if anyone else [p.peer]) from None
        finally:
            self._active.discard(a)
        header = result if view is not None else result[0]
        p.source = header.src
        return result[1] if view is None else None

    async def probe(self, group: Group, src: int | None, tag: int,
                    timeout: float | None) -> int | None:
        """The sender of the message a receive from ``src`` (None: any rank) with ``tag``
        would take now, without receiving it; with ``timeout`` None, None if none has
        arrived, else wait for one (DistTimeoutError after ``timeout`` seconds)."""
        gid = group.id
        self.before_receive()

        def expected(r: int) -> int:
            return self._p2p_seq.get((gid, r, tag, False), 0)

        h = self.mailbox.peek(gid, tag, src, expected)
        if h is not None or timeout is None:
            return None if h is None else h.src
        try:
            async with asyncio.timeout(timeout):
                while True:
                    if self.rendezvous_lost is not None:
                        raise self._no_rendezvous("probe")
                    if src is not None and self.mailbox.is_dead(src) is not None:
                        raise self.mailbox.is_dead(src)
                    await self.mailbox.next_arrival()
                    h = self.mailbox.peek(gid, tag, src, expected)
                    if h is not None:
                        return h.src
        except TimeoutError:
            raise DistTimeoutError(
                f"probe on rank {self.rank} for a message from "
                f"{'any rank' if src is None else f'rank {src}'} ({tag_name(tag)}) timed "
                f"out after {timeout:g} s", collective="probe", group=group,
                missing=[] if src is None else [src]) from None

    def _check_anyone(self, a: _Active) -> None:
        """A receive from any rank fails once nothing more can come from any other rank
        of its group (each died, or left and what it sent has been read)."""
        others = [r for r in a.group.ranks if r != self.rank]
        if others and all(r in self.lost or self.mailbox.is_dead(r) is not None
                          for r in others):
            self._fail(a, PeerLostError(
                f"recv from any rank on {a.group!r}: every other rank of the group is gone",
                ranks=others, collective="recv", group=a.group,
                left=not any(r in self.lost for r in others)))

    # ------------------------------------------------------------------ collectives

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
        refused = self._refusal(call)
        if refused is not None:
            self._done(key, None)
            self._break(call, refused, tell=not isinstance(refused, PeerLostError))
            raise refused
        active = self._enter(group, call)
        waiting: set[int] = set()
        ok = False
        stall = None if self.client is None else asyncio.get_running_loop().call_later(
            STALL_CHECK, self._report_stall, call)
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
            except asyncio.CancelledError as e:
                err = self._leave(active, e)
                if err is e:
                    raise
                raise err from None
            except DistError as e:
                raise self._leave(active, e) from None
            except TimeoutError as e:
                err = self._leave(active, e)
                if err is not e:
                    raise err from None
                raise await self._timeout_error(call, timeout, waiting) from None
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

    async def _execute(self, active: _Active, schedule: Schedule, bufs: dict[str, np.ndarray],
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
                    view = _bytes(bufs[c.buf][c.lo:c.hi])
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

    async def _execute_traced(self, tr: Tracer, active: _Active, schedule: Schedule,
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

    def _report_stall(self, call: Call) -> None:
        """This call has waited a while: tell the rendezvous what it is, so that it can
        compare it with what the other waiting ranks called under the same number."""
        if self.rendezvous_lost is not None:
            return
        sig = [call.kind, call.dtype, call.op, call.algorithm, call.root, call.count,
               call.shape]
        try:
            self.client.notify({"t": "stalled", "group": call.group.id, "seq": call.seq,
                                "sig": sig, "call": call.describe(),
                                "where": repr(call.group), "ranks": list(call.group.ranks)})
        except Exception as e:
            log.debug("could not report a stalled call: %s", e)

    def _broadcast_abort(self, call: Call, exc: DistError) -> None:
        if self.client is None or self.rendezvous_lost is not None:
            return
        body = {"t": "abort", "ranks": list(call.group.ranks), "group": call.group.id,
                "seq": call.seq, "reason": str(exc), "kind": "mismatch"}
        if isinstance(exc, PeerLostError):
            body.update(kind="lost", lost=list(exc.ranks), left=exc.left)
        elif isinstance(exc, DistTimeoutError):
            body.update(kind="timeout", missing=list(exc.missing))
        try:
            self.client.notify(body)
        except Exception as e:  # the job is already failing; the local error still raises
            log.debug("could not broadcast abort: %s", e)

    async def _timeout_error(self, call: Call, timeout: float,
                             waiting: set[int]) -> DistTimeoutError:
        name = call.name
        missing: list[int] = []
        if self.client is not None and self.rendezvous_lost is None:
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


def _abort_error(body: dict) -> DistError:
    """The error an abort from another rank raises here."""
    reason, kind = body["reason"], body.get("kind", "mismatch")
    if kind == "lost":
        return PeerLostError(reason, ranks=body.get("lost", ()), left=body.get("left", False))
    if kind == "timeout":
        by = body.get("by")
        return DistTimeoutError(reason if by is None else f"{reason} (reported by rank {by})",
                                missing=body.get("missing", ()))
    return CollectiveMismatchError(reason)


def _bytes(a: np.ndarray) -> memoryview:
    return memoryview(a).cast("B")


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
