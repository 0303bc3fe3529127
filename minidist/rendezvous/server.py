"""The rendezvous server: one TCP port for the node, plus the agent's Unix socket.

It admits only connections that prove they know the job secret (a fixed-size handshake
is all it reads from a stranger), assigns and checks ranks, serves the key/value store,
forwards aborts and progress queries, and tells every rank when another one vanishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .. import wire
from ..errors import ProtocolError
from ..transport import addresses
from ..transport.acceptor import Acceptor
from .agreement import Agreements
from .client import node_identity
from .control import read_control, write_control
from .listeners import HEARTBEAT, HEARTBEAT_TIMEOUT, bind_listeners  # noqa: F401
from .store import KeyValueStore

log = logging.getLogger("minidist.rendezvous")


QUERY_TIMEOUT = 3.0
DEPARTURES_EVERY = 0.05  # seconds over which departures are gathered into one message
STALLS_KEPT = 4096  # stalled calls whose reports the server compares


class _Channel:
    """Where a client's messages go: its own stream, or its node agent's stream with the
    client's id attached."""

    def __init__(self, writer: asyncio.StreamWriter, cid: int | None = None) -> None:
        self.writer = writer
        self.cid = cid

    def send(self, body: dict[str, Any], blob: bytes = b"") -> None:
        if not self.writer.is_closing():
            write_control(self.writer, body if self.cid is None else {**body, "to": self.cid},
                          blob)

    async def drain(self) -> None:
        await self.writer.drain()

    def closing(self) -> bool:
        return self.writer.is_closing()

    def close(self) -> None:
        if self.cid is None:
            self.writer.close()


@dataclass(eq=False)
class _Agent:
    """A node agent connected to this rendezvous, relaying its node's ranks."""

    writer: asyncio.StreamWriter
    node: str = ""
    host: str = ""
    port: int = 0
    last_heard: float = 0.0
    clients: dict[int, _Client] = field(default_factory=dict)


