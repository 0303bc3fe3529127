"""The door: the one way every front end starts a call.

A front end plans a call with ``door.plan`` (pure: argument checks, numbering, the
algorithm) and passes the planned call through the door, which starts it and finishes
it on the session's event loop. The thread boundary is drawn here and nowhere else:

* on the caller's thread, in call order: planning, then the fast paths — the call's first
  small frames (or a whole small message) written straight to peers already connected
  over a Unix socket, so they need not wait for the loop to wake up; small collectives
  through shared slots (:mod:`minidist.shm.fast_slots`); small messages to and blocking
  receives from ranks of this node through shared-memory inboxes
  (:mod:`minidist.shm.p2p`);
* on the loop: everything else (:meth:`Session.execute`, :meth:`Session.send`,
  :meth:`Session.recv`).

The blocking API (:mod:`minidist.api`) and layers built on it (:mod:`minidist.torch`)
hold a door with a :class:`~minidist.runtime.Runtime` (a loop in a background thread)
and use :meth:`Door.wait` / :meth:`Door.submit`; :mod:`minidist.aio` holds one on its
own running loop and awaits :meth:`Door.run`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Coroutine, Generator, Sequence
from typing import Any

from . import forkguard, wire
from .errors import DistError
from .group import NON_GROUP_MEMBER, Group
from .plan import Planner
from .prepared import P2P, Prepared
from .runtime import Runtime
from .session import Session
from .shm import first_k, repeat
from .shm.p2p import NOT_TAKEN

Planned = Prepared | P2P


def _lane(lanes: dict, peer: Any, tag: Any) -> Any:
    """The compiled lane of messages with ``peer`` and ``tag`` (None: none, or not a
    rank and a tag, which the general path then says)."""
    if not lanes:
        return None
    try:
        return lanes.get((peer, tag))
    except TypeError:
        return None


class Door:
    """One rank's way in. ``runtime`` is the loop thread for callers on other threads;
    None when the callers run on the session's own loop (:mod:`minidist.aio`)."""

    def __init__(self, session: Session, runtime: Runtime | None) -> None:
        self._session = session
        self.runtime = runtime
        self.plan: Planner = session.plan
        self.fast_calls = session.fast_calls  # (minidist.shm.repeat runs calls through it)
        # the caller's-thread writes, bound once (no call more per message)
        self._send_first, self._send_now = session.send_first, session.send_now
        self._send_local, self._recv_local, self._send_again, self._recv_again = \
            session.local_messages() or (None, None, None, None)
        # the compiled lanes (for blocking callers, who have a loop thread to go on with)
        lanes = session.lanes() if runtime is not None else None
        self._send_lanes, self._recv_lanes, self._doorbell = lanes or ({}, {}, None)
        forkguard.track(self)  # a forked child cannot use it (see minidist.forkguard)

    # ------------------------------------------------------------------ who we are

    @property
    def rank(self) -> int:
        return self._session.rank

    @property
    def world(self) -> Group:
        return self._session.world

    @property
    def job(self) -> str:
        """The job's public key: it names the job's Unix sockets and shared memory."""
        return self._session.job

    @property
    def timeout(self) -> float:
        """The job's timeout: what bounds a call on a group without its own."""
        return self._session.timeout

    def timeout_of(self, group: Group | None) -> float:
        """What bounds one call on ``group`` (None: the world)."""
        return self._session.timeout_of(self.world if group is None else group)

    @property
    def local_rank(self) -> int:
        return self._session.cfg.local_rank

    @property
    def local_world_size(self) -> int:
        return self._session.cfg.local_world_size

    @property
    def node_rank(self) -> int:
        return self._session.nodes[self.rank]

    def rank_in(self, group: Group | object | None) -> int:
        """This rank's rank in ``group`` (None: the world); -1 if not a member."""
        if group is NON_GROUP_MEMBER:
            return -1
        return (group or self.world).rank_of(self.rank)

    def size_of(self, group: Group | object | None) -> int:
        """The number of ranks in ``group`` (None: the world); -1 for a non-member."""
        if group is NON_GROUP_MEMBER:
            return -1
        return (group or self.world).size

    def new_subgroups(self, group_size: int | None, group: Group | object | None,
                      timeout: float | None) -> tuple[Group | object, list[Group | object]]:
        """See :func:`minidist.new_subgroups`."""
        parent = self.world if group is None else self.plan.group(group, "new_subgroups")
        if group_size is None:
            group_size = self.local_world_size
        if not isinstance(group_size, int) or group_size <= 0:
            raise ValueError(f"new_subgroups: group_size must be a positive int, not "
                             f"{group_size!r}")
        if parent.size % group_size:
            raise ValueError(f"new_subgroups: the group size {parent.size} does not divide "
                             f"by group_size={group_size}")
        subgroups, mine = [], NON_GROUP_MEMBER
        for start in range(0, parent.size, group_size):
            g = self.plan.new_group(list(parent.ranks[start:start + group_size]), timeout)
            subgroups.append(g)
            if g is not NON_GROUP_MEMBER:
                mine = g
        return mine, subgroups

    def group_of(self, group: Group | object | None) -> Group:
        """``group`` as a Group (None: the default group, the world unless it was shrunk);
        ValueError for a non-member marker."""
        if group is None:
            return self.plan.default
        if group is NON_GROUP_MEMBER:
            raise ValueError("this rank is not a member of the group (NON_GROUP_MEMBER)")
        if not isinstance(group, Group):
            raise TypeError(f"expected a minidist group or None, not {type(group).__name__}")
        return group

    def gone(self, group: Group, rank: int) -> DistError | None:
        """Why global ``rank`` can no longer take part in calls on ``group`` (it died or
        left), as far as this rank knows now, or None. Safe from any thread."""
        return self._session.gone(group, rank)

    # ------------------------------------------------------------------ calls

    def _start(self, item: Planned) -> bool:
        """The caller's-thread part; True if that already finished the call (a small
        message written whole)."""
        loop = self.runtime.loop if self.runtime else None
        if isinstance(item, Prepared):
            if loop is not None and item.call is not None and item.fast < 0 and \
                    not item.schedule.shared_tmp:
                item.sent = self._send_first(item.call, item.schedule, item.bufs, loop)
            return False
        local = self._send_local
        return item.sending and loop is not None and (
            (local is not None and local(item, loop)) or self._send_now(item, loop))

    def _finish(self, item: Planned) -> Coroutine[Any, Any, Any]:
        """The loop's part."""
        s = self._session
        if isinstance(item, Prepared):
            return s.execute(item)
        return s.send(item) if item.sending else s.recv(item)

    def wait(self, item: Planned) -> Any:
        """Start ``item`` and block until it is done (a received object's bytes, else
        None); its DistError raises here."""
        if isinstance(item, Prepared) and item.fast >= 0:  # no loop at all
            self._session.fast_blocking(item, self._blocking())
            return None
        if self._start(item):
            return None
        runtime = self._blocking()
        if isinstance(item, P2P) and not item.sending and item.peer >= 0 and \
                self._recv_local is not None:  # from a rank of this node: shared memory
            got = self._recv_local(item, runtime.loop)
            if got is not NOT_TAKEN:
                return got
        return runtime.call(self._finish(item))

    def send_again(self, array: Any, dst: int, tag: int, group: Any) -> bool:
        """A blocking send like the last one to ``dst`` with ``tag`` (the same group,
        dtype and shape), to a rank of this node: on its way without planning it again
        (True, see :meth:`FastP2P.send_again`); False: plan it (nothing was done)."""
        lane = _lane(self._send_lanes, dst, tag)
        if lane is not None:  # the compiled core's lane of this route, in one call
            done = lane.send(array, group)
            if done is True:
                return True
            if done is not None:  # written, but the receiver's inbox closed meanwhile
                self._doorbell(self.plan.default if group is None else group, dst,
                               self.runtime.loop)
                return True
        again = self._send_again
        if again is None or self.runtime is None:
            return False
        got = again(array, dst, tag, group, self.runtime.loop)
        if got is None:
            return False
        if got is not True:  # numbered, but its receiver's ring took nothing
            self.wait(got)
        return True

    def send_each(self, arrays: Sequence[Any], dsts: Sequence[int], tag: int,
                  group: Any) -> None:
        """Blocking sends of ``arrays[i]`` to ``dsts[i]`` with ``tag``, in order: each
        by :meth:`send_again` when it repeats the last to its rank, else planned as any
        send."""
        for array, dst in zip(arrays, dsts, strict=True):
            if not self.send_again(array, dst, tag, group):
                self.wait(self.plan.prepare_send(array, dst, tag, group))

    def recv_again(self, array: Any, src: int, tag: int, group: Any) -> bool:
        """A blocking receive from ``src`` with ``tag`` like the last one from there
        (the same group, dtype and shape), from a rank of this node: taken without
        planning it again (True, see :meth:`minidist.shm.takes.Takes.recv_again`);
        False: plan it (nothing was done)."""
        lane = _lane(self._recv_lanes, src, tag)
        if lane is not None:  # the compiled core's lane of this receive, in one call
            got = lane.recv(array, group)
            if got is True:
                return True
            if got is not None:  # numbered, not there within a slice: wait on
                self.wait(P2P(self.plan.default if group is None else group, src, tag, got,
                              array.reshape(-1), wire.shape_digest(array.shape), False))
                return True
        again = self._recv_again
        if again is None or self.runtime is None:
            return False
        return again(array, src, tag, group, self.runtime.loop)

    def rooted_again(self, kind: str, output: Any, input: Any, root: int, group: Any) -> bool:
        """A blocking ``kind`` (``"scatter"`` or ``"gather"``) like this thread's last
        one on this door: run without planning it again (True, see
        :mod:`minidist.shm.repeat`); False: plan it (nothing was done)."""
        return repeat.again(self, kind, output, input, root, group)

    def remember_rooted(self, item: Prepared, group: Any, output: Any, input: Any) -> None:
        """After the blocking scatter or gather ``item`` ran: remember it, so that
        :meth:`rooted_again` can run it again."""
        repeat.remember(self, item, group, output, input)

    def submit(self, item: Planned) -> concurrent.futures.Future:
        """Start ``item``; the future completes with it (a Work's handle)."""
        runtime = self._blocking()
        if self._start(item):
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(None)
            return done
        return runtime.submit(self._finish(item))

    async def run(self, item: Planned) -> Any:
        """Start ``item`` and await it, on the session's own loop."""
        if self.runtime is not None:
            raise DistError("this process uses the blocking minidist API (minidist.init); "
                            "minidist.aio calls need minidist.aio.init() instead")
        self._start(item)
        return await self._finish(item)

    # ------------------------------------------------------------------ first k

    def plan_many(self, output: Any, src: Any, tag: int, group: Any) -> first_k.Many:
        """Check a recv_many (:func:`minidist.recv_many`), on the caller's thread."""
        return first_k.prepare(self.plan, output, src, tag, group)

    def many_again(self, output: Any, src: Any, tag: Any, group: Any) -> first_k.Many | None:
        """This thread's last blocking recv_many, checked and planned, if this one is it
        again (see :func:`minidist.shm.first_k.again`); else None."""
        return first_k.again(self.plan, output, src, tag, group)

    def wait_many(self, m: first_k.Many) -> Any:
        """A recv_many from a blocking caller: in the inbox on this thread when it can,
        else on the loop; the senders. Remembered to run again (:meth:`many_again`)."""
        runtime = self._blocking()
        got = first_k.blocking(self._session, m, runtime.loop, NOT_TAKEN)
        if got is NOT_TAKEN:
            got = runtime.call(first_k.on_loop(self._session, m))
        first_k.remember(m)
        return got

    def submit_many(self, m: first_k.Many) -> concurrent.futures.Future:
        """Start a recv_many on the loop; the future completes with the senders."""
        return self._blocking().submit(first_k.on_loop(self._session, m))

    async def run_many(self, m: first_k.Many) -> Any:
        """A recv_many on the session's own loop (minidist.aio); the senders."""
        return await first_k.on_loop(self._session, m)

    def probe(self, src: int | None, tag: int, group: Group | object | None,
              wait: bool) -> Coroutine[Any, Any, int | None]:
        """On the loop: the sender of the message a receive from ``src`` (None: any rank)
        with ``tag`` would take now, without receiving it; with ``wait``, wait for one
        (up to the group's timeout), else None when none has arrived."""
        g, tag = self.plan.check_probe(src, tag, group)
        return self._session.probe(g, src, tag, self._session.timeout_of(g) if wait else None)

    def steps(self, steps: Generator[Planned, None, Any]) -> Any:
        """Run a call made of array calls (``steps`` yields them and returns the call's
        result) on the caller's thread, each as :meth:`wait` runs one."""
        try:
            item = next(steps)
            while True:
                self.wait(item)
                item = steps.send(None)
        except StopIteration as done:
            return done.value
        finally:
            steps.close()

    async def steps_on_loop(self, steps: Generator[Planned, None, Any]) -> Any:
        """:meth:`steps` from code on the loop: each array call through :meth:`on_loop`."""
        try:
            item = next(steps)
            while True:
                await self.on_loop(item)
                item = steps.send(None)
        except StopIteration as done:
            return done.value
        finally:
            steps.close()

    async def on_loop(self, item: Planned) -> Any:
        """Run ``item`` from code already on the loop (a call made of calls, such as an
        object collective): no caller's-thread fast path."""
        return await self._finish(item)

    def block(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run a coroutine on the loop from a blocking caller and wait for it."""
        return self._blocking().call(coro)

    def _blocking(self) -> Runtime:
        if self.runtime is None:
            raise DistError("this process uses minidist.aio (initialized on its event loop); "
                            "await minidist.aio's functions instead of the blocking API")
        return self.runtime

    # ------------------------------------------------------------------ failures

    async def shrink_group(self, exclude: list[int] | None,
                           group: Group | object | None) -> Group:
        """See :func:`minidist.shrink_group` (on the loop)."""
        g = self.plan.group(group, "shrink_group")
        return await self._session.shrink(g, exclude)

    async def agree(self, flag: bool, group: Group | object | None) -> bool:
        """See :func:`minidist.agree` (on the loop)."""
        return await self._session.agree(flag, self.plan.group(group, "agree"))

    async def wait_ranks(self, ranks: list[int], timeout: float | None) -> list[int]:
        """See :func:`minidist.wait_ranks` (on the loop)."""
        return await self._session.wait_ranks(ranks, timeout)

    @property
    def incarnation(self) -> int:
        """How often this rank was restarted (0: its first process)."""
        return self._session.incarnation

    # ------------------------------------------------------------------ the store

    async def store_request(self, body: dict[str, Any], blob: bytes = b"",
                            timeout: float | None = None) -> tuple[dict[str, Any], bytes]:
        """One key/value request, on the loop (see :class:`minidist.api.Store`): (the
        reply's fields, the value). DistTimeoutError when a wait passes ``timeout``."""
        s = self._session
        timeout = s.timeout if timeout is None else timeout
        return await s.store_request({**body, "timeout": timeout}, blob, timeout)

    # ------------------------------------------------------------------ leaving

    async def close(self, graceful: bool = True) -> None:
        """Leave the job (on the loop)."""
        forkguard.untrack(self)  # from now on a forked child inherits nothing of it
        repeat.forget(self)  # its calls planned once let go of its segments
        await self._session.close(graceful=graceful)

    def leave(self, graceful: bool = True) -> None:
        """Leave the job from a blocking caller, then stop the loop's thread (nothing for
        a door on the caller's own loop: :meth:`close` it there)."""
        runtime = self.runtime
        if runtime is None:
            return
        try:
            runtime.call(self.close(graceful=graceful))
        finally:
            runtime.stop()

