"""The rendezvous server: one TCP port for the node, plus the agent's Unix socket.

It admits only connections that prove they know the job secret (a fixed-size handshake
is all it reads from a stranger), assigns and checks ranks, serves the key/value store,
forwards aborts and progress queries, and tells every rank when another one vanishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from .. import messages, wire
from ..errors import ProtocolError
from ..transport import addresses
from ..transport.acceptor import Acceptor
from .agents import AgentLinks
from .agreement import Agreements
from .channels import Channel, Client
from .client import node_identity
from .control import ControlReader
from .listeners import HEARTBEAT, HEARTBEAT_TIMEOUT, bind_listeners  # noqa: F401
from .progress import ProgressQueries
from .stalls import Stalls
from .store import KeyValueStore

log = logging.getLogger("minidist.rendezvous")


DEPARTURES_EVERY = 0.05  # seconds over which departures are gathered into one message
Handler = Callable[[Client, Any], Awaitable[None] | None]


class RendezvousServer(Acceptor):
    """Serves one job. ``port`` 0 picks a free port; ``unix`` also listens on the agent's
    Unix address for processes of this node. With ``generations`` (a launcher that
    outlives its ranks), ranks that destroyed and init again form a new generation of
    the job once every rank of the previous one has left."""

    def __init__(self, secret: bytes, world_size: int, host: str = "0.0.0.0",
                 port: int = 0, unix: bool = True, generations: bool = False) -> None:
        if world_size < 1:
            raise ValueError("world_size must be at least 1")
        self.secret = secret
        self.job = addresses.job_key(secret)
        self.world_size = world_size
        self.host = host
        self.port = port
        self.unix = unix
        self.generations = generations
        self.store = KeyValueStore()
        self.lost: dict[int, str] = {}
        self.left: set[int] = set()
        self._clients: dict[int, Client] = {}
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task] = set()
        self._welcomed = False
        self._next: list[tuple[Client, int, messages.Register]] = []
        self._closed = False
        self._shutting_down = False
        self._agents = AgentLinks(self._handle, self._gone)
        self._stalls = Stalls()
        self._progress = ProgressQueries(self._clients.get, lambda: self.lost)
        self._departing: list[int] = []
        self._departures: asyncio.TimerHandle | None = None
        self.node = node_identity()
        # ranks restarted after they died: how often (absent: never); see _readmit
        self.incarnations: dict[int, int] = {}
        self._welcome_msg: messages.Welcome | None = None
        self._node_names: list[str] = []  # each rank's node, as the welcome found them
        self.agreements = Agreements(self._alive_incarnation)
        # what each message from a rank does (a handler may return an awaitable: the
        # connection reads on once it is done)
        self._handlers: dict[type[messages.Message], Handler] = {
            messages.Register: self._register, messages.Joined: self._joined,
            messages.Bye: self._bye, messages.Abort: self._abort,
            messages.Stalled: self._stalled, messages.Progress: self._progress_later,
            messages.QueryReply: ProgressQueries.answered, messages.Agree: self._agree,
            # a get or a wait may wait: the connection goes on meanwhile
            messages.KvGet: self._kv_later, messages.KvWait: self._kv_later,
            **{t: self._kv_now for t in messages.KV_REQUESTS
               if t not in (messages.KvGet, messages.KvWait)}}

    # ------------------------------------------------------------------ lifecycle

    async def start(self, listeners: list[socket.socket] | None = None) -> int:
        """Listen (on ``listeners`` from :func:`bind_listeners` if given); return the TCP
        port. OSError that names the port if it is taken."""
        if listeners is None:
            listeners = bind_listeners(self.host, self.port, self.job if self.unix else None)
        for s in listeners:
            s.setblocking(False)
            if s.family != socket.AF_UNIX:
                self.port = s.getsockname()[1]
        self._listeners = list(listeners)
        for s in self._listeners:
            self._spawn(self._accept_loop(s))
        self._spawn(self._agents.heartbeats())
        return self.port

    async def close(self) -> None:
        if self._closed and not self._tasks:
            return
        self._closed = True
        if self._departures is not None:
            self._departures.cancel()
        for s in self._listeners:
            s.close()
        if self.unix and not addresses.ABSTRACT:
            with contextlib.suppress(OSError):
                os.unlink(addresses.agent_address(self.job))
        for c in list(self._clients.values()):
            c.channel.close()
        self._agents.close()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_all_left(self, timeout: float) -> None:
        """Return once every registered rank has left or been lost, or after ``timeout``."""
        self._shutting_down = True
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self._clients and loop.time() < end:
            await asyncio.sleep(0.02)

    def declare_lost(self, rank: int, reason: str) -> None:
        """Tell every rank that ``rank`` died (also used by a launcher that saw it exit).
        Before every rank has joined, the ranks waiting to join are refused instead: the
        job cannot start without it."""
        if rank in self.lost or rank in self.left:
            return
        self.lost[rank] = reason
        log.info("rank %d died: %s", rank, reason)
        if not self._welcomed:
            for c in list(self._clients.values()):
                c.send(messages.Error(msg=f"rank {rank} died before every rank joined "
                                      f"the job ({reason})", lost=[rank]))
            return
        self._send_all(messages.Lost(rank=rank, reason=reason), skip=rank)
        self.agreements.gone(rank)

    def _alive_incarnation(self, rank: int) -> int | None:
        """The incarnation of ``rank`` that is alive now, or None."""
        if rank in self.lost or rank in self.left or rank not in self._clients:
            return None
        return self.incarnations.get(rank, 0)

    def rank_exited(self, rank: int, code: int) -> None:
        """A launcher saw the process of ``rank`` exit with ``code``."""
        if code != 0:
            self.declare_lost(rank, f"its process exited with code {code}")
        elif not self._welcomed and rank not in self._clients and rank not in self.left:
            self.declare_lost(rank, "its process exited before it called init()")

    def _send_all(self, msg: messages.Message, skip: int = -1, leaving: bool = True) -> None:
        """Send one message to every registered rank but ``skip`` (and, unless
        ``leaving``, but those that said goodbye); encoded once for direct connections."""
        raw = msg.encode()
        for c in list(self._clients.values()):
            if c.rank != skip and (leaving or not c.said_bye):
                c.channel.send_raw(raw, msg)

    def _departed(self, rank: int) -> None:
        """``rank`` left normally: tell the ranks still at work, a batch at a time (at the
        end of a job every rank leaves at once)."""
        self.left.add(rank)
        log.debug("rank %d left", rank)
        self._departing.append(rank)
        self.agreements.gone(rank)
        if self._departures is None and not self._closed:
            self._departures = asyncio.get_running_loop().call_later(
                DEPARTURES_EVERY, self._flush_departures)

    def _flush_departures(self) -> None:
        ranks, self._departing, self._departures = self._departing, [], None
        if ranks:
            self._send_all(messages.Left(ranks=ranks), leaving=False)

    # ------------------------------------------------------------------ connections

    async def _session(self, sock: socket.socket) -> None:
        hello = await self._greet(sock, (wire.Role.PROCESS, wire.Role.AGENT, wire.Role.PEER),
                                  "rendezvous")
        if hello is None:
            return
        reader, writer = await asyncio.open_connection(sock=sock)
        if hello.role == wire.Role.AGENT:
            await self._agents.serve(reader, writer, sock)
            return
        client = Client(Channel(writer))
        stream = ControlReader(reader)
        try:
            while True:
                msg = await stream.read()
                await self._handle(client, msg)
                if not writer.is_closing():
                    try:
                        await writer.drain()
                    except (ConnectionError, OSError):
                        pass  # the rank's end is closed: read on to what it sent before
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except ProtocolError as e:
            log.error("rendezvous: protocol error from rank %d: %s", client.rank, e)
        finally:
            writer.close()
            self._gone(client)

    def _gone(self, client: Client,
              reason: str = "its process exited or closed its connection") -> None:
        for fut in client.queries.values():
            if not fut.done():
                fut.set_result(None)
        if not client.registered or self._clients.get(client.rank) is not client:
            return
        del self._clients[client.rank]
        if client.said_bye:
            self._departed(client.rank)
            self._maybe_next_generation()
        elif not self._closed:
            self.declare_lost(client.rank, reason)

    # ------------------------------------------------------------------ messages

    async def _handle(self, c: Client, control: wire.Control) -> None:
        """Act on one message of a rank, by :attr:`_handlers`; ProtocolError for one no
        rank sends, one that lacks a field, or one before the rank registered."""
        msg = messages.decode(control)
        handler = self._handlers.get(type(msg))
        if handler is None:
            raise ProtocolError(f"unknown control message {msg.type!r}")
        if not c.registered and not isinstance(msg, messages.Register):
            raise ProtocolError(f"message {msg.type!r} before register")
        pending = handler(c, msg)
        if pending is not None:
            await pending

    async def _kv_now(self, c: Client, m: messages.Message) -> None:
        try:
            reply = await self.store.answer(m)
        except (ValueError, KeyError, TypeError) as e:
            raise ProtocolError(f"bad key/value request {m.type!r}: {e}") from None
        c.send(reply)

    def _kv_later(self, c: Client, m: messages.Message) -> None:
        self._spawn(self._kv_wait(c, m))

    async def _kv_wait(self, c: Client, m: messages.Message) -> None:
        c.send(await self.store.reply(m))
        with contextlib.suppress(ConnectionError):
            await c.channel.drain()

    def _joined(self, c: Client, m: messages.Joined) -> None:
        c.send(messages.Reply(id=m.id, value=sorted(self._clients)))

    def _bye(self, c: Client, m: messages.Bye) -> None:
        c.said_bye = True

    def _abort(self, c: Client, m: messages.Abort) -> None:
        """Forward a rank's abort to the other ranks it names."""
        fwd = replace(m, ranks=None, by=c.rank)
        for r in m.ranks or ():
            peer = self._clients.get(r)
            if peer is not None and r != c.rank:
                peer.send(fwd)

    def _stalled(self, c: Client, m: messages.Stalled) -> None:
        """A rank has waited a while in a call: if another rank waits in the same call
        having called something else, abort it on every rank of the group."""
        abort = self._stalls.report(c.rank, m)
        if abort is None:
            return
        for r in m.ranks:
            peer = self._clients.get(r)
            if peer is not None:
                peer.send(abort)

    def _agree(self, c: Client, m: messages.Agree) -> None:
        self.agreements.ask(c, c.rank, m)

    def _register(self, c: Client, m: messages.Register) -> None:
        def refuse(why: str, retry: bool | None = None) -> None:
            c.send(messages.Error(msg=why, retry=retry))

        if c.registered:
            return refuse("already registered")
        if self._shutting_down:
            return refuse("this rendezvous is shutting down; a new one will follow", True)
        if self.lost and not self._welcomed:
            rank, why = next(iter(self.lost.items()))
            c.send(messages.Error(msg=f"rank {rank} died before every rank joined the "
                                  f"job ({why})", lost=[rank]))
            return
        ws = m.world_size
        if ws != self.world_size:
            return refuse(f"world size {ws} does not match the job's {self.world_size}")
        rank = m.rank
        if rank == -1:
            taken = set(self._clients) | set(self.lost) | self.left
            rank = next((r for r in range(self.world_size) if r not in taken), -1)
            if rank == -1:
                return refuse("the job already has all its ranks")
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            return refuse(f"rank {rank} is outside 0..{self.world_size - 1}")
        old = self._clients.get(rank)
        departed = rank in self.left or (old is not None and old.said_bye)
        if self._welcomed and departed and not self.generations:
            return refuse("this rendezvous belongs to a previous init; a new one will "
                          "follow", True)
        if self._welcomed and departed and not self.lost:
            # a rank that destroyed its group and calls init again: it joins the next
            # generation of the job, formed once every rank of this one has left
            self._next.append((c, rank, m))
            self._maybe_next_generation()
            return
        if self._welcomed and rank in self.lost and rank not in self.left:
            return self._readmit(c, rank, m)
        if rank in self._clients or rank in self.lost or rank in self.left:
            return refuse(f"rank {rank} is already taken by another process (pid "
                          f"{self._clients[rank].pid if rank in self._clients else '?'})")
        if self._welcomed:
            return refuse("the job has already started")
        self._admit(c, rank, m)

    def _admit(self, c: Client, rank: int, m: messages.Register) -> None:
        c.rank, c.node, c.pid, c.registered = rank, str(m.node), m.pid, True
        c.reads = m.reads if isinstance(m.reads, str) else None
        self._clients[rank] = c
        if len(self._clients) == self.world_size:
            self._welcome()

    def _welcome(self) -> None:
        self._welcomed = True
        log.info("all %d ranks joined; the job starts", self.world_size)
        node_index: dict[str, int] = {}
        nodes = []
        for r in range(self.world_size):
            nodes.append(node_index.setdefault(self._clients[r].node, len(node_index)))
        # how ranks of other nodes reach each node: its agent's TCP port (host None: the
        # rendezvous' own node, reached at the address the ranks already know)
        where = self._agents.where()
        where[self.node] = [None, self.port]
        msg = messages.Welcome(
            world_size=self.world_size, nodes=nodes,
            agents=[where.get(node) for node in node_index],
            reads=[self._clients[r].reads for r in range(self.world_size)])
        self._welcome_msg = msg
        self._node_names = [self._clients[r].node for r in range(self.world_size)]
        raw = msg.encode()  # the same bytes for every rank: encoded once
        for c in self._clients.values():
            c.channel.send_raw(raw, msg)

    def _readmit(self, c: Client, rank: int, m: messages.Register) -> None:
        """A new process for ``rank``, which died after the job started (a restart):
        admitted as the rank's next incarnation. The others hear of it first, then it
        gets its welcome, with the incarnations and the ranks gone so far."""
        node = str(m.node)
        if self._welcome_msg is None or self._node_names[rank] != node:
            c.send(messages.Error(msg=f"rank {rank} restarted on another node than its "
                                  "first process; a restarted rank must run on the same "
                                  "node"))
            return
        inc = self.incarnations[rank] = self.incarnations.get(rank, 0) + 1
        del self.lost[rank]
        c.rank, c.node, c.pid, c.registered = rank, node, m.pid, True
        c.reads = m.reads if isinstance(m.reads, str) else None
        old = self._clients.get(rank)
        if old is not None:  # its earlier process' connection has not closed yet
            old.registered = False
        self._clients[rank] = c
        log.info("rank %d is back (incarnation %d, pid %s)", rank, inc, c.pid)
        self._send_all(messages.Back(rank=rank, incarnation=inc), skip=rank)
        reads = list(self._welcome_msg.reads or [None] * self.world_size)
        reads[rank] = c.reads
        c.send(replace(
            self._welcome_msg, reads=reads,
            incarnations=[self.incarnations.get(r, 0) for r in range(self.world_size)],
            lost={str(r): why for r, why in self.lost.items()}, left=sorted(self.left)))

    def _maybe_next_generation(self) -> None:
        if not self._next or self._clients:
            return
        waiting, self._next = self._next, []
        if self._departures is not None:  # news of the old generation: nobody to tell
            self._departures.cancel()
            self._departures = None
        self._departing.clear()
        self._welcomed = False
        self.left.clear()
        for c, rank, m in waiting:
            if not c.channel.closing():
                self._admit(c, rank, m)

    def _progress_later(self, c: Client, m: messages.Progress) -> None:
        self._spawn(self._progress.answer(c, m))
