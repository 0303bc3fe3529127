"""A rank's membership in a job, bound to one event loop: join, execute, leave.

A :class:`Session` owns this rank's sockets (endpoint, control connection, and the
rendezvous or node agent it may host), its engine, and the shared-memory segments of
its groups. It executes what the :class:`~minidist.plan.Planner` (``session.plan``)
prepared; front ends reach both through the door (:mod:`minidist.door`). Everything
here runs on the session's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from . import (
    algorithms,
    calibrate,
    env,
    fast_rooted,
    fastpath,
    ops,
    peer_memory,
    segments,
    shm_setup,
    tracing,
    wire,
)
from .algorithms import shm as shm_algorithm
from .algorithms.schedule import Schedule
from .elastic import Elastic
from .engine import Engine
from .env import LaunchConfig
from .errors import DistError, DistTimeoutError, PeerLostError, RendezvousError
from .fast_p2p import LINGER, FastP2P
from .group import Group
from .plan import FAST_TAG, P2P, SHM_TAG, Planner, Prepared
from .rendezvous.agent import NodeAgent
from .rendezvous.client import RendezvousClient
from .rendezvous.store import KeyValueStore
from .transport import addresses
from .transport.endpoint import Endpoint
from .transport.mailbox import Mailbox

if TYPE_CHECKING:
    from .rendezvous.server import RendezvousServer

REFUSAL_CHECK = 0.02  # seconds between a set-up's looks at lost ranks and aborts


class _FastHooks:
    """What a fast call asks the session while it waits (:class:`fastpath.Hooks`), from
    the caller's thread; the loop's part is handed to ``loop``."""

    __slots__ = ("session", "loop")

    def __init__(self, session: Session, loop: asyncio.AbstractEventLoop) -> None:
        self.session = session
        self.loop = loop

    def gone(self, group: Group, rank: int) -> DistError | None:
        return self.session._fast_refusal(group, rank)

    def broken(self, call) -> DistError | None:
        return self.session.engine.refusal(call, consume=False)

    def anyone_gone(self) -> bool:
        engine = self.session.engine
        return bool(engine.lost or engine.left or engine.died)

    def stalled(self, call) -> None:
        self.loop.call_soon_threadsafe(self.session.engine.report_stall, call)

    def timed_out(self, call, waiting: list[int]) -> DistError:
        return self.session._fast_timeout(call, waiting, self.loop)


class Session:
    """One rank of one job on the current event loop."""

    def __init__(self, cfg: LaunchConfig, timeout: float) -> None:
        self.cfg = cfg
        self.rank = cfg.rank
        self.timeout = timeout
        self.mailbox = Mailbox()
        self.engine = Engine(cfg.rank, self.mailbox)
        self.endpoint: Endpoint | None = None
        self.client: RendezvousClient | None = None
        self.server: RendezvousServer | None = None
        self.agent: NodeAgent | None = None
        self.local_store: KeyValueStore | None = None
        self.job = addresses.job_key(cfg.secret)
        self.engine.tracer = tracing.from_env(os.environ, self.job, cfg.rank)
        # the job's own algorithms (MINIDIST_ALGO_MODULE), then per-job overrides, read once
        algorithms.plugins.load_modules(env.algorithm_modules(os.environ))
        forced = env.algorithm_overrides(os.environ, list(algorithms.ALGORITHMS))
        self.plan = Planner(
            cfg.rank, cfg.world_size, self.engine.next_seq, self.engine.next_p2p_seq,
            segments.available() and env.shared_memory_allowed(os.environ),
            calibrate.load(), forced)
        self.world = self.plan.world
        self.elastic = Elastic(self)  # shrink, agree, restarted ranks
        if fastpath.available() and segments.available() and env.fast_path_allowed(
                os.environ) and env.shared_memory_allowed(os.environ):
            self.plan.fast = True
        self._fast: dict[int, fastpath.Slots | None] = {}  # None: no segment to be had
        self._fast_room: dict[int, tuple[bool, bool]] = {}  # (mid area, reads) per group
        self._fast_maps: list[object] = []
        self._fast_turn: dict[int, int] = {}  # per group: the fast call whose turn it is
        self._fast_cond = threading.Condition(threading.Lock())
        self._fast_waiting = 0  # threads waiting for their fast call's turn
        self._fast_hooks: _FastHooks | None = None
        self._fast_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._fast_setups: dict[int, asyncio.Future] = {}
        self._segments: dict[int, object] = {}
        self.p2p: FastP2P | None = None  # small messages on this node through shared memory
        self._pool: dict[tuple[np.dtype, int], list[np.ndarray]] = {}
        self._shm_locks: dict[int, asyncio.Lock] = {}
        self._shm_turns: dict[int, int] = {}  # shared-memory calls per group so far

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Join the job: host the rendezvous if asked, listen, register, get the welcome."""
        cfg = self.cfg
        if cfg.world_size == 1:
            self.local_store = KeyValueStore()
            return
        if cfg.host_server:
            # a job on one node needs no address other nodes can reach
            host = "127.0.0.1" if cfg.local_world_size == cfg.world_size else "0.0.0.0"
            # loaded only by the rank that hosts it (torchrun's rank 0): others never do
            from .rendezvous.server import RendezvousServer

            self.server = RendezvousServer(cfg.secret, cfg.world_size, host=host,
                                           port=cfg.port)
            await self.server.start()
        elif cfg.host_agent:
            self.agent = NodeAgent(cfg.secret, cfg.master_addr, cfg.port, port=cfg.port)
            await self.agent.start(timeout=self.timeout)
        engine = self.engine
        self.client = RendezvousClient(cfg.secret, engine.peer_lost, engine.abort_received,
                                       lambda gid: engine.entered.get(gid, 0),
                                       engine.peers_left)
        if cfg.launcher != "minidist" and cfg.local_world_size == cfg.world_size:
            engine.rendezvous_host = 0  # rank 0's process hosts it (else a launcher)
        self.endpoint = Endpoint(addresses.job_key(cfg.secret), cfg.rank, cfg.secret,
                                 self.mailbox, engine.connection_lost,
                                 connect_timeout=self.timeout)
        engine.attach(self.endpoint, self.client)
        self.client.on_back = self.elastic.rank_back
        self.client.on_lost = self._peer_lost
        await self.endpoint.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            await self.client.connect(cfg.master_addr, cfg.port, deadline - loop.time())
            try:
                welcome = await self.client.register(cfg.rank, cfg.world_size,
                                                     cfg.local_rank, deadline - loop.time(),
                                                     self._read_key())
                break
            except (RendezvousError, PeerLostError) as e:
                # reached the rendezvous of a previous init that is shutting down (it
                # refuses us, or closes while we wait): the next one will come
                retry = getattr(e, "retry", isinstance(e, PeerLostError))
                if not retry or loop.time() > deadline:
                    raise
                await self.client.close(graceful=False)
                await asyncio.sleep(0.05)
        self.plan.set_nodes(welcome["nodes"], welcome.get("reads"))
        self.elastic.welcome(welcome)
        nodes = self.plan.nodes
        agents = welcome.get("agents") or []
        me = nodes[cfg.rank]
        for r, node in ([] if max(nodes) == 0 else enumerate(nodes)):
            if node != me and node < len(agents) and agents[node] is not None:
                host, port = agents[node]
                self.endpoint.remote[r] = (host or cfg.master_addr, port)
        if self.plan.fast and nodes.count(me) > 1 and not self.elastic.incarnation:
            self.p2p = FastP2P(self)  # (a restarted rank's messages go through sockets)

    def _peer_lost(self, rank: int, reason: str) -> None:
        """The rendezvous says ``rank`` died: the loop's calls fail at once, and the
        fast calls sleeping on this rank's threads look again now."""
        self.engine.peer_lost(rank, reason)
        if self.plan.fast:
            fastpath.wake_sleepers()

    def _read_key(self) -> str | None:
        """What a peer must share with this rank to read its vectors (None: no peer
        reads; see :mod:`minidist.peer_memory`)."""
        if not (self.plan.fast and env.single_copy_allowed(os.environ)):
            return None
        return peer_memory.key()

    async def close(self, graceful: bool = True) -> None:
        """Leave the job and close every socket. A hosted rendezvous first waits (up to
        the timeout) for the other ranks to leave."""
        if self.engine.tracer is not None:
            self.engine.tracer.flush()
        if self.p2p is not None:
            if graceful:  # the messages still in this rank's stash: taken, or given up
                await self.p2p.linger(min(self.timeout, LINGER))
            self.p2p.close()
        self._fast.clear()
        for seg in [*self._segments.values(), *self._fast_maps]:
            with contextlib.suppress(BufferError):
                seg.close()
        self._segments.clear()
        self._fast_maps.clear()
        if self._fast_pool is not None:
            self._fast_pool.shutdown(wait=False, cancel_futures=True)
        if self.endpoint is not None:
            await self.endpoint.close()
        if self.client is not None:
            await self.client.close(graceful=graceful)
        if self.server is not None:
            if graceful:
                await self.server.wait_all_left(self.timeout)
            await self.server.close()
            segments.sweep(self.job)
        if self.engine.lost:  # a rank killed while setting up a segment left its name
            segments.sweep_orphans(self.job)
        if self.agent is not None:
            if graceful:  # the other ranks of this node still talk through it
                await self.agent.wait_all_left(self.timeout)
            await self.agent.close()

    @property
    def nodes(self) -> list[int]:
        """The node index of every rank."""
        return self.plan.nodes

    def timeout_of(self, g: Group) -> float:
        """The deadline, in seconds, of one call on ``g``."""
        return self.timeout if g.timeout is None else g.timeout

    # ------------------------------------------------------------------ scratch

    def _scratch(self, dtype: np.dtype, n: int) -> np.ndarray:
        """A scratch array from the pool (given back by :meth:`execute`; the loop's
        thread only)."""
        pool = self._pool.get((dtype, n))
        return pool.pop() if pool else np.empty(n, dtype)

    def _give_back(self, a: np.ndarray | None) -> None:
        if a is None or not a.size:
            return
        pool = self._pool.setdefault((a.dtype, a.size), [])
        if len(pool) < 2:
            pool.append(a)

    # ------------------------------------------------------------------ point-to-point

    async def send(self, p: P2P) -> None:
        await self.engine.send_p2p(p, self.timeout_of(p.group))

    def send_now(self, p: P2P, loop: asyncio.AbstractEventLoop) -> bool:
        """From the caller's thread: send a small message directly if the connection
        allows (see :meth:`Engine.send_p2p_now`); False if :meth:`send` must do it."""
        return self.engine.send_p2p_now(p, loop)

    async def recv(self, p: P2P) -> bytes | None:
        """Receive into the prepared array, or return an object's bytes."""
        payload = await self.engine.recv_p2p(p, self.timeout_of(p.group))
        if p.user is not None:
            np.copyto(p.user, p.flat.reshape(p.user.shape))
        return payload

    async def _segment(self, g: Group, half: int, need: int):
        """This group's shared-memory segment, set up on first use by every member: two
        halves of SEGMENT_BYTES, used by the group's shared-memory calls in turn; None
        (on every member) if a call of ``need`` bytes has no room in half ``half``."""
        seg = self._segments.get(g.id)
        messages = self._setup_messages(g, SHM_TAG)
        if seg is None:
            try:
                seg = self._segments[g.id] = await shm_setup.algorithm_segment(
                    self.job, self.rank, g,
                    segments.segment_name(self.job, g.id, os.getpid()), *messages)
            except FileNotFoundError:  # the first rank gave up on this call meanwhile
                raise DistError(f"shared-memory set-up on {g!r} failed on rank "
                                f"{self.rank}: rank {g.ranks[0]} abandoned it") from None
        ok = await seg.room_for(self.job, g, self.rank, half, need, *messages)
        return seg.seg if ok else None

    def _setup_messages(self, g: Group, tag: int):
        """(send, recv) of a set-up's messages on ``g`` (bytes, from or to one rank)."""
        async def send(data: bytes, to: int) -> None:
            await self.send(self.plan.prepare_send(data, to, tag, g, is_object=True,
                                                   internal=True))

        async def recv(frm: int) -> bytes:
            return await self.recv(self.plan.prepare_recv(None, frm, tag, g, internal=True))

        return send, recv

    def send_first(self, p: Prepared, loop: asyncio.AbstractEventLoop) -> None:
        """From the caller's thread, just before :meth:`execute`: write the call's first
        small frames directly (see :meth:`Engine.send_first`)."""
        if p.call is not None and not p.schedule.shared_tmp:
            p.sent = self.engine.send_first(p.call, p.schedule, p.bufs, loop)

    # ------------------------------------------------------------------ the fast path

    async def fast_setup(self, p: Prepared) -> None:
        """Map the fast slots of ``p``'s group (on the loop; every member does it at the
        group's first fast call, ``p``): the first rank creates them and sends their
        name to the others. A rank that never comes makes it fail as ``p`` would."""
        g = p.call.group
        if g.id in self._fast:
            return
        pending = self._fast_setups.get(g.id)
        if pending is not None:  # an earlier call on the group is setting them up
            await asyncio.shield(pending)
            return
        pending = self._fast_setups[g.id] = asyncio.get_running_loop().create_future()
        pending.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await self._fast_setup(p)
        except BaseException as e:
            pending.set_exception(e if isinstance(e, Exception) else DistError(str(e)))
            raise
        finally:
            self._fast_setups.pop(g.id, None)
        pending.set_result(None)

    async def _fast_setup(self, p: Prepared) -> None:
        g = p.call.group
        refused = self.engine.refusal(p.call)
        if refused is not None:
            raise refused
        leader = g.ranks[0]
        key = g.id ^ 0x5A5A5A5A5A5A5A5A  # not the group's other segment's name
        waiting = [leader]
        messages = self._setup_messages(g, FAST_TAG)
        try:
            if self.rank == leader:
                seg, mid, reads = await self._unless_refused(p, shm_setup.lead_fast(
                    self.job, segments.segment_name(self.job, key, os.getpid()), g,
                    self.plan.can_read(g), *messages, waiting))
            else:
                seg, mid, reads = await self._unless_refused(p, shm_setup.join_fast(
                    fastpath.segment_bytes(g.size), leader, *messages,
                    lambda name, size: self._fast_attach(p, name, size, leader)))
        except DistTimeoutError:  # the rendezvous knows who never came to this call
            raise await self.engine.timeout_error(p.call, self.timeout_of(g),
                                                   set(waiting)) from None
        self._fast_room[g.id] = (mid, reads)
        if seg is None:  # every member says so: the group's calls go over sockets
            self._fast[g.id] = None
            return
        self._fast_maps.append(seg)
        self._fast[g.id] = fast_rooted.Fast(seg, g, g.rank_of(self.rank))

    async def _unless_refused(self, p: Prepared, work):
        """Await ``work`` (a set-up's exchange with some members), but raise at once what
        ends ``p`` for any member (a rank of its group lost or gone, an abort): a member
        that waits for the first rank's word must not wait out the timeout for a rank
        that died without ever coming."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=REFUSAL_CHECK)
                if done:
                    return task.result()
                refused = self.engine.refusal(p.call, consume=False)
                if refused is not None:
                    raise refused
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _fast_attach(self, p: Prepared, name: str, size: int, leader: int):
        """Map the fast segment ``name`` of ``p``'s group, which its first rank made."""
        try:
            return segments.attach(name, size)
        except FileNotFoundError:
            # the first rank gave up on this call: its abort says why, shortly
            end = asyncio.get_running_loop().time() + 2.0
            while asyncio.get_running_loop().time() < end:
                refused = self.engine.refusal(p.call)
                if refused is not None:
                    raise refused from None
                await asyncio.sleep(0.01)
            raise DistError(f"{p.call.name} on {p.call.group!r} failed on rank {self.rank}: "
                            f"rank {leader} abandoned the set-up of its shared slots") from None

    def _fast_fits(self, p: Prepared) -> bool:
        """Whether ``p``'s group's fast segment can run ``p`` (the same answer on every
        rank): else it runs over sockets (:meth:`_instead`)."""
        gid = p.call.group.id
        return self._fast.get(gid) is not None and (
            p.call.kind in fast_rooted.KINDS  # its area is in the slots' part
            or shm_setup.fits(self._fast_room[gid], p.reads, p.bufs["out"].nbytes))

    async def _instead(self, p: Prepared) -> None:
        """Run fast call ``p`` over sockets, as the socket path would have (every rank of
        its group does, see :meth:`_fast_fits`); on the loop."""
        sched = self.plan.socket_schedule(p.call, p.bufs)
        p.bufs["tmp"] = self._scratch(p.bufs["out"].dtype, sched.tmp_size)
        try:
            await self.engine.run(p.call, sched, p.bufs, p.op, self.timeout_of(p.call.group))
        finally:
            self._give_back(p.bufs.pop("tmp", None))

    def run_fast(self, p: Prepared, loop: asyncio.AbstractEventLoop) -> None:
        """Run a fast call on this thread (never the loop's): the group's fast calls run
        one at a time, in the order they were planned."""
        call = p.call
        g = call.group
        engine = self.engine
        deadline = time.monotonic() + self.timeout_of(g)
        turns = self._fast_turn
        if turns.get(g.id, 0) != p.fast:  # an earlier call on the group is running
            with self._fast_cond:
                self._fast_waiting += 1
                try:
                    ok = self._fast_cond.wait_for(lambda: turns.get(g.id, 0) == p.fast,
                                                  max(0.0, deadline - time.monotonic()))
                finally:
                    self._fast_waiting -= 1
            if not ok:
                raise DistTimeoutError(f"{call.name} on {g!r} (call #{call.seq}) timed out "
                                       "behind this rank's earlier calls on the group",
                                       collective=call.name, group=g)
        hooks = self._fast_hooks
        if hooks is None or hooks.loop is not loop:
            hooks = self._fast_hooks = _FastHooks(self, loop)
        try:
            refused = engine.refusal(call, consume=False)
            if refused is not None:
                raise refused
            out = p.bufs["out"]
            if call.kind == wire.Kind.BROADCAST:
                src = out if call.root == self.rank else out[:0]
            elif call.kind == wire.Kind.ALL_REDUCE or call.kind in fast_rooted.KINDS:
                src = p.bufs["in"]
            else:
                src = out[:0]
            slots = self._fast[g.id]
            if slots is not None and (out.nbytes <= fastpath.SLOT_BYTES and not p.reads
                                      or self._fast_fits(p)):  # (small calls: at once)
                slots.run(p.fast, call, out, src, p.op, deadline, hooks, p.reads)
            else:  # no shared memory for it: over sockets, on the loop
                asyncio.run_coroutine_threadsafe(self._instead(p), loop).result()
            if p.finish:
                ops.finish(p.op, out, g.size)
            if p.user is not None:
                np.copyto(p.user, out.reshape(p.user.shape))
        except DistError as e:
            loop.call_soon_threadsafe(engine.fast_failed, call, e)
            raise
        finally:
            # the turn is stored before the count of waiters is read, and a waiter counts
            # itself before it reads the turn: one of them sees the other
            turns[g.id] = p.fast + p.fast_numbers
            if self._fast_waiting:
                with self._fast_cond:
                    self._fast_cond.notify_all()

    def _run_fast_traced(self, p: Prepared, loop: asyncio.AbstractEventLoop) -> None:
        """:meth:`run_fast`, recorded as one slice (MINIDIST_TRACE)."""
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
            self.run_fast(p, loop)
        except BaseException as e:
            args["error"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            tr.span(f"{call.name} ({call.algorithm_name})", "collective", tr.tid(call.group), start,
                    tr.now(), args)

    def _fast_timeout(self, call, waiting: list[int],
                      loop: asyncio.AbstractEventLoop) -> DistError:
        """The error of a fast call past its deadline, as the loop's calls make it (the
        rendezvous says which ranks never arrived)."""
        timeout = self.timeout_of(call.group)
        try:
            return asyncio.run_coroutine_threadsafe(
                self.engine.timeout_error(call, timeout, set(waiting)), loop).result(10)
        except Exception:  # noqa: BLE001 - the loop is gone: say what this rank saw
            return DistTimeoutError(
                f"{call.name} on {call.group!r} (call #{call.seq}) timed out after "
                f"{timeout:g} s on rank {self.rank}; still waiting on ranks {waiting}",
                collective=call.name, group=call.group, missing=waiting)

    def _fast_refusal(self, g: Group, rank: int) -> DistError | None:
        """Why ``rank`` cannot take part in a fast call on ``g`` any more, as far as this
        rank knows (read from another thread), or None."""
        e = self.engine
        if rank in e.lost:
            return PeerLostError(f"rank {rank} died ({e.lost[rank]})", ranks=[rank])
        if rank in e.left:
            return PeerLostError(f"rank {rank} left the job ({e.left[rank]})", ranks=[rank],
                                 left=True)
        if rank in e.died and rank in e.stale(g):  # restarted: not the process g was made with
            return PeerLostError(f"rank {rank} died ({e.died[rank]})", ranks=[rank])
        return None

    def fast_blocking(self, p: Prepared, runtime) -> None:
        """A fast call from a blocking caller: set up on the loop if needed, then run on
        the caller's thread."""
        if p.call.group.id not in self._fast:
            try:
                runtime.call(self.fast_setup(p))
            except DistError as e:
                runtime.loop.call_soon_threadsafe(self.engine.fast_failed, p.call, e)
                raise
        if self.engine.tracer is None:
            self.run_fast(p, runtime.loop)
        else:
            self._run_fast_traced(p, runtime.loop)

    async def execute(self, p: Prepared) -> None:
        """Run a prepared call to the end (DistError subclasses on failure)."""
        out = p.bufs["out"]
        if p.fast >= 0:  # from the loop (async_op, minidist.aio): on a thread of its own
            try:
                await self.fast_setup(p)
            except DistError as e:
                self.engine.fast_failed(p.call, e)
                raise
            if self._fast_pool is None:
                # a thread per call in flight: each waits for its turn on its own
                self._fast_pool = concurrent.futures.ThreadPoolExecutor(
                    32, thread_name_prefix="minidist-fast")
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._fast_pool, self.run_fast if self.engine.tracer
                                       is None else self._run_fast_traced, p, loop)
            return
        if p.call is not None and p.schedule.shared_tmp:
            g = p.call.group

            async def map_segment() -> Schedule | None:
                # consecutive calls use the two halves in turn: a rank that finished this
                # call may start the next before a slower one has copied out its result,
                # and cannot start the one after before every rank finished this one
                turn = self._shm_turns.get(g.id, 0)
                # inside the call: a rank that chose another algorithm is found out here
                seg = await self._segment(g, turn % 2, p.schedule.tmp_size * out.itemsize)
                if seg is None:  # no room in /dev/shm: every rank runs this instead (and
                    # the turn stays: only the calls that ran here take turns)
                    instead = self.plan.socket_schedule(p.call, p.bufs)
                    p.bufs["tmp"] = np.empty(instead.tmp_size, out.dtype)
                    return instead
                self._shm_turns[g.id] = turn + 1
                p.bufs["tmp"] = np.frombuffer(seg, out.dtype, p.schedule.tmp_size,
                                              (turn % 2) * shm_algorithm.SEGMENT_BYTES)
                return None

            lock = self._shm_locks.setdefault(g.id, asyncio.Lock())
            async with lock:  # calls on one group share its segment: one at a time
                try:
                    await self.engine.run(p.call, p.schedule, p.bufs, p.op,
                                          self.timeout_of(g), prologue=map_segment)
                finally:
                    p.bufs["tmp"] = None
        elif p.call is not None:
            p.bufs["tmp"] = self._scratch(out.dtype, p.schedule.tmp_size)
            try:
                await self.engine.run(p.call, p.schedule, p.bufs, p.op,
                                      self.timeout_of(p.call.group), p.sent)
            finally:
                self._give_back(p.bufs.pop("tmp", None))
        if p.finish:
            ops.finish(p.op, out, p.call.group.size if p.call else 1)
        if p.user is not None:
            np.copyto(p.user, out.reshape(p.user.shape))


