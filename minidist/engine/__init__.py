"""Runs a schedule over the transport: posts receives, sends frames, reduces in place.

The engine is also where this rank keeps what it knows of the others: which ranks died,
which left, whether the rendezvous is still there, and which groups are unusable after
a failed call. Every call it runs is registered while it runs, so that news of a lost
peer, an abort from another rank or a mismatched frame ends it at once, whatever it is
waiting on (a receive, a send, a connection attempt, a shared-memory set-up).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, defaultdict
from collections.abc import Callable

from ..errors import DistError
from ..group import Group
from ..plan import Call
from ..tracing import Tracer
from ..transport.mailbox import Mailbox
from .aborts import Aborts
from .base import (  # noqa: F401 - what importers of the engine use
    FLAG_OBJECT,
    INTERNAL_TAGS,
    LEFT,
    OBJECT_DTYPE,
    Active,
    Control,
    Transport,
    tag_name,
)
from .p2p import PointToPoint
from .peers import Peers
from .runner import Runner

__all__ = ["Engine", "Control", "Transport", "tag_name", "FLAG_OBJECT", "INTERNAL_TAGS", "LEFT",
           "OBJECT_DTYPE"]


class Engine(Peers, Aborts, PointToPoint, Runner):
    """Executes collectives and messages for one rank, on the runtime's event loop
(except :meth:`next_seq`, :meth:`next_p2p_seq`, :meth:`send_first` and
:meth:`send_p2p_now`, which the caller's thread runs in call order).

    Its parts: :class:`Peers` (news of the other ranks), :class:`Aborts`,
    :class:`PointToPoint` and :class:`Runner` (schedules); this class holds the
    state they share and numbers the calls."""

    def __init__(self, rank: int, mailbox: Mailbox) -> None:
        self.rank = rank
        self.endpoint: Transport | None = None
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
        self._active: set[Active] = set()
        self._cancelled: set[asyncio.Task] = set()
        self._aborted: OrderedDict[tuple[int, int], DistError] = OrderedDict()
        self._finished: OrderedDict[tuple[int, int], Call | None] = OrderedDict()
        self._news: dict[int, asyncio.Future] = {}
        self.p2p_seqs: dict[tuple[int, int, int, bool], int] = {}
        # MINIDIST_TRACE: records every collective's steps (minidist.tracing); None: off
        self.tracer: Tracer | None = None
        mailbox.on_mismatch = self._frame_mismatch
        mailbox.on_unexpected = self._unexpected
        # called on the loop before a point-to-point receive or probe waits here
        self.before_receive: Callable[[], None] = lambda: None

    def attach(self, endpoint: Transport, control: Control | None) -> None:
        """Connect the engine to this rank's transport (its endpoint) and the job's
        control plane (None: no rendezvous, as for ranks joined in memory; a world of
        one has neither)."""
        self.endpoint = endpoint
        self.client = control

    def next_seq(self, group: Group) -> int:
        """Number the next collective on ``group`` (called in submission order)."""
        seq = self.entered[group.id]
        self.entered[group.id] = seq + 1
        return seq

    def next_p2p_seq(self, group: Group, peer: int, tag: int, sending: bool) -> int:
        """Number the next message to (or from) ``peer`` with ``tag`` on ``group``."""
        key = (group.id, peer, tag, sending)
        seq = self.p2p_seqs.get(key, 0)
        self.p2p_seqs[key] = seq + 1
        return seq

    def give_back_p2p_seq(self, p) -> None:
        """An abandoned receive does not consume the next message: if it was the last
        one numbered on its (peer, tag), its number goes to the next receive."""
        key = (p.group.id, p.peer, p.tag, False)
        if self.p2p_seqs.get(key) == p.seq + 1:
            self.p2p_seqs[key] = p.seq

    def _enter(self, group: Group, call: Call | None = None, peer: int = -1) -> Active:
        a = Active(group, call, peer, asyncio.current_task())
        self._active.add(a)
        return a

    def _leave(self, a: Active, exc: BaseException) -> BaseException:
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

    def _outcome(self, a: Active, exc: BaseException) -> BaseException | None:
        """What a call that ended with ``exc`` (a cancellation, a DistError or a
        timeout) raises, the one ladder of every call: the error the engine ended it
        with, if it did; else ``exc`` itself; None when its own deadline passed (the
        caller then says what did not finish in time)."""
        err = self._leave(a, exc)
        if err is exc and isinstance(exc, TimeoutError) and not isinstance(exc, DistError):
            return None
        return err

    def _fail(self, a: Active, exc: BaseException) -> None:
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
