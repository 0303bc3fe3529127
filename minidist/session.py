"""A rank's membership in a job, bound to one event loop: join, execute, leave.

A :class:`Session` owns this rank's sockets (endpoint, control connection, and the
rendezvous or node agent it may host) and its engine, and executes what the
:class:`~minidist.plan.Planner` (``session.plan``) prepared; front ends reach both
through the door (:mod:`minidist.door`). Its parts, one job each: the fast segments of
its groups (:mod:`minidist.shm.group_segments`), the fast calls run on the caller's thread
(:mod:`minidist.shm.calls`), the ``shared_memory`` algorithm's calls
(:mod:`minidist.shm.algorithm_calls`) and the socket path's scratch arrays
(:mod:`minidist.scratch`). Everything here runs on the session's loop, but for the fast
calls and what says so.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import algorithms, calibrate, env, ops, peer_memory, segments, tracing
from .elastic import Elastic
from .engine import Engine
from .env import LaunchConfig
from .errors import DistError, DistTimeoutError, PeerLostError, RendezvousError
from .group import Group
from .plan import Planner
from .prepared import P2P, Prepared
from .rendezvous.agent import NodeAgent
from .rendezvous.client import RendezvousClient
from .rendezvous.store import KeyValueStore
from .scratch import ScratchPool
from .shm import fast_slots
from .shm.algorithm_calls import ShmCalls
from .shm.calls import FastCalls
from .shm.group_segments import FastSegments
from .shm.p2p import BELL_GRACE, LINGER, FastP2P
from .shm.routes import LANE
from .transport import addresses
from .transport.endpoint import Endpoint
from .transport.mailbox import Mailbox

if TYPE_CHECKING:
    from .rendezvous.server import RendezvousServer


class Session:
    """One rank of one job on the current event loop. ``fast_blocking(p, runtime)`` runs
    a fast call from a blocking caller (:meth:`FastCalls.blocking`)."""

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
        # what the door offers of it, its own methods
        self.shrink, self.agree = self.elastic.shrink, self.elastic.agree
        self.wait_ranks = self.elastic.wait_ranks
        if fast_slots.available() and segments.available() and env.fast_path_allowed(
                os.environ) and env.shared_memory_allowed(os.environ):
            self.plan.fast = True
        self.scratch = ScratchPool()
        self.shm = ShmCalls(self)
        self.fast_segments = FastSegments(self)
        self.fast_calls = FastCalls(self, self.fast_segments)
        # the door's ways to a blocking fast call and to the first writes of a call on the
        # caller's thread: the parts' own methods, no call more (see Engine.send_first,
        # Engine.send_p2p_now)
        self.fast_blocking = self.fast_calls.blocking
        self.send_first = self.engine.send_first
        self.send_now = self.engine.send_p2p_now
        self.p2p: FastP2P | None = None  # small messages on this node through shared memory

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
        # news of ranks lost or gone and of aborts also wakes this rank's sleeping fast
        # calls, which then look again now, not at the end of their sleep
        self.client = RendezvousClient(cfg.secret, self._waking(engine.peer_lost),
                                       self._waking(engine.abort_received),
                                       lambda gid: engine.entered.get(gid, 0),
                                       self._waking(engine.peers_left))
        if cfg.launcher != "minidist" and cfg.local_world_size == cfg.world_size:
            engine.rendezvous_host = 0  # rank 0's process hosts it (else a launcher)
        self.endpoint = Endpoint(addresses.job_key(cfg.secret), cfg.rank, cfg.secret,
                                 self.mailbox, engine.connection_lost,
                                 connect_timeout=self.timeout)
        engine.attach(self.endpoint, self.client)
        self.client.on_back = self.elastic.rank_back
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

    def _waking(self, news: Callable[..., None]) -> Callable[..., None]:
        """``news`` (the engine's handler of a rank lost or gone, or of an abort), then
        a wake-up of the fast calls sleeping on this rank's threads."""
        def handle(*args: Any) -> None:
            news(*args)
            if self.plan.fast:
                fast_slots.wake_sleepers()
        return handle

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
            await self.p2p.bells.end(min(self.timeout, BELL_GRACE) if graceful else 0)
            self.p2p.close()
        self.fast_segments.close()
        self.shm.close()
        self.fast_calls.close()
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

    def local_messages(self) -> tuple[Callable[[P2P, asyncio.AbstractEventLoop], bool],
                                      Callable[[P2P, asyncio.AbstractEventLoop], Any],
                                      Callable[..., Any], Callable[..., bool]] | None:
        """Once joined: (send, recv, send again, recv again) of messages to and from
        ranks of this node through shared memory, on the caller's thread
        (:meth:`FastP2P.send`, :meth:`FastP2P.recv`, :meth:`FastP2P.send_again`,
        :meth:`minidist.shm.takes.Takes.recv_again`); None when every message goes
        through the sockets."""
        p2p = self.p2p
        return None if p2p is None else (p2p.send, p2p.recv, p2p.send_again,
                                         p2p.recv_again)

    def lanes(self) -> tuple[dict, dict, Callable[..., None]] | None:
        """Once joined: the compiled lanes of repeated sends and receives, by peer and
        tag (:attr:`minidist.shm.routes.Remembered.lanes`), and the doorbell a send
        rings when its receiver's inbox closed meanwhile; None without them."""
        p2p = self.p2p
        if p2p is None or LANE is None:
            return None
        return p2p.routes.lanes, p2p.takes.lanes, p2p.routes.doorbell

    @property
    def incarnation(self) -> int:
        """How often this rank was restarted (0: its first process)."""
        return self.elastic.incarnation

    @property
    def nodes(self) -> list[int]:
        """The node index of every rank."""
        return self.plan.nodes

    def timeout_of(self, g: Group) -> float:
        """The deadline, in seconds, of one call on ``g``."""
        return self.timeout if g.timeout is None else g.timeout

    def gone(self, g: Group, rank: int) -> DistError | None:
        """Why global ``rank`` cannot take part in calls on ``g`` any more (it died or
        left, or was restarted since ``g`` was made), as far as this rank knows now, or
        None. Safe from any thread."""
        e = self.engine
        if rank in e.lost:
            return PeerLostError(f"rank {rank} died ({e.lost[rank]})", ranks=[rank])
        if rank in e.left:
            return PeerLostError(f"rank {rank} left the job ({e.left[rank]})", ranks=[rank],
                                 left=True)
        if rank in e.died and rank in e.stale(g):  # restarted: not the process g was made with
            return PeerLostError(f"rank {rank} died ({e.died[rank]})", ranks=[rank])
        return None

    # ------------------------------------------------------------------ point-to-point

    async def send(self, p: P2P) -> None:
        await self.engine.send_p2p(p, self.timeout_of(p.group))

    async def recv(self, p: P2P) -> bytes | None:
        """Receive into the prepared array, or return an object's bytes."""
        payload = await self.engine.recv_p2p(p, self.timeout_of(p.group))
        if p.user is not None:
            np.copyto(p.user, p.flat.reshape(p.user.shape))
        return payload

    async def probe(self, g: Group, src: int | None, tag: int,
                    timeout: float | None) -> int | None:
        """The sender of the message a receive from ``src`` (None: any rank) with ``tag``
        would take now, without receiving it; with ``timeout`` None, None if none has
        arrived, else wait for one (DistTimeoutError after ``timeout`` seconds)."""
        return await self.engine.probe(g, src, tag, timeout)

    def setup_messages(self, g: Group, tag: int):
        """(send, recv) of a shared-memory set-up's messages on ``g`` (bytes, from or to
        one rank; ``tag``: one of minidist's own)."""
        async def send(data: bytes, to: int) -> None:
            await self.send(self.plan.prepare_send(data, to, tag, g, is_object=True,
                                                   internal=True))

        async def recv(frm: int) -> bytes:
            return await self.recv(self.plan.prepare_recv(None, frm, tag, g, internal=True))

        return send, recv

    # ------------------------------------------------------------------ the store

    async def store_request(self, body: dict[str, Any], blob: bytes,
                            timeout: float) -> tuple[dict[str, Any], bytes]:
        """One key/value request (``body`` with its ``timeout``), served by the
        rendezvous, or in a world of one by this process's own store: (the reply's
        fields, the value). DistTimeoutError when a wait passes ``timeout``."""
        if self.local_store is None:
            reply = await self.client.request(body, blob, timeout + 5)
            return reply.body, reply.blob
        try:
            return await self.local_store.serve(body, blob)
        except TimeoutError:
            raise DistTimeoutError(f"store: keys not set within {timeout:g} s") from None

    # ------------------------------------------------------------------ collectives

    async def execute(self, p: Prepared) -> None:
        """Run a prepared call to the end (DistError subclasses on failure)."""
        if p.fast >= 0:  # from the loop (async_op, minidist.aio): on a thread of its own
            await self.fast_calls.on_loop(p)
            return
        out = p.bufs["out"]
        if p.call is not None and p.schedule.shared_tmp:
            await self.shm.run(p)
        elif p.call is not None:
            scratch = self.scratch
            p.bufs["tmp"] = scratch.take(out.dtype, p.schedule.tmp_size)
            try:
                await self.engine.run(p.call, p.schedule, p.bufs, p.op,
                                      self.timeout_of(p.call.group), p.sent)
            finally:
                scratch.give(p.bufs.pop("tmp", None))
        if p.finish:
            ops.finish(p.op, out, p.call.group.size if p.call else 1)
        if p.user is not None:
            np.copyto(p.user, out.reshape(p.user.shape))