@dataclass
class _Client:
    channel: _Channel
    rank: int = -1
    node: str = ""
    pid: int = 0
    reads: str | None = None  # what a peer must share to read its memory (peer_memory)
    registered: bool = False
    said_bye: bool = False
    queries: dict[int, asyncio.Future] = field(default_factory=dict)

    def send(self, body: dict[str, Any], blob: bytes = b"") -> None:
        self.channel.send(body, blob)


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
        self._clients: dict[int, _Client] = {}
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task] = set()
        self._welcomed = False
        self._next: list[tuple[_Client, int, dict[str, Any]]] = []
        self._query_ids = itertools.count(1)
        self._closed = False
        self._shutting_down = False
        self._agents: set[_Agent] = set()
        self._stalls: OrderedDict[tuple[int, int], dict[int, dict[str, Any]]] = OrderedDict()
        self._departing: list[int] = []
        self._departures: asyncio.TimerHandle | None = None
        self.node = node_identity()
        # ranks restarted after they died: how often (absent: never); see _readmit
        self.incarnations: dict[int, int] = {}
        self._welcome_body: dict[str, Any] | None = None
        self.agreements = Agreements(self._alive_incarnation)

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
        self._spawn(self._heartbeats())
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
        for a in list(self._agents):
            a.writer.close()
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
                c.send({"t": "error", "msg": f"rank {rank} died before every rank joined "
                        f"the job ({reason})", "lost": [rank]})
            return
        self._send_all({"t": "lost", "rank": rank, "reason": reason}, skip=rank)
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

    def _send_all(self, body: dict[str, Any], skip: int = -1, leaving: bool = True) -> None:
        """Send one message to every registered rank but ``skip`` (and, unless
        ``leaving``, but those that said goodbye); encoded once for direct connections."""
        raw = wire.encode_control(body)
        for c in list(self._clients.values()):
            if c.rank == skip or (c.said_bye and not leaving):
                continue
            if c.channel.cid is None:
                if not c.channel.closing():
                    c.channel.writer.write(raw)
            else:
                c.send(body)

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
            self._send_all({"t": "left", "ranks": ranks}, leaving=False)

    # ------------------------------------------------------------------ connections

    async def _session(self, sock: socket.socket) -> None:
        hello = await self._greet(sock, (wire.Role.PROCESS, wire.Role.AGENT, wire.Role.PEER),
                                  "rendezvous")
        if hello is None:
            return
        reader, writer = await asyncio.open_connection(sock=sock)
        if hello.role == wire.Role.AGENT:
            await self._agent_session(reader, writer, sock)
            return
        client = _Client(_Channel(writer))
        try:
            while True:
                msg = await read_control(reader)
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

    async def _agent_session(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter, sock: socket.socket) -> None:
        """Serve every rank of another node through that node's agent."""
        loop = asyncio.get_running_loop()
        agent = _Agent(writer, last_heard=loop.time())
        self._agents.add(agent)
        reason = "the connection to its node's agent closed"
        try:
            while True:
                msg = await read_control(reader)
                agent.last_heard = loop.time()
                b = msg.body
                t = msg.type
                if t == "agent_hello":
                    agent.node, agent.port = str(b["node"]), int(b["port"])
                    agent.host = b.get("host") or sock.getpeername()[0]
                elif t == "hb":
                    pass
                elif t == "gone":
                    c = agent.clients.pop(b["via"], None)
                    if c is not None:
                        self._gone(c)
                else:
                    cid = b.pop("via")
                    c = agent.clients.get(cid)
                    if c is None:
                        c = agent.clients[cid] = _Client(_Channel(writer, cid))
                    await self._handle(c, wire.Control(b, msg.blob))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            if agent.last_heard + HEARTBEAT_TIMEOUT < loop.time():
                reason = (f"its node ({agent.host}) stopped answering for "
                          f"{HEARTBEAT_TIMEOUT:g} s")
        except ProtocolError as e:
            reason = f"protocol error from its node's agent: {e}"
            log.error("rendezvous: %s", reason)
        finally:
            writer.close()
            self._agents.discard(agent)
            for c in list(agent.clients.values()):
                self._gone(c, reason)

    async def _heartbeats(self) -> None:
        """Tell each node agent we are alive; drop agents that went silent."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(HEARTBEAT)
            for a in list(self._agents):
                if a.last_heard + HEARTBEAT_TIMEOUT < loop.time():
                    a.writer.transport.abort()
                elif not a.writer.is_closing():
                    write_control(a.writer, {"t": "hb"})

    def _gone(self, client: _Client,
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

    async def _handle(self, c: _Client, msg: wire.Control) -> None:
        b = msg.body
        t = msg.type
        if t == "register":
            self._register(c, b)
            return
        if not c.registered:
            raise ProtocolError(f"message {t!r} before register")
        rid = b.get("id")
        if t in ("kv_get", "kv_wait"):  # may wait: the connection goes on meanwhile
            self._spawn(self._kv_wait(c, b))
        elif t.startswith("kv_"):
            try:
                fields, value = await self.store.serve(b, msg.blob)
            except (ValueError, KeyError, TypeError) as e:
                raise ProtocolError(f"bad key/value request {t!r}: {e}") from None
            c.send({"t": "reply", "id": rid, **fields}, value)
        elif t == "joined":
            c.send({"t": "reply", "id": rid, "value": sorted(self._clients)})
        elif t == "abort":
            fwd = {k: v for k, v in b.items() if k not in ("ranks", "id")}
            fwd["by"] = c.rank
            for r in b["ranks"]:
                peer = self._clients.get(r)
                if peer is not None and r != c.rank:
                    peer.send(fwd)
        elif t == "stalled":
            self._stalled(c, b)
        elif t == "progress":
            self._spawn(self._progress(c, b))
        elif t == "query_reply":
            fut = c.queries.pop(b["qid"], None)
            if fut is not None and not fut.done():
                fut.set_result(b.get("entered"))
        elif t == "bye":
            c.said_bye = True
        elif t == "agree":
            self.agreements.ask(c, c.rank, b)
        else:
            raise ProtocolError(f"unknown control message {t!r}")

    def _register(self, c: _Client, b: dict[str, Any]) -> None:
        def refuse(why: str) -> None:
            c.send({"t": "error", "msg": why})

        if c.registered:
            return refuse("already registered")
        if self._shutting_down:
            c.send({"t": "error", "retry": True,
                    "msg": "this rendezvous is shutting down; a new one will follow"})
            return
        if self.lost and not self._welcomed:
            rank, why = next(iter(self.lost.items()))
            c.send({"t": "error", "msg": f"rank {rank} died before every rank joined the "
                    f"job ({why})", "lost": [rank]})
            return
        ws = b.get("world_size")
        if ws != self.world_size:
            return refuse(f"world size {ws} does not match the job's {self.world_size}")
        rank = b.get("rank", -1)
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
            c.send({"t": "error", "retry": True,
                    "msg": "this rendezvous belongs to a previous init; a new one will follow"})
            return
        if self._welcomed and departed and not self.lost:
            # a rank that destroyed its group and calls init again: it joins the next
            # generation of the job, formed once every rank of this one has left
            self._next.append((c, rank, b))
            self._maybe_next_generation()
            return
        if self._welcomed and rank in self.lost and rank not in self.left:
            return self._readmit(c, rank, b)
        if rank in self._clients or rank in self.lost or rank in self.left:
            return refuse(f"rank {rank} is already taken by another process (pid "
                          f"{self._clients[rank].pid if rank in self._clients else '?'})")
        if self._welcomed:
            return refuse("the job has already started")
        self._admit(c, rank, b)

    def _admit(self, c: _Client, rank: int, b: dict[str, Any]) -> None:
        c.rank, c.node, c.pid, c.registered = rank, str(b.get("node", "")), b.get("pid", 0), True
        reads = b.get("reads")
        c.reads = reads if isinstance(reads, str) else None
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
        where = {a.node: [a.host, a.port] for a in self._agents}
        where[self.node] = [None, self.port]
        agents = [where.get(node) for node in node_index]
        body = {"t": "welcome", "world_size": self.world_size, "nodes": nodes,
                "agents": agents,
                "reads": [self._clients[r].reads for r in range(self.world_size)]}
        self._welcome_body = dict(body, node_names=[self._clients[r].node
                                                    for r in range(self.world_size)])
        raw = wire.encode_control(body)  # the same bytes for every rank: encoded once
        for c in self._clients.values():
            if c.channel.cid is None:
                if not c.channel.closing():
                    c.channel.writer.write(raw)
            else:
                c.send(body)

    def _readmit(self, c: _Client, rank: int, b: dict[str, Any]) -> None:
        """A new process for ``rank``, which died after the job started (a restart):
        admitted as the rank's next incarnation. The others hear of it first, then it
        gets its welcome, with the incarnations and the ranks gone so far."""
        body = dict(self._welcome_body or {})
        node = str(b.get("node", ""))
        if body.get("node_names", [node] * (rank + 1))[rank] != node:
            c.send({"t": "error", "msg": f"rank {rank} restarted on another node than its "
                    "first process; a restarted rank must run on the same node"})
            return
        inc = self.incarnations[rank] = self.incarnations.get(rank, 0) + 1
        del self.lost[rank]
        c.rank, c.node, c.pid, c.registered = rank, node, b.get("pid", 0), True
        reads = b.get("reads")
        c.reads = reads if isinstance(reads, str) else None
        old = self._clients.get(rank)
        if old is not None:  # its earlier process' connection has not closed yet
            old.registered = False
        self._clients[rank] = c
        log.info("rank %d is back (incarnation %d, pid %s)", rank, inc, c.pid)
        self._send_all({"t": "back", "rank": rank, "incarnation": inc}, skip=rank)
        body.pop("node_names", None)
        body["reads"] = list(body.get("reads") or [None] * self.world_size)
        body["reads"][rank] = c.reads
        body.update(incarnations=[self.incarnations.get(r, 0) for r in range(self.world_size)],
                    lost={str(r): why for r, why in self.lost.items()},
                    left=sorted(self.left))
        c.send(body)

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
        for c, rank, b in waiting:
            if not c.channel.closing():
                self._admit(c, rank, b)

    def _stalled(self, c: _Client, b: dict[str, Any]) -> None:
        """A rank has waited a while in call ``seq`` of a group: if another rank waits in
        the same call having called something else, the call can never complete; abort it
        on every rank of the group."""
        key = (b["group"], b["seq"])
        reports = self._stalls.get(key)
        if reports is None:
            reports = self._stalls[key] = {}
            while len(self._stalls) > STALLS_KEPT:
                self._stalls.popitem(last=False)
        other = next((r for r, o in reports.items() if o["sig"] != b["sig"]), None)
        reports[c.rank] = b
        if other is None:
            return
        reason = (f"collective mismatch on {b['where']} (call #{b['seq']}): rank {other} "
                  f"called {reports[other]['call']} where rank {c.rank} called {b['call']} "
                  f"(found while both waited)")
        fwd = {"t": "abort", "group": b["group"], "seq": b["seq"], "reason": reason,
               "kind": "mismatch", "by": -1}
        for r in b["ranks"]:
            peer = self._clients.get(r)
            if peer is not None:
                peer.send(fwd)

    async def _kv_wait(self, c: _Client, b: dict[str, Any]) -> None:
        try:
            fields, value = await self.store.serve(b, b"")
        except TimeoutError:
            keys = b["keys"] if b["t"] == "kv_wait" else [b["key"]]
            missing = [k for k in keys if not self.store.check([k])]
            c.send({"t": "reply", "id": b["id"], "timeout": True,
                    "error": f"store keys not set within {b.get('timeout', 300.0):g} s: {missing}"})
            return
        c.send({"t": "reply", "id": b["id"], **fields}, value)
        with contextlib.suppress(ConnectionError):
            await c.channel.drain()

    async def _progress(self, c: _Client, b: dict[str, Any]) -> None:
        """Ask each named rank how many collectives it has entered on a group."""
        futs: dict[int, asyncio.Future] = {}
        loop = asyncio.get_running_loop()
        for r in b["ranks"]:
            peer = self._clients.get(r)
            if peer is None:
                continue
            qid = next(self._query_ids)
            fut = loop.create_future()
            peer.queries[qid] = fut
            futs[r] = fut
            peer.send({"t": "query", "qid": qid, "group": b["group"]})
        if futs:
            await asyncio.wait(futs.values(), timeout=QUERY_TIMEOUT)
        entered = {str(r): f.result() for r, f in futs.items() if f.done()}
        c.send({"t": "reply", "id": b["id"], "entered": entered,
                "lost": sorted(set(b["ranks"]) & set(self.lost))})
        with contextlib.suppress(ConnectionError):
            await c.channel.drain()
